"""Plain step executions: create, restart copy, transitions, reads.

See docs/contract.md, Transitions and enrichment; Reads; Plain steps.

Statements come from queries/steps.sql; the upgrade mapping from queries/definitions.sql.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from pybatch._statements import Connection, Statements
from pybatch.codecs._jsonb import to_jsonb
from pybatch.codecs._primitives import decode_int64, decode_optional_int64, returned
from pybatch.codecs.executions import decode_job_execution
from pybatch.codecs.fault_state import encode_fault_state
from pybatch.codecs.steps import decode_step_execution
from pybatch.errors import (
    DuplicateStep,
    InvalidDefinitionUpgrade,
    RestartStateNotFound,
    StepExecutionNotFound,
)
from pybatch.repository import _lifecycle, definitions
from pybatch.repository._capability import Capability, job_execution_row
from pybatch.repository._lifecycle import LifecycleRows
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ExitCode, StepName
from pybatch.values.records import StepExecution
from pybatch.values.status import BatchStatus, FailureCategory


def _duplicate(job_execution_id: int, step_name: StepName, node_id: str) -> DuplicateStep:
    return DuplicateStep(
        job_execution_id=job_execution_id, step_name=step_name.value, node_id=node_id
    )


def duplicate_step_overrides(
    job_execution_id: int, step_name: StepName, node_id: str
) -> dict[str, Any]:
    """Report a concurrent duplicate caught by a unique constraint as DuplicateStep."""
    duplicate = partial(_duplicate, job_execution_id, step_name, node_id)
    return {"step_execution_name_unique": duplicate, "step_execution_logical_id_unique": duplicate}


def refuse_duplicate_step(
    q: Statements, conn: Connection, job_execution_id: int, step_name: StepName, node_id: str
) -> None:
    """Refuse a step whose name or node is already taken in the execution (DuplicateStep)."""
    names = {"job_execution_id": job_execution_id, "step_name": step_name.value}
    if q.find_conflicting_step_execution.one(conn, **names, node_id=node_id) is not None:
        raise _duplicate(job_execution_id, step_name, node_id)


def insert_step_execution(
    q: Statements,
    conn: Connection,
    job_execution_id: int,
    step_name: StepName,
    node_id: str,
    source_id: int | None,
    now: datetime,
) -> StepExecution:
    """Insert a STARTING step: a copy of `source_id`'s durable state, or fresh when None.

    A fresh step gets the empty fault-state envelope and its checksum written explicitly.
    """
    names = {"job_execution_id": job_execution_id, "step_name": step_name.value}
    if source_id is not None:
        row = q.insert_step_execution_from_source.one(
            conn, **names, node_id=node_id, source_step_execution_id=source_id, now=now
        )
    else:
        fault = encode_fault_state(FaultStateEnvelope.EMPTY)
        row = q.insert_step_execution.one(
            conn,
            **names,
            node_id=node_id,
            fault_state_payload=to_jsonb(fault["fault_state_payload"]),
            fault_state_checksum=fault["fault_state_checksum"],
            now=now,
        )
    step_id = decode_int64(returned(row)["id"], column="id", minimum=1)
    return decode_step_execution(
        returned(q.get_step_execution.one(conn, step_execution_id=step_id))
    )


_ROWS = LifecycleRows[StepExecution](
    kind=IdentifierKind.STEP_EXECUTION,
    id_parameter="step_execution_id",
    lock_statement=lambda q: q.lock_step_execution,
    transition_statement=lambda q: q.update_step_execution_transition,
    exit_code_statement=lambda q: q.update_step_execution_exit_code,
    decode=decode_step_execution,
    not_found=lambda step_id: StepExecutionNotFound(id=step_id),
    counts_apply=True,  # a transition's rollback advances rollback_count
)


def get_step_execution(q: Statements, conn: Connection, step_id: int) -> StepExecution | None:
    """One step execution, or None."""
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
    """
    # Waits for in-flight chunk commits and partition claims.
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
        """
        duplicate = duplicate_step_overrides(job_execution_id, step_name, step_name.value)
        with self._operation(overrides=duplicate) as (q, conn):
            # No step begins under a corrupt execution: the row is decoded in full.
            execution = decode_job_execution(job_execution_row(q, conn, job_execution_id))
            refuse_duplicate_step(q, conn, job_execution_id, step_name, step_name.value)
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
            now = self._uow.clock.now()
            return insert_step_execution(
                q, conn, job_execution_id, step_name, step_name.value, source_id, now
            )

    def transition(
        self, step_id: int, expected_version: int, transition: LifecycleTransition
    ) -> StepExecution:
        """Apply a lifecycle transition to a step under its row lock (compare-and-swap)."""
        with self._operation() as (q, conn):
            return _lifecycle.transition(_ROWS, q, conn, step_id, expected_version, transition)

    def enrich_exit_status(
        self, step_id: int, expected_version: int, exit_status: ExitCode
    ) -> StepExecution:
        """Replace a step's exit status in any status (docs/contract.md, Exit-status enrichment)."""
        with self._uow.operation() as conn:
            uow = self._uow
            return _lifecycle.enrich_exit_status(
                _ROWS, uow.statements, conn, uow.clock.now(), step_id, expected_version, exit_status
            )

    def get(self, step_id: int) -> StepExecution | None:
        """One step execution, or None (docs/contract.md, Reads)."""
        with self._uow.operation() as conn:
            return get_step_execution(self._uow.statements, conn, step_id)

    def of_execution(self, job_execution_id: int) -> list[StepExecution]:
        """The steps of a job execution in creation order (docs/contract.md, Reads)."""
        with self._operation() as (q, conn):
            job_execution_row(q, conn, job_execution_id)
            rows = q.list_step_executions.many(conn, job_execution_id=job_execution_id)
            return [decode_step_execution(row) for row in rows]
