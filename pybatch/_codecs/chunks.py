"""Chunk state: a step's committed progress row, and the parameters of chunks.sql's writes."""

from __future__ import annotations

from datetime import datetime

import attrs

from pybatch._codecs import _primitives as p
from pybatch._codecs import steps
from pybatch._codecs._jsonb import CanonicalJsonb
from pybatch._codecs.fault_state import FAULT_STATE_COLUMNS, decode_fault_state
from pybatch.errors import FaultStateCorrupt, FaultStateFormatError, PyBatchError, Unavailable
from pybatch.values.chunks import ChunkContext, CommittedStepState, FaultProgress
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus


def _canonical_jsonb(canonical: bytes) -> CanonicalJsonb:
    """Bind JSON bytes that are already canonical as jsonb, without parsing and re-encoding."""
    return CanonicalJsonb(canonical, dumps=bytes)


#: The empty fault state's parameters, encoded once: every chunk commit writes it, and so does
#: every partition claim for its fresh worker.
EMPTY_FAULT_STATE_PARAMETERS = {
    "fault_state_payload": _canonical_jsonb(FaultStateEnvelope.EMPTY.canonical_bytes()),
    "fault_state_checksum": FaultStateEnvelope.EMPTY.checksum(),
}


#: Columns `decode_committed_step_state` reads.
COMMITTED_STEP_STATE_COLUMNS = (
    *("id", "job_execution_id", "status", "version", *steps.COUNT_COLUMNS),
    *(*steps.CHECKPOINT_COLUMNS, *steps.CONTEXT_COLUMNS, *FAULT_STATE_COLUMNS),
)


def decode_committed_step_state(row: p.Row) -> CommittedStepState:
    """Decode a get_step_chunk_state row: FaultStateCorrupt stops all work, else Unavailable."""
    row = p.row_columns(row, COMMITTED_STEP_STATE_COLUMNS)
    try:
        fault_state = decode_fault_state(row)
    except (FaultStateFormatError, ValueError, TypeError):
        raise FaultStateCorrupt() from None
    try:
        return CommittedStepState(
            step_execution_id=p.int64_at(row, "id"),
            job_execution_id=p.int64_at(row, "job_execution_id"),
            status=p.enum_at(BatchStatus, row, "status"),
            version=p.int64_at(row, "version", 0),
            counts=steps.decode_counts(row),
            checkpoint=steps.decode_checkpoint(row),
            context=steps.decode_context(row),
            fault_state=fault_state,
        )
    except (p.DecodeError, PyBatchError):
        raise Unavailable() from None


def encode_chunk_fence(fence: ChunkContext) -> dict[str, object]:
    """The step, its execution and owner (and partition) every chunk write binds: once a session."""
    params: dict[str, object] = {
        "step_execution_id": fence.step_execution_id,
        "job_execution_id": fence.job_execution_id,
        "owner_token": None if fence.owner is None else fence.owner.value,
    }
    if fence.partition_id is not None:
        params["step_partition_id"] = fence.partition_id
    return params


def encode_chunk_commit(
    fence: dict[str, object],
    expected_version: int,
    counts: tuple[int, ...],
    checkpoint: Checkpoint,
    state_context: ExecutionContext,
    progress: FaultProgress,
    now: datetime,
) -> dict[str, object]:
    """The parameters of update_step_chunk_commit: states go as the canonical bytes hashed."""
    return {
        **encode_chunk_progress(fence, expected_version, counts, checkpoint, now),
        "context_schema": state_context.schema.value,
        "context_schema_version": state_context.schema_version,
        "context_payload": _canonical_jsonb(state_context.payload_json()),
        **attrs.asdict(progress),  # read_skips, process_skips, write_skips, no_rollbacks
        **EMPTY_FAULT_STATE_PARAMETERS,
    }


def encode_chunk_progress(
    fence: dict[str, object],
    expected_version: int,
    counts: tuple[int, ...],
    checkpoint: Checkpoint,
    now: datetime,
) -> dict[str, object]:
    """update_step_chunk_progress's parameters; `counts` in ExecutionCounts' field order."""
    read, processed, written, filtered, committed, _ = counts
    return {
        **fence,
        "read_count": read,
        "processed_count": processed,
        "write_count": written,
        "filter_count": filtered,
        "commit_count": committed,
        "now": now,
        "checkpoint_schema": checkpoint.schema.value,
        "checkpoint_schema_version": checkpoint.schema_version,
        "checkpoint_payload": _canonical_jsonb(checkpoint.payload_json()),
        "expected_version": expected_version,
    }


def encode_chunk_rollback(fence: dict[str, object], now: datetime) -> dict[str, object]:
    """update_step_chunk_rollback's parameters: the session's encoded fence and the instant."""
    return {**fence, "now": now}
