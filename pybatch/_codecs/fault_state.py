"""Fault state: the five `step_execution.fault_state_*` columns of a step."""

from __future__ import annotations

from typing import TypedDict

from pybatch._codecs._primitives import Row, enum_at, int64_at, row_columns
from pybatch._codecs.steps import CHECKPOINT_COLUMNS, decode_checkpoint
from pybatch.values import fault
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


def encode_fault_state(envelope: fault.FaultStateEnvelope) -> FaultStateColumns:
    """Return the five `fault_state_*` column values; the SQL layer wraps the payload."""
    return {
        "fault_state_format": fault.FAULT_STATE_FORMAT,
        "fault_state_schema": fault.FAULT_STATE_SCHEMA,
        "fault_state_schema_version": fault.FAULT_STATE_SCHEMA_VERSION,
        "fault_state_payload": envelope.to_payload(),
        "fault_state_checksum": envelope.checksum(),
    }


LOCKED_FAULT_STATE_COLUMNS = ("status", "version", *CHECKPOINT_COLUMNS, *FAULT_STATE_COLUMNS)


def decode_locked_fault_state(row: Row) -> fault.LockedFaultState:
    """Decode a lock_step_fault_state row (columns `LOCKED_FAULT_STATE_COLUMNS`)."""
    values = row_columns(row, LOCKED_FAULT_STATE_COLUMNS)
    envelope = decode_fault_state(values)
    return fault.LockedFaultState(
        status=enum_at(BatchStatus, values, "status"),
        version=int64_at(values, "version", 0),
        checkpoint_digest=decode_checkpoint(values).generation_digest(),
        envelope=envelope,
    )


def decode_fault_state(row: Row) -> fault.FaultStateEnvelope:
    """Decode and verify the `fault_state_*` columns of a row (see `from_columns`)."""
    return fault.FaultStateEnvelope.from_columns(*(row[column] for column in FAULT_STATE_COLUMNS))
