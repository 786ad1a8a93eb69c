"""The owner token tests run their chunks under.

A chunk commit proves that its owner still owns the step: the job execution's recorded owner
token for a step, the claiming worker's for a partition worker. Tests that build executions
through the unit of work claim `TEST_OWNER` while the execution is STARTING, and open chunks
with `owned_context`.
"""

from __future__ import annotations

from datetime import datetime

from pybatch._unit_of_work import UnitOfWork
from pybatch.values.chunks import ChunkContext
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import JobExecution, StepExecution

TEST_OWNER = OwnerToken(b"\x07" * 16)


def claim_test_owner(uow: UnitOfWork, execution: JobExecution, at: datetime) -> JobExecution:
    """Record TEST_OWNER on a STARTING execution (its lease starts on the database clock)."""
    return uow.ownership.claim(execution.id, execution.version, TEST_OWNER, at)


def owned_context(step: StepExecution) -> ChunkContext:
    """The chunk context of `step`, owned by TEST_OWNER."""
    return ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
