"""Canonical JSON, SHA-256 and the strict column primitives (A22)."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from pybatch import errors
from pybatch._codecs._primitives import (
    DecodeError,
    decode_aware,
    decode_digest,
    decode_enum,
    decode_int64,
    decode_json_object,
    decode_text,
    optional_aware_at,
    optional_int64_at,
)
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.status import BatchStatus, FailureCategory

EMPTY_FAULT_STATE = b'{"checkpoint":"' + b"0" * 64 + b'","entries":[]}'


def reference(value: object) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def random_document(rng: random.Random, depth: int = 0) -> object:
    alphabet = [
        "a",
        "Z",
        '"',
        "\\",
        "/",
        "\n",
        "\t",
        "\x1f",  # NUL is refused (PostgreSQL cannot store it): tests/properties
        "\x7f",
        "é",
        "서",
        "\u2028",
        "😀",
        " ",
        "\b",
        "\f",
        "\r",
    ]
    choice = rng.randrange(8 if depth < 4 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.randint(-(2**70), 2**70)
    if choice in (3, 4):
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
    if choice == 5:
        return [random_document(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 4))): random_document(
            rng, depth + 1
        )
        for _ in range(rng.randrange(4))
    }


def test_canonical_json_equals_the_reference_form_without_floats() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        document = random_document(rng)
        assert canonical_json(document) == reference(document)


def test_canonical_json_details() -> None:
    assert canonical_json({"b": 1, "a": [True, None, "x/y"]}) == b'{"a":[true,null,"x/y"],"b":1}'
    assert canonical_json("\x01é") == '"\\u0001é"'.encode()
    assert canonical_json({"é": 1, "z": 2, "Z": 3}) == '{"Z":3,"z":2,"é":1}'.encode()
    assert canonical_json(("a", 1)) == b'["a",1]'
    assert canonical_json(2**64) == b"18446744073709551616"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "NaN or infinity"),
        (float("inf"), "NaN or infinity"),
        ({"x": [float("-inf")]}, "NaN or infinity"),
        ({1: "x"}, "object key is not a string"),
        ({"x": {1}}, "value is not JSON"),
        ({"x": b"bytes"}, "value is not JSON"),
        ("\ud800", "text is not UTF-8 encodable"),
    ],
)
def test_values_canonical_json_cannot_encode_are_refused_with_the_reason(
    value: object, reason: str
) -> None:
    """Scenario A22."""
    with pytest.raises(errors.JsonNotEncodable) as error:
        canonical_json(value)
    assert error.value.reason == reason


def test_canonical_json_refuses_cycles_and_absurd_integers() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(errors.JsonNotEncodable):
        canonical_json(cycle)
    with pytest.raises(errors.JsonNotEncodable):
        canonical_json(10**5000)


def test_the_empty_fault_state_digest_survives_jsonb_reordering() -> None:
    """Scenario A22."""
    assert len(EMPTY_FAULT_STATE) == 94
    assert sha256(EMPTY_FAULT_STATE).hex() == (
        "a491114819e0d3bd8b7ca004dc0636f95b45e2fcb1a67ddb5726beaea12f9922"
    )
    # jsonb prints shorter keys first and adds spaces; re-canonicalising restores the bytes.
    from_jsonb = json.loads('{"entries": [], "checkpoint": "' + "0" * 64 + '"}')
    assert canonical_json(from_jsonb) == EMPTY_FAULT_STATE
    assert canonical_json(json.loads('{"b": 1, "aa": 2, "a": 3}')) == b'{"a":3,"aa":2,"b":1}'
    assert sha256(b"abc") == hashlib.sha256(b"abc").digest()


def test_decode_enum_refuses_unknown_codes() -> None:
    assert decode_enum(BatchStatus, "STARTED", column="status") is BatchStatus.STARTED
    for bad in ["started", "BOGUS", "", " STARTED", None, 1, BatchStatus.STARTED]:
        with pytest.raises(DecodeError) as error:
            decode_enum(BatchStatus, bad, column="status")
        assert error.value.column == "status"
    with pytest.raises(DecodeError):
        decode_enum(FailureCategory, "user_component", column="failure_category")


def test_decode_error_names_the_column_never_the_value() -> None:
    with pytest.raises(DecodeError) as error:
        decode_enum(BatchStatus, "SECRET_VALUE", column="status")
    assert "status" in str(error.value)
    assert "SECRET_VALUE" not in str(error.value)
    assert not isinstance(error.value, errors.PyBatchError)
    assert pickle.loads(pickle.dumps(error.value)).column == "status"


def test_decode_int64() -> None:
    assert decode_int64(0, column="version", minimum=0) == 0
    assert decode_int64(2**63 - 1, column="version", minimum=0) == 2**63 - 1
    for bad in [-1, 2**63, True, 1.0, "1", None]:
        with pytest.raises(DecodeError):
            decode_int64(bad, column="version", minimum=0)
    with pytest.raises(DecodeError):
        decode_int64(0, column="id", minimum=1)
    assert optional_int64_at({"failure_id": None}, "failure_id") is None
    with pytest.raises(DecodeError):
        optional_int64_at({"failure_id": 0}, "failure_id")


def test_decode_aware_and_text() -> None:
    plus_one = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    decoded = decode_aware(plus_one, column="created_at")
    assert decoded == plus_one and decoded.tzinfo is UTC
    for bad in [datetime(2026, 1, 1), "2026-01-01T00:00:00Z", None]:
        with pytest.raises(DecodeError):
            decode_aware(bad, column="created_at")
    assert optional_aware_at({"ended_at": None}, "ended_at") is None
    assert decode_text("x", column="job_name") == "x"
    with pytest.raises(DecodeError):
        decode_text(None, column="job_name")


def test_decode_digest_and_json_object() -> None:
    assert decode_digest(b"\x01" * 32, column="instance_key") == b"\x01" * 32
    assert decode_digest(memoryview(b"\x02" * 32), column="instance_key") == b"\x02" * 32
    assert decode_digest(b"\x03" * 16, column="owner_token", length=16) == b"\x03" * 16
    for bad in [b"\x01" * 31, b"\x01" * 33, "00" * 32, None]:
        with pytest.raises(DecodeError):
            decode_digest(bad, column="instance_key")
    assert decode_json_object({"a": 1}, column="payload") == {"a": 1}
    bad_docs: list[object] = [[], "{}", None, {1: 2}]
    for bad_doc in bad_docs:
        with pytest.raises(DecodeError):
            decode_json_object(bad_doc, column="payload")
