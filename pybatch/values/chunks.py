"""Chunk values: what a chunk did and the step progress it commits.

See docs/contract.md, State envelopes; Chunk transactions.
"""

from __future__ import annotations

import attrs

from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.ids import IdentifierKind, check_counter, check_identifier
from pybatch.values.ownership import OwnerToken
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus


def _count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int:
        raise TypeError(f"{attribute.name} is an int")
    check_counter(attribute.name, value)


@attrs.frozen
class ChunkContext:
    """Which step (of which job execution) a chunk belongs to, and who may commit it.

    `owner` (the execution's, or a partition worker's with its `partition_id`) must still own
    the step for a commit to land; without one the context only reads committed state.
    """

    step_execution_id: int
    job_execution_id: int
    owner: OwnerToken | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(OwnerToken))
    )
    partition_id: int | None = None

    def __attrs_post_init__(self) -> None:
        check_identifier(IdentifierKind.STEP_EXECUTION, self.step_execution_id)
        check_identifier(IdentifierKind.JOB_EXECUTION, self.job_execution_id)
        if self.partition_id is not None:
            check_identifier(IdentifierKind.STEP_PARTITION, self.partition_id)


@attrs.frozen(kw_only=True)
class ChunkCounts:
    """What one chunk did: items read, processed, written and filtered."""

    read: int = attrs.field(default=0, validator=_count)
    processed: int = attrs.field(default=0, validator=_count)
    written: int = attrs.field(default=0, validator=_count)
    filtered: int = attrs.field(default=0, validator=_count)


@attrs.frozen(kw_only=True)
class FaultProgress:
    """Skips and no-rollback retries of one chunk, added to the step's totals at commit."""

    read_skips: int = attrs.field(default=0, validator=_count)
    process_skips: int = attrs.field(default=0, validator=_count)
    write_skips: int = attrs.field(default=0, validator=_count)
    no_rollbacks: int = attrs.field(default=0, validator=_count)


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
