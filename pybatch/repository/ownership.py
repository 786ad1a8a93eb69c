"""Execution ownership: owner claims, leases and control observation.

See docs/contract.md, Ownership and leases.

queries/ownership.sql. A runner claims its execution with a random owner token and a lease
on the database clock, renews the lease while it lives, and observes stop requests through
`observe_execution_control`. A launcher judges an unresolved execution orphaned only when
its lease ran out (`lock_execution_ownership`), so idle connections of a live runner may be
killed without the run losing its ownership, and no lock outside pybatch's rows is involved.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import psycopg

from pybatch._statements import Statements
from pybatch.codecs._primitives import DecodeError, decode_optional_int64
from pybatch.codecs.executions import decode_job_execution
from pybatch.errors import (
    ExecutionOwned,
    ExecutionOwnershipLost,
    ExecutionOwnershipNotAllowed,
    JobExecutionNotFound,
    StaleVersion,
)
from pybatch.repository._capability import Capability
from pybatch.repository._lifecycle import check_expected_version
from pybatch.repository.executions import transition_job_execution
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.ownership import ExecutionControl, ExecutionLease, LeaseState, OwnerToken
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus
from pybatch.values.timestamps import aware_utc

__all__ = ["Ownership", "legacy_liveness_lock_is_free", "lock_execution_ownership"]

Connection = psycopg.Connection[Any]


def _decode_lease(row: Any) -> tuple[JobExecution, LeaseState]:
    execution = decode_job_execution(row)
    token = row["owner_token"]
    expires = row["lease_expires_at"]
    if token is not None and len(bytes(token)) != 16:
        raise DecodeError("owner_token")
    if expires is not None and not isinstance(expires, _dt.datetime):
        raise DecodeError("lease_expires_at")
    expired, stop = row["lease_expired"], row["stop_requested"]
    if type(expired) is not bool or type(stop) is not bool:
        raise DecodeError("lease_expired")
    state = LeaseState(
        execution_id=execution.id,
        owner_token=None if token is None else OwnerToken(bytes(token)),
        lease_expires_at=None if expires is None else aware_utc(expires),
        lease_expired=expired,
        lease_remaining_ms=decode_optional_int64(
            row["lease_remaining_ms"], column="lease_remaining_ms", minimum=0
        ),
        stop_requested=stop,
    )
    return execution, state


def lock_execution_ownership(
    q: Statements, conn: Connection, execution_id: int
) -> tuple[JobExecution, LeaseState]:
    """Lock an execution and read it with its ownership evidence.

    Raises:
        JobExecutionNotFound: no such execution.

    Statements: ownership.sql lock_execution_ownership.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.lock_execution_ownership.one(conn, job_execution_id=execution_id)
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    return _decode_lease(row)


def legacy_liveness_lock_is_free(q: Statements, conn: Connection, execution_id: int) -> bool:
    """Whether nobody holds the advisory lock of a run started before leases existed.

    Runs on a dedicated autocommit connection; takes the lock and releases it at once.

    Statements: executions.sql try_lock_job_execution_liveness, unlock_job_execution_liveness.
    """
    if not q.try_lock_job_execution_liveness.scalar(conn, job_execution_id=execution_id):
        return False
    q.unlock_job_execution_liveness.scalar(conn, job_execution_id=execution_id)
    return True


class Ownership(Capability):
    """The ownership operations of one unit of work."""

    def claim(
        self,
        execution_id: int,
        expected_version: int,
        owner: OwnerToken,
        claimed_at: _dt.datetime,
        lease: ExecutionLease | None = None,
    ) -> JobExecution:
        """Record `owner` on a STARTING execution and start its lease; version unchanged.

        Raises (in this order): JobExecutionNotFound, StaleVersion,
            ExecutionOwnershipNotAllowed (not STARTING), ExecutionOwned (another token).

        Statements: ownership.sql claim_execution_owner, lock_execution_ownership.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            lease = lease or ExecutionLease()
            check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
            check_expected_version(expected_version)
            claimed_at = aware_utc(claimed_at)
            changed = q.claim_execution_owner.affected(
                conn,
                job_execution_id=execution_id,
                expected_version=expected_version,
                owner_token=owner.value,
                claimed_at=claimed_at,
                lease_ms=lease.milliseconds,
            )
            execution, _lease = lock_execution_ownership(q, conn, execution_id)
            if changed == 1:
                return execution
            if execution.version != expected_version:
                raise StaleVersion(expected=expected_version, actual=execution.version)
            if execution.status is not BatchStatus.STARTING:
                raise ExecutionOwnershipNotAllowed(id=execution_id, status=execution.status.value)
            raise ExecutionOwned(id=execution_id)

    def observe_control(
        self, execution_id: int, owner: OwnerToken, observed_at: _dt.datetime
    ) -> ExecutionControl:
        """Report ownership and stop flags; the owner's observation of a stop moves it to STOPPING.

        Raises:
            JobExecutionNotFound: no such execution.
            InvalidTransitionTime: `observed_at` precedes the execution's start.

        Statements: ownership.sql lock_execution_ownership; executions.sql lock_job_execution,
        update_job_execution_transition.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            execution, state = lock_execution_ownership(q, conn, execution_id)
            owner_matches = state.owner_token is not None and state.owner_token == owner
            if (
                owner_matches
                and state.stop_requested
                and execution.status in (BatchStatus.STARTING, BatchStatus.STARTED)
            ):
                execution = transition_job_execution(
                    q,
                    conn,
                    execution_id,
                    execution.version,
                    LifecycleTransition.new(BatchStatus.STOPPING, aware_utc(observed_at)),
                )
            return ExecutionControl(
                execution=execution,
                owner_matches=owner_matches,
                stop_requested=state.stop_requested,
            )

    def renew_lease(self, execution_id: int, owner: OwnerToken, lease: ExecutionLease) -> bool:
        """Extend the owner's lease; return whether a stop was requested.

        Raises:
            ExecutionOwnershipLost: the execution is finished, recovered or owned by another token.

        Statements: ownership.sql renew_execution_lease.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            row = q.renew_execution_lease.one(
                conn,
                job_execution_id=execution_id,
                owner_token=owner.value,
                lease_ms=lease.milliseconds,
            )
            if row is None:
                raise ExecutionOwnershipLost(id=execution_id)
            stop = row["stop_requested"]
            if type(stop) is not bool:
                raise DecodeError("stop_requested")
            return stop

    def verify_owner(self, execution_id: int, owner: OwnerToken) -> JobExecution:
        """Lock the execution and confirm `owner` still runs it (token recorded, unresolved).

        Raises:
            ExecutionOwnershipLost: another token, no token, or the execution is resolved.

        Statements: ownership.sql lock_execution_ownership.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            try:
                execution, state = lock_execution_ownership(q, conn, execution_id)
            except JobExecutionNotFound:
                raise ExecutionOwnershipLost(id=execution_id) from None
            if state.owner_token != owner or not execution.status.is_active:
                raise ExecutionOwnershipLost(id=execution_id)
            return execution

    def lock(self, execution_id: int) -> tuple[JobExecution, LeaseState]:
        """Lock an execution and read its ownership evidence (token, lease, stop flag)."""
        with self._uow.operation() as conn:
            return lock_execution_ownership(self._uow.statements, conn, execution_id)
