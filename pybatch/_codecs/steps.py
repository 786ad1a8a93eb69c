"""Step executions: step_execution rows, counters and state envelopes (docs/tables.md 2.7)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import attrs

from pybatch._codecs import _primitives as p
from pybatch._codecs import lifecycle
from pybatch.errors import PyBatchError
from pybatch.values.counts import ExecutionCounts, StepFaultCounts
from pybatch.values.ids import JobExecutionId, StepExecutionId
from pybatch.values.names import NodeId, StateSchemaId, StepName
from pybatch.values.records import StepExecution
from pybatch.values.state import STATE_FORMAT_VERSION, Checkpoint, ExecutionContext, StateLimits

#: The six counter columns of a step, in table (and ExecutionCounts field) order.
COUNT_COLUMNS = tuple(
    "read_count processed_count write_count filter_count commit_count rollback_count".split()
)
_COUNT_COLUMNS = tuple(zip(attrs.fields_dict(ExecutionCounts), COUNT_COLUMNS, strict=True))
#: Each StepFaultCounts field and its `<field>_count` column, in table order.
_FAULT_COUNT_COLUMNS = tuple((name, f"{name}_count") for name in attrs.fields_dict(StepFaultCounts))
_STATE_PARTS = ("format", "schema", "schema_version", "payload")

CHECKPOINT_COLUMNS = tuple(f"checkpoint_{part}" for part in _STATE_PARTS)
CONTEXT_COLUMNS = tuple(f"context_{part}" for part in _STATE_PARTS)

#: The leading columns of a step_execution row, in table order.
STEP_HEAD_COLUMNS = tuple("id job_execution_id step_name step_logical_id status exit_code".split())
#: Columns `decode_step_execution` reads (fault-state columns belong to the fault-state codec).
STEP_EXECUTION_COLUMNS = (
    *(*STEP_HEAD_COLUMNS, *COUNT_COLUMNS, *CHECKPOINT_COLUMNS, *CONTEXT_COLUMNS),
    *(*lifecycle.FAILURE_COLUMNS, *lifecycle.INSTANT_COLUMNS, "version"),
    *(column for _, column in _FAULT_COUNT_COLUMNS),
)

_StateT = TypeVar("_StateT", Checkpoint, ExecutionContext)
_CountsT = TypeVar("_CountsT", ExecutionCounts, StepFaultCounts)
_U32_MAX = 2**32 - 1


def decode_state(
    state_cls: type[_StateT],
    values: Mapping[str, object],
    prefix: str,
    limits: StateLimits = StateLimits.STEP,
) -> _StateT:
    """Rebuild and validate a state envelope from its four columns, within `limits`."""
    format_value = values[f"{prefix}_format"]
    if type(format_value) is not int or format_value != STATE_FORMAT_VERSION:
        raise p.DecodeError(f"{prefix}_format")
    schema = p.text_value_at(StateSchemaId, values, f"{prefix}_schema")
    schema_version = values[f"{prefix}_schema_version"]
    if type(schema_version) is not int or not 1 <= schema_version <= _U32_MAX:
        raise p.DecodeError(f"{prefix}_schema_version")
    payload = p.decode_json_object(values[f"{prefix}_payload"], column=f"{prefix}_payload")
    try:
        return state_cls(schema, schema_version, payload, limits=limits)
    except PyBatchError:
        raise p.DecodeError(f"{prefix}_payload") from None


def _decode_counters(
    counts_cls: type[_CountsT], row: p.Row, columns: tuple[tuple[str, str], ...]
) -> _CountsT:
    return counts_cls(**{field: p.int64_at(row, column, 0) for field, column in columns})


def decode_step_execution(row: p.Row) -> StepExecution:
    """Decode a step_execution row (columns `STEP_EXECUTION_COLUMNS`)."""
    values = p.row_columns(row, STEP_EXECUTION_COLUMNS)
    metadata = lifecycle.decode_metadata(values, decode_counts(values))
    return StepExecution(
        id=StepExecutionId(p.int64_at(values, "id")),
        job_execution_id=JobExecutionId(p.int64_at(values, "job_execution_id")),
        step_name=p.text_value_at(StepName, values, "step_name"),
        logical_id=p.text_value_at(NodeId, values, "step_logical_id"),
        metadata=metadata,
        updated_at=lifecycle.decode_updated_at(values, metadata),
        version=p.int64_at(values, "version", 0),
        checkpoint=decode_checkpoint(values),
        context=decode_context(values),
        fault_counts=_decode_counters(StepFaultCounts, values, _FAULT_COUNT_COLUMNS),
    )


def encode_counts(counts: ExecutionCounts) -> dict[str, object]:
    """Column values of the six step counters (read_count ... rollback_count)."""
    return {column: getattr(counts, field) for field, column in _COUNT_COLUMNS}


def decode_checkpoint(row: p.Row) -> Checkpoint:
    """Rebuild a step's checkpoint from its `checkpoint_*` columns (limits 1 MiB / depth 64)."""
    return decode_state(Checkpoint, row, "checkpoint")


def decode_context(row: p.Row) -> ExecutionContext:
    """Rebuild a step's execution context from its `context_*` columns."""
    return decode_state(ExecutionContext, row, "context")


def decode_counts(row: p.Row) -> ExecutionCounts:
    """The six step counters of a row (read_count ... rollback_count)."""
    return _decode_counters(ExecutionCounts, row, _COUNT_COLUMNS)
