"""The owner token tests run their chunks under.

A chunk commit proves that its owner still owns the step: the job execution's recorded owner
token for a step, the claiming worker's for a partition worker. Tests that build executions
through the unit of work claim `TEST_OWNER` while the execution is STARTING, and open chunks
with `owned_context`. pybatch itself never claims an existing row: its launch creates the
attempt claimed, in one statement (ownership.sql launch_job_execution).
"""

from __future__ import annotations

from datetime import datetime

from pybatch import errors as e
from pybatch._repository.ownership import owner_host
from pybatch._unit_of_work import UnitOfWork
from pybatch.values.chunks import ChunkContext
from pybatch.values.ids import aware_utc
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.status import BatchStatus

TEST_OWNER = OwnerToken(b"\x07" * 16)

#: Record the owner token and host of a STARTING execution and start its lease on the database
#: clock, without a version bump; the same token again is idempotent.
CLAIM = (
    "UPDATE pybatch.job_execution SET owner_token = %(owner_token)s,"
    " owner_host = %(owner_host)s, lease_expires_at = pg_catalog.clock_timestamp()"
    " + CAST(%(lease_ms)s AS BIGINT) * INTERVAL '1 millisecond',"
    " updated_at = GREATEST(updated_at, %(claimed_at)s) WHERE id = %(id)s"
    " AND version = %(version)s AND status = 'STARTING'"
    " AND (owner_token IS NULL OR owner_token = %(owner_token)s)"
)


def claim(
    uow: UnitOfWork,
    execution_id: int,
    expected_version: int,
    owner: OwnerToken,
    claimed_at: datetime,
    lease: ExecutionLease | None = None,
) -> JobExecution:
    """Claim a STARTING execution for `owner`; refused in order with JobExecutionNotFound,
    StaleVersion, ExecutionOwnershipNotAllowed (not STARTING), ExecutionOwned (another token)."""
    with uow.operation() as conn:
        params = {"id": execution_id, "version": expected_version, "owner_host": owner_host()}
        params |= {"owner_token": owner.value, "claimed_at": aware_utc(claimed_at)}
        params["lease_ms"] = (lease or ExecutionLease()).milliseconds
        changed = conn.execute(CLAIM, params).rowcount
        execution = uow.ownership.lock(execution_id)[0]
        if changed == 1:
            return execution
        if execution.version != expected_version:
            raise e.StaleVersion(expected=expected_version, actual=execution.version)
        if execution.status is not BatchStatus.STARTING:
            raise e.ExecutionOwnershipNotAllowed(id=execution_id, status=execution.status.value)
        raise e.ExecutionOwned(id=execution_id)


def claim_test_owner(uow: UnitOfWork, execution: JobExecution, at: datetime) -> JobExecution:
    """Record TEST_OWNER on a STARTING execution (its lease starts on the database clock)."""
    return claim(uow, execution.id, execution.version, TEST_OWNER, at)


def owned_context(step: StepExecution) -> ChunkContext:
    """The chunk context of `step`, owned by TEST_OWNER."""
    return ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
