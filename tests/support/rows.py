"""Row encoders the codec tests build step rows with (pybatch itself writes state through
its statements' parameters, never through these)."""

from __future__ import annotations

from typing import TypeVar

from pybatch import UnitOfWork
from pybatch._codecs._jsonb import to_jsonb
from pybatch._codecs.steps import _FAULT_COUNT_COLUMNS
from pybatch.values.counts import StepFaultCounts
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.state import STATE_FORMAT_VERSION, Checkpoint, ExecutionContext


def encode_state(state: Checkpoint | ExecutionContext) -> dict[str, object]:
    """Column values of a checkpoint (`checkpoint_*`) or context (`context_*`); format is 1."""
    prefix = "checkpoint" if isinstance(state, Checkpoint) else "context"
    return {
        f"{prefix}_format": STATE_FORMAT_VERSION,
        f"{prefix}_schema": state.schema.value,
        f"{prefix}_schema_version": state.schema_version,
        f"{prefix}_payload": to_jsonb(state.payload),
    }


def encode_fault_counts(counts: StepFaultCounts) -> dict[str, object]:
    """Column values of the seven retry/skip/no-rollback counters of a step."""
    return {column: getattr(counts, field) for field, column in _FAULT_COUNT_COLUMNS}


Record = TypeVar("Record", JobExecution, StepExecution)
_EXIT_CODE = "UPDATE pybatch.{table} SET exit_code = %s, version = version + 1 WHERE id = %s"


def write_exit_code(uow: UnitOfWork, record: Record, exit_code: str) -> Record:
    """Give a job or step execution another exit code in `uow`, bumping its version; the record
    read back. pybatch writes an exit code only when a step or run ends (its status's name)."""
    with uow.operation() as conn:
        if isinstance(record, StepExecution):
            conn.execute(_EXIT_CODE.format(table="step_execution"), (exit_code, record.id))
            step = uow.steps.get(record.id)
            assert step is not None
            return step
        conn.execute(_EXIT_CODE.format(table="job_execution"), (exit_code, record.id))
        execution = uow.executions.get(record.id)
        assert execution is not None
        return execution
