"""Fault-state values: retry keys, bounds, envelope codec and reservations."""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
from typing import Any

import pytest

from pybatch._codecs.fault_state import decode_fault_state_columns, encode_fault_state
from pybatch.errors import (
    CapacityExhausted,
    FaultStateEnvelopeInvalid,
    FaultStateFormatError,
    StaleReservation,
)
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    FaultStateEnvelope,
    FaultStateRefusal,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.names import ClassifierRevision, StepName
from pybatch.values.status import FailureCategory

EMPTY_BYTES = (
    b'{"checkpoint":"0000000000000000000000000000000000000000000000000000000000000000",'
    b'"entries":[]}'
)
EMPTY_SHA256 = "a491114819e0d3bd8b7ca004dc0636f95b45e2fcb1a67ddb5726beaea12f9922"

CHECKPOINT = hashlib.sha256(b"checkpoint generation 1").digest()
OTHER_CHECKPOINT = hashlib.sha256(b"checkpoint generation 2").digest()
ZERO = bytes(32)
REVISION = ClassifierRevision("import_v1")


# --------------------------------------------------------------------------- helpers


def key(byte: int) -> RetryKey:
    return RetryKey(bytes([byte]) * 32)


def entry(
    byte: int,
    ordinal: int = 1,
    phase: FaultPhase = FaultPhase.READ,
    category: FailureCategory = FailureCategory.TIMEOUT,
    revision: ClassifierRevision = REVISION,
) -> FaultEntry:
    return FaultEntry(
        key=key(byte),
        phase=phase,
        category=category,
        ordinal=RetryOrdinal(ordinal),
        revision=revision,
    )


def raw_entry(byte: int = 1, **overrides: Any) -> dict[str, Any]:
    """One stored entry as JSON, valid unless overridden."""
    document: dict[str, Any] = {
        "category": "TIMEOUT",
        "key": (bytes([byte]) * 32).hex(),
        "ordinal": 1,
        "phase": "read",
        "revision": "import_v1",
    }
    document.update(overrides)
    return document


def canonical(document: Any) -> bytes:
    """Canonical JSON written independently of the module under test (sorted, compact, no NaN)."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def checksum_of(payload: dict[str, Any]) -> bytes:
    """The checksum a writer would have stored for exactly `checkpoint` and `entries`."""
    return hashlib.sha256(
        canonical({"checkpoint": payload["checkpoint"], "entries": payload["entries"]})
    ).digest()


def jsonb_order(value: Any) -> Any:
    """Reorder object keys the way jsonb prints them: shorter key first, then bytes."""
    if isinstance(value, dict):
        ordered = sorted(value, key=lambda name: (len(name.encode()), name.encode()))
        return {name: jsonb_order(value[name]) for name in ordered}
    if isinstance(value, list):
        return [jsonb_order(item) for item in value]
    return value


def decode(payload: Any, checksum: Any = None, **columns: Any) -> FaultStateEnvelope:
    """Call from_columns with valid columns unless overridden; checksum defaults to a match."""
    if checksum is None:
        checksum = checksum_of(payload)
    return decode_fault_state_columns(
        columns.get("format", 1),
        columns.get("schema", "oxide-batch.fault-state"),
        columns.get("schema_version", 1),
        payload,
        checksum,
    )


def refused(reason: FaultStateRefusal, payload: Any, checksum: Any = None, **columns: Any) -> None:
    with pytest.raises(FaultStateEnvelopeInvalid) as caught:
        decode(payload, checksum, **columns)
    assert caught.value.reason == reason.value


def payload_of(checkpoint: bytes, *entries: Any) -> dict[str, Any]:
    return {"checkpoint": checkpoint.hex(), "entries": list(entries)}


def filled(count: int, *, revision: ClassifierRevision = REVISION) -> FaultStateEnvelope:
    envelope = FaultStateEnvelope.EMPTY
    for byte in range(count):
        digest = hashlib.sha256(bytes([byte % 256, byte // 256])).digest()
        envelope = envelope.reserved(
            FaultEntry(
                key=RetryKey(digest),
                phase=FaultPhase.PROCESS,
                category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
                ordinal=RetryOrdinal(1),
                revision=revision,
            ),
            CHECKPOINT,
            RetryStateLimit(256),
        )
    return envelope


# --------------------------------------------------------------------------- empty envelope


def test_empty_envelope_is_the_94_golden_bytes() -> None:
    empty = FaultStateEnvelope.EMPTY
    assert len(EMPTY_BYTES) == 94
    assert empty.canonical_bytes() == EMPTY_BYTES
    assert hashlib.sha256(EMPTY_BYTES).hexdigest() == EMPTY_SHA256
    assert empty.checksum().hex() == EMPTY_SHA256
    assert empty.is_empty
    assert empty.checkpoint_digest == ZERO
    assert empty.entries == ()


def test_empty_envelope_columns() -> None:
    columns = encode_fault_state(FaultStateEnvelope.EMPTY)
    assert columns == {
        "fault_state_format": 1,
        "fault_state_schema": "oxide-batch.fault-state",
        "fault_state_schema_version": 1,
        "fault_state_payload": {"checkpoint": "0" * 64, "entries": []},
        "fault_state_checksum": bytes.fromhex(EMPTY_SHA256),
    }


def test_empty_envelope_read_back_from_jsonb_order_verifies() -> None:
    # jsonb returns {"entries": [], "checkpoint": "000…0"} (shorter key first).
    stored = jsonb_order(encode_fault_state(FaultStateEnvelope.EMPTY)["fault_state_payload"])
    assert list(stored) == ["entries", "checkpoint"]
    decoded = decode_fault_state_columns(
        1, "oxide-batch.fault-state", 1, stored, bytes.fromhex(EMPTY_SHA256)
    )
    assert decoded == FaultStateEnvelope.EMPTY


# --------------------------------------------------------------------------- round trip


def test_round_trip_through_jsonb_key_order() -> None:
    envelope = FaultStateEnvelope.EMPTY
    for byte, phase in (
        (0x90, FaultPhase.WRITE),
        (0x10, FaultPhase.READ),
        (0x50, FaultPhase.PROCESS),
    ):
        envelope = envelope.reserved(entry(byte, phase=phase), CHECKPOINT, RetryStateLimit(8))
    envelope = envelope.reserved(entry(0x50, 2, FaultPhase.PROCESS), CHECKPOINT, RetryStateLimit(8))
    columns = encode_fault_state(envelope)
    # Through text, as the driver would hand it over, with jsonb's key order and spacing.
    stored = json.loads(json.dumps(jsonb_order(columns["fault_state_payload"])))
    assert list(stored) == ["entries", "checkpoint"]
    assert list(stored["entries"][0]) == ["key", "phase", "ordinal", "category", "revision"]
    # The stored text is not the canonical form, so hashing it as-is would not verify.
    assert json.dumps(stored, separators=(",", ":")).encode() != envelope.canonical_bytes()

    decoded = decode_fault_state_columns(
        columns["fault_state_format"],
        columns["fault_state_schema"],
        columns["fault_state_schema_version"],
        stored,
        columns["fault_state_checksum"],
    )
    assert decoded == envelope
    assert decoded.canonical_bytes() == envelope.canonical_bytes()
    assert decoded.checksum() == hashlib.sha256(envelope.canonical_bytes()).digest()
    assert [e.key for e in decoded.entries] == [key(0x10), key(0x50), key(0x90)]
    assert decoded.ordinal_for(key(0x50)) == RetryOrdinal(2)


def test_canonical_bytes_are_the_documented_form() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(0xAB, 3, FaultPhase.WRITE),))
    assert envelope.canonical_bytes() == (
        b'{"checkpoint":"' + CHECKPOINT.hex().encode() + b'","entries":[{"category":"TIMEOUT",'
        b'"key":"' + b"ab" * 32 + b'","ordinal":3,"phase":"write","revision":"import_v1"}]}'
    )
    assert envelope.checksum() == hashlib.sha256(envelope.canonical_bytes()).digest()


def test_other_top_level_members_are_ignored() -> None:
    payload = payload_of(CHECKPOINT, raw_entry())
    checksum = checksum_of(payload)
    payload["note"] = {"not": "covered"}
    assert decode(payload, checksum).entries == (entry(1),)


def test_checksum_may_arrive_as_memoryview() -> None:
    payload = payload_of(ZERO)
    assert decode(payload, memoryview(checksum_of(payload))) == FaultStateEnvelope.EMPTY


def test_to_columns_payload_is_a_fresh_plain_dict() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(7),))
    first = encode_fault_state(envelope)["fault_state_payload"]
    assert type(first) is dict
    entries = first["entries"]
    assert isinstance(entries, list)
    entries.clear()
    assert encode_fault_state(envelope)["fault_state_payload"]["entries"] == [raw_entry(7)]


# --------------------------------------------------------------------------- decoder refusals


@pytest.mark.parametrize("format_", [0, 2, True, "1", None])
def test_refuses_unsupported_format(format_: Any) -> None:
    refused(FaultStateRefusal.UNSUPPORTED_FORMAT, payload_of(ZERO), format=format_)


@pytest.mark.parametrize("schema", ["oxide-batch.checkpoint", "oxide-batch.fault-state ", None])
def test_refuses_unsupported_schema(schema: Any) -> None:
    refused(FaultStateRefusal.UNSUPPORTED_SCHEMA, payload_of(ZERO), schema=schema)


@pytest.mark.parametrize("schema_version", [0, 2, True, None])
def test_refuses_unsupported_schema_version(schema_version: Any) -> None:
    refused(
        FaultStateRefusal.UNSUPPORTED_SCHEMA_VERSION,
        payload_of(ZERO),
        schema_version=schema_version,
    )


def test_refuses_too_large_payload() -> None:
    # One entry whose revision alone passes 64 KiB: without the size check it would be
    # refused later, as a malformed entry (the revision is over 128 bytes).
    payload = payload_of(CHECKPOINT, raw_entry(revision="r" * (64 * 1024)))
    refused(FaultStateRefusal.TOO_LARGE, payload)


def test_refuses_more_than_256_entries_before_decoding_them() -> None:
    # Without the count check the 257th entry would be reported as malformed.
    entries = [raw_entry(byte) for byte in range(256)] + ["not an entry"]
    refused(FaultStateRefusal.TOO_MANY_ENTRIES, payload_of(CHECKPOINT, *entries))


def test_256_entries_are_accepted() -> None:
    entries = [raw_entry(byte) for byte in range(256)]
    assert len(decode(payload_of(CHECKPOINT, *entries)).entries) == 256


def test_refuses_unsorted_entries() -> None:
    payload = payload_of(CHECKPOINT, raw_entry(2), raw_entry(1))
    refused(FaultStateRefusal.UNSORTED_ENTRIES, payload)


def test_refuses_duplicate_keys() -> None:
    payload = payload_of(CHECKPOINT, raw_entry(1), raw_entry(1, ordinal=2))
    refused(FaultStateRefusal.DUPLICATE_KEY, payload)


@pytest.mark.parametrize(
    "payload",
    [
        [],
        "{}",
        {"entries": []},
        {"checkpoint": "0" * 64},
        {"checkpoint": "0" * 63, "entries": []},
        {"checkpoint": "0" * 65, "entries": []},
        {"checkpoint": "A" * 64, "entries": [raw_entry()]},
        {"checkpoint": "g" * 64, "entries": [raw_entry()]},
        {"checkpoint": " " + "0" * 63, "entries": []},
        {"checkpoint": None, "entries": []},
        {"checkpoint": "0" * 64, "entries": {}},
        {"checkpoint": "0" * 64, "entries": None},
        {"checkpoint": "0" * 64, "entries": [float("nan")]},
    ],
    ids=repr,
)
def test_refuses_malformed_payload(payload: Any) -> None:
    refused(FaultStateRefusal.MALFORMED, payload, checksum=bytes(32))


@pytest.mark.parametrize(
    "bad",
    [
        "not an object",
        ["a", "list"],
        {k: v for k, v in raw_entry().items() if k != "revision"},
        {k: v for k, v in raw_entry().items() if k != "key"},
        {k: v for k, v in raw_entry().items() if k != "phase"},
        raw_entry(extra=1),
        raw_entry(key="AB" * 32),
        raw_entry(key="ab" * 31),
        raw_entry(key=None),
        raw_entry(phase=1),
        raw_entry(category=None),
        raw_entry(ordinal=0),
        raw_entry(ordinal=65536),
        raw_entry(ordinal=-1),
        raw_entry(ordinal=True),
        raw_entry(ordinal=1.0),
        raw_entry(ordinal="1"),
        raw_entry(revision=""),
        raw_entry(revision=" import_v1"),
        raw_entry(revision="r" * 129),
        raw_entry(revision="a\x07b"),
        raw_entry(revision=7),
    ],
    ids=repr,
)
def test_refuses_malformed_entry(bad: Any) -> None:
    refused(FaultStateRefusal.MALFORMED_ENTRY, payload_of(CHECKPOINT, bad))


@pytest.mark.parametrize(
    "bad",
    [
        raw_entry(phase="retry"),
        raw_entry(phase="READ"),
        raw_entry(category="timeout"),
        raw_entry(category="BOGUS"),
    ],
    ids=repr,
)
def test_refuses_unknown_enumeration(bad: dict[str, Any]) -> None:
    refused(FaultStateRefusal.UNKNOWN_ENUMERATION, payload_of(CHECKPOINT, bad))


def test_every_known_phase_and_category_decodes() -> None:
    for phase in FaultPhase:
        for category in FailureCategory:
            payload = payload_of(CHECKPOINT, raw_entry(phase=phase.value, category=category.value))
            decoded = decode(payload).entries[0]
            assert (decoded.phase, decoded.category) == (phase, category)


def test_refuses_entries_with_the_zero_checkpoint() -> None:
    refused(FaultStateRefusal.CHECKPOINT_EMPTINESS_MISMATCH, payload_of(ZERO, raw_entry()))


def test_refuses_empty_envelope_with_a_nonzero_checkpoint() -> None:
    refused(FaultStateRefusal.CHECKPOINT_EMPTINESS_MISMATCH, payload_of(CHECKPOINT))


@pytest.mark.parametrize(
    "checksum",
    [
        bytes(32),
        bytes.fromhex(EMPTY_SHA256)[:31],
        bytes.fromhex(EMPTY_SHA256) + b"\x00",
        EMPTY_SHA256,
        b"",
        None,
    ],
    ids=repr,
)
def test_refuses_checksum_mismatch(checksum: Any) -> None:
    with pytest.raises(FaultStateEnvelopeInvalid) as caught:
        decode_fault_state_columns(1, "oxide-batch.fault-state", 1, payload_of(ZERO), checksum)
    assert caught.value.reason == FaultStateRefusal.CHECKSUM_MISMATCH.value


def test_refuses_checksum_of_the_non_canonical_stored_text() -> None:
    stored = jsonb_order(payload_of(CHECKPOINT, raw_entry()))
    wrong = hashlib.sha256(json.dumps(stored).encode()).digest()
    refused(FaultStateRefusal.CHECKSUM_MISMATCH, stored, wrong)


def test_refuses_checksum_that_does_not_cover_a_changed_ordinal() -> None:
    written = payload_of(CHECKPOINT, raw_entry(ordinal=1))
    tampered = payload_of(CHECKPOINT, raw_entry(ordinal=2))
    refused(FaultStateRefusal.CHECKSUM_MISMATCH, tampered, checksum_of(written))


def test_refusal_reasons_are_distinct_and_redacted() -> None:
    reasons = [refusal.value for refusal in FaultStateRefusal]
    assert len(set(reasons)) == len(reasons)
    error = FaultStateEnvelopeInvalid(reason=FaultStateRefusal.CHECKSUM_MISMATCH.value)
    assert isinstance(error, FaultStateFormatError)
    assert str(error) == "fault state envelope refused: checksum mismatch"
    assert pickle.loads(pickle.dumps(error)).reason == "checksum mismatch"


# --------------------------------------------------------------------------- construction


def test_constructor_refuses_unsorted_duplicate_and_too_many() -> None:
    with pytest.raises(FaultStateEnvelopeInvalid, match="unsorted entries"):
        FaultStateEnvelope(CHECKPOINT, (entry(2), entry(1)))
    with pytest.raises(FaultStateEnvelopeInvalid, match="duplicate key"):
        FaultStateEnvelope(CHECKPOINT, (entry(1), entry(1, 2)))
    too_many = tuple(
        FaultEntry(
            key=RetryKey(bytes([n // 256, n % 256]) + bytes(30)),
            phase=FaultPhase.READ,
            category=FailureCategory.TIMEOUT,
            ordinal=RetryOrdinal(1),
            revision=REVISION,
        )
        for n in range(257)
    )
    with pytest.raises(FaultStateEnvelopeInvalid, match="too many entries"):
        FaultStateEnvelope(CHECKPOINT, too_many)
    assert len(FaultStateEnvelope(CHECKPOINT, too_many[:256]).entries) == 256


def test_constructor_refuses_canonical_form_above_64_kib() -> None:
    long_revision = ClassifierRevision("r" * 128)
    envelope = filled(229, revision=long_revision)
    assert len(envelope.canonical_bytes()) <= 64 * 1024
    extra = FaultEntry(
        key=RetryKey(hashlib.sha256(b"one more").digest()),
        phase=FaultPhase.READ,
        category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
        ordinal=RetryOrdinal(1),
        revision=long_revision,
    )
    with pytest.raises(FaultStateEnvelopeInvalid, match="too large"):
        envelope.reserved(extra, CHECKPOINT, RetryStateLimit(256))


def test_constructor_refuses_emptiness_mismatch() -> None:
    with pytest.raises(FaultStateEnvelopeInvalid, match="checkpoint emptiness mismatch"):
        FaultStateEnvelope(CHECKPOINT, ())
    with pytest.raises(FaultStateEnvelopeInvalid, match="checkpoint emptiness mismatch"):
        FaultStateEnvelope(ZERO, (entry(1),))


def test_constructor_type_checks_are_programmer_errors() -> None:
    with pytest.raises(ValueError):
        FaultStateEnvelope(b"short", ())
    with pytest.raises(TypeError):
        FaultStateEnvelope(CHECKPOINT, [entry(1)])  # type: ignore[arg-type]


def test_envelope_repr_is_redacted() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(0xAB),))
    text = repr(envelope)
    assert text == "FaultStateEnvelope(entry_count=1, ..)"
    assert "ab" * 4 not in repr(envelope.entries[0])
    assert CHECKPOINT.hex()[:8] not in text


# --------------------------------------------------------------------------- validate_for


def test_validate_for_accepts_state_within_the_policy() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(1, 2), entry(2, 1)))
    envelope.validate_for(RetryLimit(2), RetryStateLimit(2), CHECKPOINT)
    FaultStateEnvelope.EMPTY.validate_for(RetryLimit.NONE, RetryStateLimit(1), OTHER_CHECKPOINT)


def test_validate_for_refuses_too_many_entries() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(1), entry(2)))
    with pytest.raises(FaultStateEnvelopeInvalid) as caught:
        envelope.validate_for(RetryLimit(5), RetryStateLimit(1), CHECKPOINT)
    assert caught.value.reason == "too many entries"


def test_validate_for_refuses_ordinal_above_limit() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(1, 1), entry(2, 3)))
    with pytest.raises(FaultStateEnvelopeInvalid) as caught:
        envelope.validate_for(RetryLimit(2), RetryStateLimit(2), CHECKPOINT)
    assert caught.value.reason == "ordinal above limit"


def test_validate_for_refuses_superseded_checkpoint() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(1),))
    with pytest.raises(FaultStateEnvelopeInvalid) as caught:
        envelope.validate_for(RetryLimit(2), RetryStateLimit(2), OTHER_CHECKPOINT)
    assert caught.value.reason == "checkpoint mismatch"


def test_validate_for_check_order() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(1, 9), entry(2, 9)))
    with pytest.raises(FaultStateEnvelopeInvalid, match="too many entries"):
        envelope.validate_for(RetryLimit(1), RetryStateLimit(1), OTHER_CHECKPOINT)
    with pytest.raises(FaultStateEnvelopeInvalid, match="ordinal above limit"):
        envelope.validate_for(RetryLimit(1), RetryStateLimit(2), OTHER_CHECKPOINT)


# --------------------------------------------------------------------------- reserved


def test_first_reservation_of_a_key_is_ordinal_one() -> None:
    limit = RetryStateLimit(4)
    envelope = FaultStateEnvelope.EMPTY.reserved(entry(5), CHECKPOINT, limit)
    assert envelope.checkpoint_digest == CHECKPOINT
    assert envelope.entries == (entry(5),)
    assert envelope.ordinal_for(key(5)) == RetryOrdinal(1)
    assert envelope.ordinal_for(key(6)) is None
    assert FaultStateEnvelope.EMPTY.is_empty  # values are immutable


@pytest.mark.parametrize("ordinal", [0, 2, 3, 65535])
def test_first_reservation_with_another_ordinal_is_stale(ordinal: int) -> None:
    with pytest.raises(StaleReservation):
        FaultStateEnvelope.EMPTY.reserved(entry(5, ordinal), CHECKPOINT, RetryStateLimit(4))


def test_next_reservation_must_follow_the_stored_ordinal() -> None:
    limit = RetryStateLimit(4)
    one = FaultStateEnvelope.EMPTY.reserved(entry(5, 1), CHECKPOINT, limit)
    two = one.reserved(entry(5, 2, category=FailureCategory.USER_COMPONENT), CHECKPOINT, limit)
    assert two.ordinal_for(key(5)) == RetryOrdinal(2)
    assert two.entries == (entry(5, 2, category=FailureCategory.USER_COMPONENT),)
    for stale in (1, 2, 4):
        with pytest.raises(StaleReservation):
            two.reserved(entry(5, stale), CHECKPOINT, limit)


def test_no_ordinal_follows_65535() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(5, 65535),))
    for ordinal in (0, 1, 65535):
        with pytest.raises(StaleReservation):
            envelope.reserved(entry(5, ordinal), CHECKPOINT, RetryStateLimit(4))


def test_reserved_keeps_entries_sorted_by_key() -> None:
    limit = RetryStateLimit(8)
    envelope = FaultStateEnvelope.EMPTY
    for byte in (0x80, 0x01, 0xFF, 0x40, 0x7F):
        envelope = envelope.reserved(entry(byte), CHECKPOINT, limit)
    envelope = envelope.reserved(entry(0x40, 2), CHECKPOINT, limit)
    assert [e.key.digest[0] for e in envelope.entries] == [0x01, 0x40, 0x7F, 0x80, 0xFF]
    assert [e.ordinal.value for e in envelope.entries] == [1, 2, 1, 1, 1]


def test_reserved_refuses_a_superseded_checkpoint() -> None:
    envelope = FaultStateEnvelope.EMPTY.reserved(entry(5), CHECKPOINT, RetryStateLimit(4))
    with pytest.raises(FaultStateEnvelopeInvalid) as caught:
        envelope.reserved(entry(6), OTHER_CHECKPOINT, RetryStateLimit(4))
    assert caught.value.reason == "checkpoint mismatch"


def test_empty_envelope_takes_any_checkpoint() -> None:
    envelope = FaultStateEnvelope.EMPTY.reserved(entry(5), OTHER_CHECKPOINT, RetryStateLimit(1))
    assert envelope.checkpoint_digest == OTHER_CHECKPOINT


def test_reserved_refuses_the_zero_checkpoint() -> None:
    with pytest.raises(FaultStateEnvelopeInvalid, match="checkpoint emptiness mismatch"):
        FaultStateEnvelope.EMPTY.reserved(entry(5), ZERO, RetryStateLimit(1))


def test_reserved_checks_checkpoint_before_ordinal() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(5),))
    with pytest.raises(FaultStateEnvelopeInvalid, match="checkpoint mismatch"):
        envelope.reserved(entry(5, 7), OTHER_CHECKPOINT, RetryStateLimit(4))


# --------------------------------------------------------------------------- capacity


def test_new_key_beyond_the_state_limit_exhausts_capacity() -> None:
    limit = RetryStateLimit(2)
    envelope = FaultStateEnvelope.EMPTY.reserved(entry(1), CHECKPOINT, limit)
    envelope = envelope.reserved(entry(2), CHECKPOINT, limit)
    with pytest.raises(CapacityExhausted) as caught:
        envelope.reserved(entry(3), CHECKPOINT, limit)
    assert caught.value.max == 2
    # An existing key still advances at capacity.
    assert envelope.reserved(entry(2, 2), CHECKPOINT, limit).ordinal_for(key(2)) == RetryOrdinal(2)


def test_stale_ordinal_is_reported_before_capacity() -> None:
    envelope = FaultStateEnvelope(CHECKPOINT, (entry(1),))
    with pytest.raises(StaleReservation):
        envelope.reserved(entry(3, 2), CHECKPOINT, RetryStateLimit(1))


def test_the_format_ceiling_is_256_keys() -> None:
    envelope = filled(256)
    with pytest.raises(CapacityExhausted) as caught:
        envelope.reserved(entry(0), CHECKPOINT, RetryStateLimit(256))
    assert caught.value.max == 256


# --------------------------------------------------------------------------- phases


@pytest.mark.parametrize("phase", [FaultPhase.READ, FaultPhase.PROCESS, FaultPhase.WRITE])
def test_item_phases_are_reservable(phase: FaultPhase) -> None:
    assert phase.is_reservable
    envelope = FaultStateEnvelope.EMPTY.reserved(
        entry(1, phase=phase), CHECKPOINT, RetryStateLimit(1)
    )
    assert envelope.entries[0].phase is phase


@pytest.mark.parametrize(
    "phase",
    [FaultPhase.TRANSACTION, FaultPhase.CHECKPOINT, FaultPhase.LISTENER, FaultPhase.BACKOFF],
)
def test_other_phases_are_refused_for_reservation(phase: FaultPhase) -> None:
    assert not phase.is_reservable
    with pytest.raises(StaleReservation):
        FaultStateEnvelope.EMPTY.reserved(entry(1, phase=phase), CHECKPOINT, RetryStateLimit(1))


def test_phase_names_are_the_durable_names() -> None:
    assert [phase.value for phase in FaultPhase] == [
        "read",
        "process",
        "write",
        "transaction",
        "checkpoint",
        "listener",
        "backoff",
    ]
    assert FaultPhase.from_durable_code("write") is FaultPhase.WRITE
    assert FaultPhase.from_durable_code("Write") is None


# --------------------------------------------------------------------------- retry key


def test_retry_key_golden_derivation() -> None:
    definition_digest = hashlib.sha256(b"definition").digest()
    checkpoint_digest = hashlib.sha256(b"checkpoint").digest()
    step = "적재_step"  # non-ASCII: the length prefix counts UTF-8 bytes, not characters
    step_bytes = step.encode("utf-8")
    assert len(step_bytes) == 11 and len(step) == 7
    ordinal = 2**40 + 7
    expected = hashlib.sha256(
        b"oxide-batch/retry-key/1"
        + definition_digest
        + struct.pack(">Q", 11)
        + step_bytes
        + b"write"
        + b"\x00"
        + checkpoint_digest
        + struct.pack(">Q", ordinal)
    ).digest()

    derived = RetryKey.derive(
        definition_digest, StepName(step), FaultPhase.WRITE, checkpoint_digest, ordinal
    )
    assert derived.digest == expected
    assert derived.hex() == expected.hex()
    assert derived == RetryKey.derive(
        definition_digest, StepName(step), FaultPhase.WRITE, checkpoint_digest, ordinal
    )


def test_retry_key_depends_on_every_input() -> None:
    base = (hashlib.sha256(b"d").digest(), StepName("load"), FaultPhase.READ, CHECKPOINT, 0)
    keys = {
        RetryKey.derive(*base),
        RetryKey.derive(hashlib.sha256(b"e").digest(), *base[1:]),
        RetryKey.derive(base[0], StepName("load2"), *base[2:]),
        RetryKey.derive(*base[:2], FaultPhase.PROCESS, *base[3:]),
        RetryKey.derive(*base[:3], OTHER_CHECKPOINT, 0),
        RetryKey.derive(*base[:4], 1),
        RetryKey.derive(*base[:4], 2**64 - 1),
    }
    assert len(keys) == 7


def test_retry_key_refuses_bad_inputs() -> None:
    digest = hashlib.sha256(b"d").digest()
    step = StepName("load")
    with pytest.raises(ValueError):
        RetryKey.derive(digest[:31], step, FaultPhase.READ, CHECKPOINT, 0)
    with pytest.raises(ValueError):
        RetryKey.derive(digest, step, FaultPhase.READ, CHECKPOINT, 2**64)
    with pytest.raises(ValueError):
        RetryKey.derive(digest, step, FaultPhase.READ, CHECKPOINT, -1)
    with pytest.raises(TypeError):
        RetryKey.derive(digest, step, FaultPhase.READ, CHECKPOINT, True)
    with pytest.raises(TypeError):
        RetryKey.derive(digest, "load", FaultPhase.READ, CHECKPOINT, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RetryKey(bytes(31))


def test_retry_key_repr_is_redacted() -> None:
    derived = key(0xAB)
    assert repr(derived) == "RetryKey(digest=<redacted>)"
    assert "ab" not in repr(entry(0xAB))
    assert key(1) < key(2)


# --------------------------------------------------------------------------- bounds


def test_retry_ordinal_bounds() -> None:
    assert RetryOrdinal.INITIAL == RetryOrdinal(0)
    assert RetryOrdinal.MAX == RetryOrdinal(65535)
    for bad in (-1, 65536):
        with pytest.raises(ValueError):
            RetryOrdinal(bad)
    with pytest.raises(TypeError):
        RetryOrdinal(True)


def test_retry_limit_bounds() -> None:
    assert RetryLimit.NONE == RetryLimit(0)
    assert RetryLimit(65535).value == 65535
    for bad in (-1, 65536):
        with pytest.raises(ValueError):
            RetryLimit(bad)


def test_retry_state_limit_bounds() -> None:
    assert RetryStateLimit(1).value == 1
    assert RetryStateLimit(256).value == 256
    for bad in (0, 257):
        with pytest.raises(ValueError):
            RetryStateLimit(bad)
