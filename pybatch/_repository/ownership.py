"""Ownership and leases of job executions and of claimed partitions: the one home.

queries/ownership.sql; the rules are docs/contract.md, Ownership and leases. The lease on the
database clock is the only authority (`LeaseState.owner_gone`, `StartedPartition.worker_gone`):
no advisory lock, so no role that can connect can block a recovery by holding a lock key. Every
write of an owner is fenced by its token in its own predicate.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import socket
from typing import Any

import attrs

from pybatch import errors as e
from pybatch._codecs import _primitives as p
from pybatch._codecs.executions import decode_job_execution
from pybatch._codecs.instances import encode_job_instance_key
from pybatch._repository._capability import Capability, decided, execution_at
from pybatch._repository.executions import definition_parameters, transition_job_execution
from pybatch._repository.partitions import corrupt_on
from pybatch._statements import Connection, Row, Statements
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import IdentifierKind, JobInstanceId, aware_utc, check_identifier
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.ownership import ExecutionControl, ExecutionLease, LeaseState, OwnerToken
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.records import JobExecution, JobInstance
from pybatch.values.status import BatchStatus


def lock_execution_ownership(
    q: Statements, conn: Connection, execution_id: int
) -> tuple[JobExecution, LeaseState]:
    """Lock an execution and read it with its ownership evidence (JobExecutionNotFound)."""
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.lock_execution_ownership.one(conn, job_execution_id=execution_id)
    if row is None:
        raise e.JobExecutionNotFound(id=execution_id)
    return execution_ownership(row)


def execution_ownership(row: Row) -> tuple[JobExecution, LeaseState]:
    """An execution and its ownership evidence, decoded from one row."""
    execution = decode_job_execution(row)
    token: Any = row["owner_token"]
    expires = row["lease_expires_at"]
    if token is not None and len(bytes(token)) != 16:
        raise p.DecodeError("owner_token")
    if expires is not None and not isinstance(expires, _dt.datetime):
        raise p.DecodeError("lease_expires_at")
    state = LeaseState(
        execution_id=execution.id,
        owner_token=None if token is None else OwnerToken(bytes(token)),
        lease_expires_at=None if expires is None else aware_utc(expires),
        lease_expired=p.bool_at(row, "lease_expired"),
        lease_remaining_ms=p.optional_int64_at(row, "lease_remaining_ms", 0),
        stop_requested=p.bool_at(row, "stop_requested"),
    )
    return execution, state


def owner_host() -> str:
    """This process as `host:pid`, for operators only (job_execution_owner_host_format)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:200] or "unknown"
    return f"{host}:{os.getpid()}"


#: What a launch found: the new attempt's instance and execution; the unresolved attempt in
#: the way and its lease (judged on the database clock); or neither (register the definition).
Launch = tuple[JobInstance | None, JobExecution | None, LeaseState | None]


@attrs.frozen
class StartedPartition:
    """A partition being worked on, with its worker's ownership evidence: enough to recover it."""

    id: int
    key: str
    worker_step_execution_id: int
    version: int
    #: Whether the partition has a lease (every claim starts one).
    leased: bool
    #: The lease ran out on the database clock when the row was read (False without a lease).
    lease_expired: bool

    @property
    def worker_gone(self) -> bool:
        """The lease alone decides: its worker is gone when it ran out, or there is none."""
        return not self.leased or self.lease_expired


class Ownership(Capability):
    """The ownership operations of one unit of work, for executions and for partitions."""

    def launch(
        self,
        key: JobInstanceKey,
        definition: DefinitionIdentity,
        owner: OwnerToken,
        lease: ExecutionLease,
        definition_id: int | None = None,
    ) -> Launch:
        """Launch or restart the instance of `key`, STARTED and claimed by `owner`: one statement.

        `definition_id`: the definition's, once registered after a launch found none. Raises
        `Executions.create`'s refusals but ExecutionAlreadyActive (returned with its lease),
        ConcurrentModification (a purge removed the instance meanwhile), Unavailable (the
        stored parameters are not the key's). Nothing is written unless it launched.
        Statements: ownership.sql launch_job_execution (migrations/0014).
        """
        columns = encode_job_instance_key(key)

        def decode(row: Row | None) -> Launch:
            values = p.returned(row)
            execution_at(values, "previous_")  # a corrupt latest attempt refuses it
            if values["outcome"] == "ExecutionAlreadyActive":
                return (None, *execution_ownership(values))
            if decided(row, "launched", "unregistered")[0] == "unregistered":
                return None, None, None
            instance = JobInstance(
                id=JobInstanceId(p.int64_at(values, "instance_id")),
                job_name=key.job_name,
                instance_key=key.digest(),
                created_at=p.aware_at(values, "instance_created_at"),
                parameters=key.parameters,
            )
            return instance, decode_job_execution(values), None

        params = {
            **columns,
            **definition_parameters(definition, definition_id),
            "owner_token": owner.value,
            "owner_host": owner_host(),
            "lease_ms": lease.milliseconds,
            "now": self._uow.clock.now(),
        }
        return self._uow.commit_statement(self._uow.statements.launch_job_execution, params, decode)

    def observe_control(
        self, execution_id: int, owner: OwnerToken, observed_at: _dt.datetime
    ) -> ExecutionControl:
        """Report ownership and stop flags; the owner observing a stop moves it to STOPPING."""
        with self._operation() as (q, conn):
            execution, state = lock_execution_ownership(q, conn, execution_id)
            owner_matches = state.owner_token is not None and state.owner_token == owner
            if (
                owner_matches
                and state.stop_requested
                and execution.status in (BatchStatus.STARTING, BatchStatus.STARTED)
            ):
                stopping = LifecycleTransition.new(BatchStatus.STOPPING, aware_utc(observed_at))
                execution = transition_job_execution(
                    q, conn, execution_id, execution.version, stopping
                )
            return ExecutionControl(
                execution=execution,
                owner_matches=owner_matches,
                stop_requested=state.stop_requested,
            )

    def renew_lease(self, execution_id: int, owner: OwnerToken, lease: ExecutionLease) -> bool:
        """Extend the owner's lease; return whether a stop was requested.

        ExecutionOwnershipLost when the execution is finished, recovered or another token's.
        """
        with self._operation() as (q, conn):
            row = q.renew_execution_lease.one(
                conn,
                job_execution_id=execution_id,
                owner_token=owner.value,
                lease_ms=lease.milliseconds,
            )
            if row is None:
                raise e.ExecutionOwnershipLost(id=execution_id)
            return p.bool_at(row, "stop_requested")

    def verify_owner(self, execution_id: int, owner: OwnerToken) -> JobExecution:
        """Lock the execution and confirm `owner` still runs it (else ExecutionOwnershipLost)."""
        with self._operation() as (q, conn):
            try:
                execution, state = lock_execution_ownership(q, conn, execution_id)
            except e.JobExecutionNotFound:
                raise e.ExecutionOwnershipLost(id=execution_id) from None
            if state.owner_token != owner or not execution.status.is_active:
                raise e.ExecutionOwnershipLost(id=execution_id)
            return execution

    def lock(self, execution_id: int) -> tuple[JobExecution, LeaseState]:
        """Lock an execution and read its ownership evidence (token, lease, stop flag)."""
        with self._operation() as (q, conn):
            return lock_execution_ownership(q, conn, execution_id)

    def renew_partition_lease(
        self, partition_id: int, worker_id: int, owner: OwnerToken, lease: ExecutionLease
    ) -> None:
        """Extend the lease `owner` holds on a STARTED partition worked on by `worker_id`.

        PartitionOwnershipLost when the partition was recovered, ended, or is another token's:
        the worker must stop without touching it.
        """
        with self._operation() as (q, conn):
            check_identifier(IdentifierKind.STEP_PARTITION, partition_id)
            check_identifier(IdentifierKind.STEP_EXECUTION, worker_id)
            changed = q.renew_partition_worker_lease.affected(
                conn,
                step_partition_id=partition_id,
                worker_step_execution_id=worker_id,
                owner_token=owner.value,
                lease_ms=lease.milliseconds,
            )
            if changed != 1:
                raise e.PartitionOwnershipLost(partition_id=partition_id, worker=worker_id)

    def started_partitions(self, parent_id: int) -> list[StartedPartition]:
        """The STARTED partitions of a plan with their workers and leases (no lock taken)."""
        with self._operation() as (q, conn):
            check_identifier(IdentifierKind.STEP_EXECUTION, parent_id)
            rows = q.list_started_step_partitions.many(conn, step_execution_id=parent_id)
            with corrupt_on():
                return [
                    StartedPartition(
                        p.int64_at(row, "id"),
                        p.text_at(row, "partition_key"),
                        p.int64_at(row, "worker_step_execution_id"),
                        p.int64_at(row, "version", 0),
                        p.bool_at(row, "leased"),
                        p.bool_at(row, "lease_expired"),
                    )
                    for row in rows
                ]
