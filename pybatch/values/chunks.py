"""What a chunk did and the step progress it commits (docs/contract.md, Chunk transactions)."""

from __future__ import annotations

import attrs

from pybatch.values.counts import ExecutionCounts, counter
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.ids import IdentifierKind, maybe
from pybatch.values.ownership import OwnerToken
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus


@attrs.frozen
class ChunkContext:
    """Which step (of which job execution) a chunk belongs to, and who may commit it.

    `owner` (the execution's, or a partition worker's with its `partition_id`) must still own
    the step for a commit to land; without one the context only reads committed state.
    """

    step_execution_id: int = attrs.field(validator=IdentifierKind.STEP_EXECUTION.validator)
    job_execution_id: int = attrs.field(validator=IdentifierKind.JOB_EXECUTION.validator)
    owner: OwnerToken | None = attrs.field(default=None, validator=maybe(OwnerToken))
    partition_id: int | None = attrs.field(
        default=None, validator=IdentifierKind.STEP_PARTITION.optional
    )


@attrs.frozen(kw_only=True)
class ChunkCounts:
    """What one chunk did: items read, processed, written and filtered."""

    read: int = attrs.field(default=0, validator=counter)
    processed: int = attrs.field(default=0, validator=counter)
    written: int = attrs.field(default=0, validator=counter)
    filtered: int = attrs.field(default=0, validator=counter)


@attrs.frozen(kw_only=True)
class FaultProgress:
    """Skips and no-rollback retries of one chunk, added to the step's totals at commit."""

    read_skips: int = attrs.field(default=0, validator=counter)
    process_skips: int = attrs.field(default=0, validator=counter)
    write_skips: int = attrs.field(default=0, validator=counter)
    no_rollbacks: int = attrs.field(default=0, validator=counter)


#: A chunk that skipped and retried nothing.
NO_FAULT_PROGRESS = FaultProgress()


@attrs.frozen(kw_only=True)
class CommittedStepState:
    """A step's last committed progress: where a chunk starts and a restart resumes."""

    step_execution_id: int
    job_execution_id: int
    status: BatchStatus
    version: int
    counts: ExecutionCounts
    checkpoint: Checkpoint
    context: ExecutionContext
    fault_state: FaultStateEnvelope
