"""Checkpoint and ExecutionContext envelopes and their jsonb-stable digests.

Floats are accepted in payloads. The property tests pin the normalisation that makes
`generation_digest()` equal before a write and after a jsonb read back: a float is written the
way PostgreSQL `numeric` prints it. The expected texts below were checked against PostgreSQL
15 (`SELECT '[...]'::jsonb`); the properties need no database.
"""

from __future__ import annotations

import decimal
import json
import math
import random
import re
import struct

import pytest

from pybatch import errors
from pybatch.values._canonical import canonical_json
from pybatch.values.names import StateSchemaId
from pybatch.values.state import (
    EMPTY_STATE_SCHEMA,
    Checkpoint,
    ExecutionContext,
    StateLimits,
)

SCHEMA = StateSchemaId("etl.reader.v1")

# Python float -> the text jsonb prints for it (PostgreSQL numeric output).
JSONB_TEXT = {
    1e16: "10000000000000000",
    1e-7: "0.0000001",
    -0.0: "0.0",
    2.5: "2.5",
    1.0: "1.0",
    100.0: "100.0",
    0.1: "0.1",
    1e22: "10000000000000000000000",
    -1.5e-7: "-0.00000015",
    1e15: "1000000000000000.0",
    123456789.123: "123456789.123",
    1.5e300: "15" + "0" * 299,
    5e-324: "0." + "0" * 323 + "5",
}


def test_empty_default_state() -> None:
    checkpoint = Checkpoint.empty()
    assert checkpoint.schema == EMPTY_STATE_SCHEMA == StateSchemaId("oxide_batch.empty.v1")
    assert (checkpoint.schema_version, checkpoint.payload) == (1, {})
    assert checkpoint.encode() == (
        b'{"format":"oxide-batch.checkpoint","format_version":1,"payload":{},'
        b'"schema":"oxide_batch.empty.v1","schema_version":1}'
    )
    assert (
        ExecutionContext.empty().encode().startswith(b'{"format":"oxide-batch.execution-context",')
    )
    empty: object = Checkpoint.empty()  # an envelope equals only one of its own type
    assert empty != ExecutionContext.empty()


def test_generation_digest_is_sha256_of_the_canonical_envelope() -> None:
    import hashlib

    checkpoint = Checkpoint(SCHEMA, 3, {"offset": 42, "file": "a.csv"})
    expected = canonical_json(
        {
            "format": "oxide-batch.checkpoint",
            "format_version": 1,
            "payload": {"file": "a.csv", "offset": 42},
            "schema": "etl.reader.v1",
            "schema_version": 3,
        }
    )
    assert checkpoint.encode() == expected
    assert checkpoint.generation_digest() == hashlib.sha256(expected).digest()


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"offset": 42, "file": "a.csv"},
        {"é": ["\u2028", None, True, 1e16, 1.1], "a": {"b": {"c": [[]]}}},
        {'quote"': "back\\slash", "nl": "line\nbreak", "ctl": "\x01"},
    ],
)
def test_envelope_is_the_canonical_json_of_the_whole_envelope(payload: dict[str, object]) -> None:
    """The payload is encoded once and the envelope written around it: same bytes as encoding
    the whole envelope, for both kinds, any schema id and version."""
    for kind, name in ((Checkpoint, "oxide-batch.checkpoint"), (ExecutionContext, None)):
        state = kind(SCHEMA, 4_294_967_295, payload)
        expected = canonical_json(
            {
                "format": name or "oxide-batch.execution-context",
                "format_version": 1,
                "payload": payload,
                "schema": SCHEMA.value,
                "schema_version": 4_294_967_295,
            }
        )
        assert state.encode() == expected
        assert state.payload_json() == canonical_json(payload)


@pytest.mark.parametrize(("value", "text"), list(JSONB_TEXT.items()))
def test_floats_are_written_as_numeric_prints_them(value: float, text: str) -> None:
    assert canonical_json(value).decode() == text
    assert canonical_json({"x": value}) == b'{"x":' + text.encode() + b"}"


def _jsonb_round_trip(payload: object) -> object:
    """What psycopg's default jsonb loader returns for the text PostgreSQL prints."""
    return json.loads(canonical_json(payload))


def _awkward_floats() -> list[float]:
    rng = random.Random(20261130)
    values = [
        *JSONB_TEXT,
        0.0,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        2.2250738585072014e-308,
        9007199254740993.0,
        1.2345678901234568e17,
        1e21,
        1e-300,
        math.pi,
        -2.5e-10,
    ]
    while len(values) < 2000:
        candidate = struct.unpack(">d", struct.pack(">Q", rng.getrandbits(64)))[0]
        if math.isfinite(candidate):
            values.append(candidate)
    values += [rng.uniform(-1e6, 1e6) for _ in range(500)]
    return values


PLAIN_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


def test_property_float_text_is_plain_exact_and_round_trip_stable() -> None:
    for value in _awkward_floats():
        text = canonical_json(value).decode()
        assert PLAIN_NUMBER.fullmatch(text), (value, text[:40])  # no exponent, no -0
        assert text != "-0.0"
        # exact: the decimal value of the text is the float's shortest repr
        assert decimal.Decimal(text) == decimal.Decimal(repr(value))
        # reading the text back gives the same number, and re-canonicalises to the same text
        back = json.loads(text)
        assert float(back) == value  # an int when the text has no point (1e16), same double
        assert canonical_json(back).decode() == text


def test_property_generation_digest_survives_a_jsonb_round_trip() -> None:
    values = _awkward_floats()
    for start in range(0, len(values), 250):
        payload = {"chunk": values[start : start + 250], "b": {"nested": values[start]}}
        before = Checkpoint(SCHEMA, 1, payload, limits=StateLimits.STEP)
        after = Checkpoint(SCHEMA, 1, _jsonb_round_trip(payload), limits=StateLimits.STEP)  # type: ignore[arg-type]
        assert after.generation_digest() == before.generation_digest()
        assert after == before
    # A Decimal is refused, not kept: `payload` would read it back as a float.
    payload = {"v": [2.5, 1e-7, 1e16]}
    decimal_back = json.loads(canonical_json(payload), parse_float=decimal.Decimal)
    with pytest.raises(errors.StateMalformed) as refused:
        Checkpoint(SCHEMA, 1, decimal_back)
    assert (refused.value.path, refused.value.value_type) == ("$.v[0]", "Decimal")


def test_payload_is_kept_in_its_round_trip_form() -> None:
    checkpoint = Checkpoint(SCHEMA, 1, {"big": 1e16, "neg_zero": -0.0, "small": 1e-7})
    assert checkpoint.payload == {"big": 10_000_000_000_000_000, "neg_zero": 0.0, "small": 1e-7}
    assert isinstance(checkpoint.payload["big"], int)
    copy = checkpoint.payload
    copy["big"] = 0
    assert checkpoint.payload["big"] == 10_000_000_000_000_000  # no aliasing


def test_state_refusals() -> None:
    with pytest.raises(errors.StateMalformed):
        Checkpoint(SCHEMA, 1, {"x": math.nan})
    with pytest.raises(errors.StateMalformed):
        Checkpoint(SCHEMA, 1, {"x": math.inf})
    with pytest.raises(errors.StateMalformed):
        Checkpoint(SCHEMA, 1, {"x": {1, 2}})
    with pytest.raises(errors.StatePayloadNotObject):
        Checkpoint(SCHEMA, 1, [1])  # type: ignore[arg-type]
    with pytest.raises(errors.ZeroSchemaVersion):
        Checkpoint(SCHEMA, 0, {})
    with pytest.raises(errors.ZeroSchemaVersion):
        Checkpoint(SCHEMA, True, {})
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    with pytest.raises(errors.StateTooDeep):
        Checkpoint(SCHEMA, 1, cyclic)


def test_limits_bytes_and_depth() -> None:
    assert StateLimits() == StateLimits(65_536, 16)
    assert StateLimits.STEP == StateLimits(1_048_576, 64)
    assert StateLimits.PARTITION == StateLimits(4096, 16)
    empty_size = Checkpoint.empty().encoded_bytes
    with pytest.raises(errors.StateTooLarge) as large:
        Checkpoint(EMPTY_STATE_SCHEMA, 1, {}, limits=StateLimits(max_bytes=empty_size - 1))
    assert (large.value.kind, large.value.max_bytes) == ("checkpoint", empty_size - 1)
    at_limit = Checkpoint(EMPTY_STATE_SCHEMA, 1, {}, limits=StateLimits(max_bytes=empty_size))
    assert (at_limit.encoded_bytes, at_limit.payload) == (empty_size, {})
    assert at_limit == Checkpoint.empty()
    # depth counts the envelope root and scalars: {"payload": {"a": {"b": 1}}} is 4 deep
    four_deep = Checkpoint(SCHEMA, 1, {"a": {"b": 1}}, limits=StateLimits(max_depth=4))
    assert four_deep.payload == {"a": {"b": 1}}
    three_deep = Checkpoint(SCHEMA, 1, {"a": {}}, limits=StateLimits(max_depth=3))
    assert three_deep.payload == {"a": {}}
    with pytest.raises(errors.StateTooDeep):
        Checkpoint(SCHEMA, 1, {"a": {"b": 1}}, limits=StateLimits(max_depth=3))
    with pytest.raises(errors.StateTooDeep):
        Checkpoint(SCHEMA, 1, {"a": {}}, limits=StateLimits(max_depth=2))
    with pytest.raises(errors.StateTooDeep) as deep:
        ExecutionContext(SCHEMA, 1, {"a": {"b": 1}}, limits=StateLimits(max_depth=3))
    assert (deep.value.kind, deep.value.max_depth) == ("execution context", 3)


def test_repr_is_redacted() -> None:
    state = Checkpoint(SCHEMA, 2, {"secret": "hunter2"})
    assert repr(state) == (
        f"Checkpoint(format_version=1, schema_version=2, encoded_bytes={state.encoded_bytes}, "
        "payload=<redacted>)"
    )
    assert "hunter2" not in repr(state)
