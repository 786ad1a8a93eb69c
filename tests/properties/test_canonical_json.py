"""Canonical JSON: one byte form per document, typed refusals, nothing else."""

from __future__ import annotations

import decimal
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pybatch.errors import JsonNotEncodable
from pybatch.values._canonical import MAX_NUMBER_DIGITS, canonical_json
from tests.properties.strategies import anything, json_documents, json_objects, storable_text


def _without_floats(value: Any) -> bool:
    if isinstance(value, float):
        return False
    if isinstance(value, dict):
        return all(_without_floats(v) for v in value.values())
    if isinstance(value, list):
        return all(_without_floats(v) for v in value)
    return True


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same document with every object's keys inserted in another order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


@given(json_documents)
def test_canonical_json_is_a_fixed_point_of_parse_and_encode(document: Any) -> None:
    encoded = canonical_json(document)
    assert canonical_json(json.loads(encoded)) == encoded


@given(json_documents.filter(_without_floats))
def test_without_floats_it_equals_pythons_sorted_compact_json(document: Any) -> None:
    expected = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
    assert canonical_json(document) == expected


@given(json_objects, st.randoms(use_true_random=False))
def test_key_order_never_changes_the_bytes(document: dict[str, Any], rng: random.Random) -> None:
    assert canonical_json(_shuffled(document, rng)) == canonical_json(document)


@given(st.dictionaries(storable_text, st.integers(), min_size=2, max_size=8))
def test_keys_are_sorted_by_code_point(document: dict[str, int]) -> None:
    parsed = json.loads(canonical_json(document), object_pairs_hook=list)
    assert [key for key, _ in parsed] == sorted(document)


@given(storable_text, st.text(st.characters(), min_size=0, max_size=5))
def test_text_with_a_nul_is_refused_as_a_value_and_as_a_key(prefix: str, suffix: str) -> None:
    bad = prefix + "\x00" + suffix
    for document in ({"k": bad}, {bad: 1}, [bad]):
        with pytest.raises(JsonNotEncodable):
            canonical_json(document)


@given(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), storable_text)
def test_lone_surrogates_are_refused(surrogate: str, text: str) -> None:
    with pytest.raises(JsonNotEncodable):
        canonical_json({"k": text + surrogate})


@given(st.sampled_from([float("nan"), float("inf"), -float("inf"), decimal.Decimal("NaN")]))
def test_nan_and_infinity_are_refused(value: Any) -> None:
    with pytest.raises(JsonNotEncodable):
        canonical_json({"n": value})


@given(st.integers(min_value=MAX_NUMBER_DIGITS - 2, max_value=MAX_NUMBER_DIGITS + 50))
def test_numbers_are_bounded_by_their_digit_count(digits: int) -> None:
    for number in (10 ** (digits - 1), -(10 ** (digits - 1)), decimal.Decimal("9" * digits)):
        if digits <= MAX_NUMBER_DIGITS:
            encoded = canonical_json({"n": number})
            assert canonical_json(json.loads(encoded)) == encoded
        else:
            with pytest.raises(JsonNotEncodable):
                canonical_json({"n": number})


@given(st.integers(min_value=1, max_value=100_000))
def test_any_depth_is_encoded_or_refused_never_a_recursion_error(depth: int) -> None:
    document: Any = 1
    for _ in range(depth):
        document = [document]
    try:
        encoded = canonical_json(document)
    except JsonNotEncodable:
        return
    assert encoded == b"[" * depth + b"1" + b"]" * depth


@given(anything)
def test_nothing_but_bytes_or_json_not_encodable_comes_out(value: Any) -> None:
    try:
        result = canonical_json(value)
    except JsonNotEncodable:
        return
    assert isinstance(result, bytes)
    json.loads(result)


@given(
    st.dictionaries(
        st.text(),
        st.none() | st.booleans() | st.integers() | st.text() | st.integers(2**70, 2**80),
        max_size=6,
    )
)
def test_a_flat_object_encodes_as_the_general_writer_does(document: dict[str, Any]) -> None:
    """The C encoder's fast path for flat objects (a checkpoint) writes what _write writes."""
    try:
        general = canonical_json([document])[1:-1]  # inside a list: always _write
    except JsonNotEncodable:  # a NUL
        with pytest.raises(JsonNotEncodable):
            canonical_json(document)
        return
    assert canonical_json(document) == general
