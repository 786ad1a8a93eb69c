"""Plain step executions: create, restart copy, transitions, reads.

See docs/contract.md, Transitions and enrichment; Reads; Plain steps.

Statements come from queries/steps.sql; the upgrade mapping from queries/definitions.sql.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pybatch._statements import Connection, Statements
from pybatch.codecs._jsonb import to_jsonb
from pybatch.codecs._primitives import decode_int64, decode_optional_int64, returned
from pybatch.codecs.executions import decode_job_execution
from pybatch.codecs.fault_state import encode_fault_state
from pybatch.codecs.lifecycle import encode_execution_metadata
from pybatch.codecs.steps import decode_step_execution
from pybatch.errors import (
    DuplicateStep,
    InvalidDefinitionUpgrade,
    JobExecutionNotFound,
    PyBatchError,
    RestartStateNotFound,
    StepExecutionNotFound,
)
from pybatch.repository import _lifecycle, definitions
from pybatch.repository._capability import Capability
from pybatch.repository._lifecycle import LifecycleRows
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata, LifecycleTransition
from pybatch.values.names import ExitCode, StepName
from pybatch.values.records import StepExecution
from pybatch.values.status import BatchStatus, FailureCategory


def duplicate_step_overrides(
    job_execution_id: int, step_name: StepName, node_id: str
) -> dict[str, Any]:
    """Report a concurrent duplicate caught by a unique constraint as DuplicateStep."""

    def duplicate() -> PyBatchError:
        return DuplicateStep(
            job_execution_id=job_execution_id, step_name=step_name.value, node_id=node_id
        )

    return {
        "step_execution_name_unique": duplicate,
        "step_execution_logical_id_unique": duplicate,
    }


def insert_step_execution(
    q: Statements,
    conn: Connection,
    job_execution_id: int,
    step_name: StepName,
    node_id: str,
    source_id: int | None,
    now: datetime,
) -> int:
    """Insert a STARTING step: a copy of `source_id`'s durable state, or fresh when None.

    A fresh step gets the empty fault-state envelope and its checksum written explicitly.

    Statements: steps.sql insert_step_execution, insert_step_execution_from_source.
    """
    names = {"job_execution_id": job_execution_id, "step_name": step_name.value}
    if source_id is not None:
        row = q.insert_step_execution_from_source.one(
            conn, **names, node_id=node_id, source_step_execution_id=source_id, now=now
        )
        return decode_int64(returned(row)["id"], column="id", minimum=1)
    fault = encode_fault_state(FaultStateEnvelope.EMPTY)
    row = q.insert_step_execution.one(
        conn,
        **names,
        node_id=node_id,
        fault_state_payload=to_jsonb(fault["fault_state_payload"]),
        fault_state_checksum=fault["fault_state_checksum"],
        now=now,
    )
    return decode_int64(returned(row)["id"], column="id", minimum=1)


def _lock(q: Statements, conn: Connection, step_id: int) -> StepExecution:
    check_identifier(IdentifierKind.STEP_EXECUTION, step_id)
    row = q.lock_step_execution.one(conn, step_execution_id=step_id)
    if row is None:
        raise StepExecutionNotFound(id=step_id)
    return decode_step_execution(row)


def _write_transition(
    q: Statements,
    conn: Connection,
    step_id: int,
    expected_version: int,
    metadata: ExecutionMetadata,
    at: datetime,
) -> int:
    columns = encode_execution_metadata(metadata)
    del columns["exit_code"]  # transitions never change the exit status
    return q.update_step_execution_transition.affected(
        conn,
        **columns,
        rollback_count=metadata.counts.rolled_back,
        transitioned_at=at,
        step_execution_id=step_id,
        expected_version=expected_version,
    )


def _write_exit_status(
    q: Statements,
    conn: Connection,
    step_id: int,
    expected_version: int,
    exit_status: ExitCode,
    now: datetime,
) -> int:
    return q.update_step_execution_exit_code.affected(
        conn,
        exit_code=exit_status.value,
        now=now,
        step_execution_id=step_id,
        expected_version=expected_version,
    )


def _step_execution_not_found(step_id: int) -> StepExecutionNotFound:
    return StepExecutionNotFound(id=step_id)


_ROWS = LifecycleRows[StepExecution](
    lock=_lock,
    get=lambda q, conn, step_id: get_step_execution(q, conn, step_id),
    not_found=_step_execution_not_found,
    write_transition=_write_transition,
    write_exit_status=_write_exit_status,
    counts_apply=True,  # a transition's rollback advances rollback_count
)


def get_step_execution(q: Statements, conn: Connection, step_id: int) -> StepExecution | None:
    """One step execution, or None (statements: steps.sql get_step_execution)."""
    check_identifier(IdentifierKind.STEP_EXECUTION, step_id)
    row = q.get_step_execution.one(conn, step_execution_id=step_id)
    return None if row is None else decode_step_execution(row)


def end_unfinished_steps(
    q: Statements,
    conn: Connection,
    job_execution_id: int,
    execution_status: BatchStatus,
    ended_at: datetime,
    category: FailureCategory = FailureCategory.CANCELLED,
) -> int:
    """End every unfinished step of an execution that is ending; return how many.

    Called in the transaction that moves the execution to a finished status, so no step, no
    partitioned parent and no partition worker on any host stays STARTED under it: the next
    chunk commit of any of them is refused (its compare-and-swap wants STARTED), and a restart
    copies a checkpoint nobody can move any more. Steps end STOPPED when the execution stops,
    otherwise FAILED with `category`. The partitions their workers held are released with them.

    Statements: steps.sql lock_unfinished_step_executions (waits for in-flight chunk commits and
    partition claims), end_unfinished_step_executions.
    """
    q.lock_unfinished_step_executions.many(conn, job_execution_id=job_execution_id)
    stopped = execution_status is BatchStatus.STOPPED
    row = q.end_unfinished_step_executions.one(
        conn,
        job_execution_id=job_execution_id,
        status=BatchStatus.STOPPED.value if stopped else BatchStatus.FAILED.value,
        failure_category=None if stopped else category.value,
        ended_at=ended_at,
    )
    return decode_int64(returned(row)["ended_steps"], column="ended_steps", minimum=0)


class Steps(Capability):
    """The steps operations of one unit of work."""

    def create(self, job_execution_id: int, step_name: StepName) -> StepExecution:
        """Create a step; in a restart attempt copy its source's durable state.

        Raises:
            JobExecutionNotFound: no such job execution.
            DuplicateStep: the name or logical id is taken in this execution.
            InvalidDefinitionUpgrade: an upgraded restart has no mapping entry for the step.
            RestartStateNotFound: the previous attempt has no source step.

        Statements: executions.sql get_job_execution; steps.sql find_conflicting_step_execution,
        find_restart_source_step_execution, insert_step_execution(_from_source),
        get_step_execution; definitions.sql find_upgrade_source_step_name.
        """
        duplicate = duplicate_step_overrides(job_execution_id, step_name, step_name.value)
        with self._uow.operation(overrides=duplicate) as conn:
            q = self._uow.statements
            clock = self._uow.clock
            check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
            row = q.get_job_execution.one(conn, job_execution_id=job_execution_id)
            if row is None:
                raise JobExecutionNotFound(id=job_execution_id)
            execution = decode_job_execution(row)  # no step begins under a corrupt execution
            names = {"job_execution_id": job_execution_id, "step_name": step_name.value}
            if (
                q.find_conflicting_step_execution.one(conn, **names, node_id=step_name.value)
                is not None
            ):
                raise DuplicateStep(
                    job_execution_id=job_execution_id,
                    step_name=step_name.value,
                    node_id=step_name.value,
                )
            previous = execution.restart_of_execution_id
            source_id: int | None = None
            if previous is not None:
                source_name = step_name.value
                if execution.upgrade_from_definition_id is not None:
                    mapped = definitions.upgrade_source_step_name(
                        q, conn, job_execution_id, step_name
                    )
                    if mapped is None:
                        raise InvalidDefinitionUpgrade(execution_id=job_execution_id)
                    source_name = mapped
                source_id = decode_optional_int64(
                    q.find_restart_source_step_execution.scalar(
                        conn, previous_job_execution_id=previous, source_step_name=source_name
                    ),
                    column="id",
                    minimum=1,
                )
                if source_id is None:
                    raise RestartStateNotFound(
                        execution_id=job_execution_id, step_name=step_name.value
                    )
            step_id = insert_step_execution(
                q, conn, job_execution_id, step_name, step_name.value, source_id, clock.now()
            )
            return decode_step_execution(
                returned(q.get_step_execution.one(conn, step_execution_id=step_id))
            )

    def transition(
        self, step_id: int, expected_version: int, transition: LifecycleTransition
    ) -> StepExecution:
        """Apply a lifecycle transition to a step under its row lock.

        See docs/contract.md, Transitions and enrichment.

        Statements: steps.sql lock_step_execution, update_step_execution_transition (and
        get_step_execution when the swap loses).
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            return _lifecycle.transition(_ROWS, q, conn, step_id, expected_version, transition)

    def enrich_exit_status(
        self, step_id: int, expected_version: int, exit_status: ExitCode
    ) -> StepExecution:
        """Replace a step's exit status in any status (docs/contract.md, Exit-status enrichment).

        Statements: steps.sql lock_step_execution, update_step_execution_exit_code.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            clock = self._uow.clock
            return _lifecycle.enrich_exit_status(
                _ROWS, q, conn, clock.now(), step_id, expected_version, exit_status
            )

    def get(self, step_id: int) -> StepExecution | None:
        """One step execution, or None (docs/contract.md, Reads)."""
        with self._uow.operation() as conn:
            return get_step_execution(self._uow.statements, conn, step_id)

    def of_execution(self, job_execution_id: int) -> list[StepExecution]:
        """The steps of a job execution in creation order (docs/contract.md, Reads).

        Statements: executions.sql get_job_execution; steps.sql list_step_executions.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
            if q.get_job_execution.one(conn, job_execution_id=job_execution_id) is None:
                raise JobExecutionNotFound(id=job_execution_id)
            rows = q.list_step_executions.many(conn, job_execution_id=job_execution_id)
            return [decode_step_execution(row) for row in rows]
