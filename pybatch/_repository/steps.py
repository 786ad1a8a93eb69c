"""Step executions (queries/steps.sql): transitions, ends, reads."""

from __future__ import annotations

from datetime import datetime
from functools import partial

from pybatch._codecs._primitives import decode_int64, returned
from pybatch._codecs.steps import decode_step_execution
from pybatch._repository import _lifecycle
from pybatch._repository._capability import Overrides, decided, job_execution_row
from pybatch._statements import Connection, Statements
from pybatch.errors import DuplicateStep, StepExecutionNotFound
from pybatch.values.ids import IdentifierKind
from pybatch.values.names import StepName
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import StepExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureReason


def duplicate_step_overrides(job_execution_id: int, step_name: StepName, node_id: str) -> Overrides:
    """Report a concurrent duplicate caught by a unique constraint as DuplicateStep."""
    duplicate = partial(
        DuplicateStep, job_execution_id=job_execution_id, step_name=step_name.value, node_id=node_id
    )
    return {"step_execution_name_unique": duplicate, "step_execution_logical_id_unique": duplicate}


ROWS = _lifecycle.LifecycleRows[StepExecution](
    kind=IdentifierKind.STEP_EXECUTION,
    id_parameter="step_execution_id",
    lock_statement=lambda q: q.lock_step_execution,
    get_statement=lambda q: q.get_step_execution,
    transition_statement=lambda q: q.update_step_execution_transition,
    decode=decode_step_execution,
    not_found=lambda step_id: StepExecutionNotFound(id=step_id),
    counts_apply=True,  # a transition's rollback advances rollback_count
)


def end_unfinished_steps(
    q: Statements,
    conn: Connection,
    job_execution_id: int,
    execution_status: BatchStatus,
    ended_at: datetime,
    category: FailureCategory = FailureCategory.CANCELLED,
) -> int:
    """End every unfinished step (and partition worker) of an ending execution; return how many.

    In the transaction that finishes the execution, so the next chunk commit of any of them is
    refused (its compare-and-swap wants STARTED) and a restart copies a checkpoint nobody can
    move any more. Steps end STOPPED when the execution stops, else FAILED with `category`;
    the statement waits for in-flight chunk commits and partition claims first.
    """
    stopped = execution_status is BatchStatus.STOPPED
    row = q.end_unfinished_step_executions.one(
        conn,
        job_execution_id=job_execution_id,
        status=BatchStatus.STOPPED.value if stopped else BatchStatus.FAILED.value,
        failure_category=None if stopped else category.value,
        ended_at=ended_at,
    )
    return decode_int64(returned(row)["ended_steps"], column="ended_steps", minimum=0)


class Steps(_lifecycle.LifecycleCapability[StepExecution]):
    _rows = ROWS

    def end(
        self,
        job_execution_id: int,
        owner: OwnerToken,
        step_id: int,
        status: BatchStatus,
        reason: FailureReason | None = None,
    ) -> StepExecution:
        """End a step of `owner`'s running execution as `status`: one statement.

        Raises ExecutionOwnershipLost, StepExecutionNotFound or IllegalTransition.
        """
        params = {
            "job_execution_id": job_execution_id,
            "owner_token": owner.value,
            "step_execution_id": step_id,
            "status": status.value,
            **_lifecycle.failure_reason_columns(reason),
            "now": self._uow.clock.now(),
        }
        return self._uow.commit_statement(
            self._uow.statements.end_step_execution,
            params,
            lambda row: decode_step_execution(decided(row, "ended")[1]),
            wait_for_flush=False,  # the run's next waiting commit carries it (docs/contract.md)
        )

    def of_execution(self, job_execution_id: int) -> list[StepExecution]:
        """The steps of a job execution in creation order (docs/contract.md, Reads)."""
        with self._operation() as (q, conn):
            job_execution_row(q, conn, job_execution_id)
            rows = q.list_step_executions.many(conn, job_execution_id=job_execution_id)
            return [decode_step_execution(row) for row in rows]
