"""Row encoders the codec tests build step rows with (pybatch itself writes state through
its statements' parameters, never through these)."""

from __future__ import annotations

from pybatch._codecs._jsonb import to_jsonb
from pybatch._codecs.steps import _FAULT_COUNT_COLUMNS
from pybatch.values.counts import StepFaultCounts
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
