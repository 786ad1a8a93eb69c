"""Fault state: the five `step_execution.fault_state_*` columns of a step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from pybatch._codecs._primitives import Row, enum_at, int64_at, row_columns
from pybatch._codecs.steps import CHECKPOINT_COLUMNS, decode_checkpoint
from pybatch.errors import JsonNotEncodable
from pybatch.values._canonical import canonical_json
from pybatch.values.fault import (
    FAULT_STATE_FORMAT,
    FAULT_STATE_MAX_BYTES,
    FAULT_STATE_MAX_ENTRIES,
    FAULT_STATE_SCHEMA,
    FAULT_STATE_SCHEMA_VERSION,
    HEX_DIGEST,
    FaultStateEnvelope,
    FaultStateRefusal,
    LockedFaultState,
    fault_entry_from_payload,
    fault_state_refusal,
)
from pybatch.values.status import BatchStatus


class FaultStateColumns(TypedDict):
    """The five `step_execution.fault_state_*` values, keyed by column (= statement parameter)."""

    fault_state_format: int
    fault_state_schema: str
    fault_state_schema_version: int
    fault_state_payload: dict[str, object]
    fault_state_checksum: bytes


#: The five column names, in table order.
FAULT_STATE_COLUMNS = tuple(FaultStateColumns.__annotations__)


def encode_fault_state(envelope: FaultStateEnvelope) -> FaultStateColumns:
    """Return the five `fault_state_*` column values; the SQL layer wraps the payload."""
    return {
        "fault_state_format": FAULT_STATE_FORMAT,
        "fault_state_schema": FAULT_STATE_SCHEMA,
        "fault_state_schema_version": FAULT_STATE_SCHEMA_VERSION,
        "fault_state_payload": envelope.to_payload(),
        "fault_state_checksum": envelope.checksum(),
    }


def decode_fault_state_columns(
    format: object, schema: object, schema_version: object, payload: object, checksum: object
) -> FaultStateEnvelope:
    """Decode and verify the stored columns (re-canonicalised: jsonb reorders keys).

    Corrupt state must stop all work: each refusal names the first rule broken, in this order.
    """
    if _is_empty((format, schema, schema_version, payload, checksum)):
        return FaultStateEnvelope.EMPTY
    if type(format) is not int or format != FAULT_STATE_FORMAT:
        raise fault_state_refusal(FaultStateRefusal.UNSUPPORTED_FORMAT)
    if type(schema) is not str or schema != FAULT_STATE_SCHEMA:
        raise fault_state_refusal(FaultStateRefusal.UNSUPPORTED_SCHEMA)
    if type(schema_version) is not int or schema_version != FAULT_STATE_SCHEMA_VERSION:
        raise fault_state_refusal(FaultStateRefusal.UNSUPPORTED_SCHEMA_VERSION)
    if not isinstance(payload, Mapping) or not {"checkpoint", "entries"} <= set(payload):
        raise fault_state_refusal(FaultStateRefusal.MALFORMED)
    checkpoint, raw_entries = payload["checkpoint"], payload["entries"]
    try:
        canonical = canonical_json({"checkpoint": checkpoint, "entries": raw_entries})
    except JsonNotEncodable:
        raise fault_state_refusal(FaultStateRefusal.MALFORMED) from None
    if len(canonical) > FAULT_STATE_MAX_BYTES:
        raise fault_state_refusal(FaultStateRefusal.TOO_LARGE)
    if type(checkpoint) is not str or HEX_DIGEST.fullmatch(checkpoint) is None:
        raise fault_state_refusal(FaultStateRefusal.MALFORMED)
    if not isinstance(raw_entries, list):
        raise fault_state_refusal(FaultStateRefusal.MALFORMED)
    if len(raw_entries) > FAULT_STATE_MAX_ENTRIES:
        raise fault_state_refusal(FaultStateRefusal.TOO_MANY_ENTRIES)
    entries = tuple(fault_entry_from_payload(raw) for raw in raw_entries)
    # Strict entry decoding re-encodes to exactly `canonical`: the checksum covers what was stored.
    envelope = FaultStateEnvelope(bytes.fromhex(checkpoint), entries)
    if not isinstance(checksum, bytes | bytearray | memoryview):
        raise fault_state_refusal(FaultStateRefusal.CHECKSUM_MISMATCH)
    if bytes(checksum) != envelope.checksum():
        raise fault_state_refusal(FaultStateRefusal.CHECKSUM_MISMATCH)
    return envelope


LOCKED_FAULT_STATE_COLUMNS = ("status", "version", *CHECKPOINT_COLUMNS, *FAULT_STATE_COLUMNS)


def decode_locked_fault_state(row: Row) -> LockedFaultState:
    """Decode a lock_step_fault_state row (columns `LOCKED_FAULT_STATE_COLUMNS`)."""
    values = row_columns(row, LOCKED_FAULT_STATE_COLUMNS)
    envelope = decode_fault_state(values)
    return LockedFaultState(
        status=enum_at(BatchStatus, values, "status"),
        version=int64_at(values, "version", 0),
        checkpoint_digest=decode_checkpoint(values).generation_digest(),
        envelope=envelope,
    )


def decode_fault_state(row: Row) -> FaultStateEnvelope:
    """Decode and verify the `fault_state_*` columns of a row (see `decode_fault_state_columns`)."""
    return decode_fault_state_columns(*(row[column] for column in FAULT_STATE_COLUMNS))


_EMPTY_COLUMNS: tuple[object, ...] = tuple(encode_fault_state(FaultStateEnvelope.EMPTY).values())


def _is_empty(columns: tuple[object, ...]) -> bool:
    """Whether the columns are exactly the empty envelope's (most reads): no full decode needed."""
    return all(
        type(value) is type(expected) and value == expected
        for value, expected in zip(columns, _EMPTY_COLUMNS, strict=True)
    )
