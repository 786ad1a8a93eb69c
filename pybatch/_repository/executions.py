"""Job executions (queries/executions.sql): launch, restart, transitions, ends, reads."""

from __future__ import annotations

from pybatch._codecs._primitives import returned
from pybatch._codecs.executions import decode_job_execution
from pybatch._codecs.instances import decode_job_instance
from pybatch._repository import _lifecycle, steps
from pybatch._repository._capability import decided, execution_at, require_job_instance
from pybatch._repository._lifecycle import LifecycleCapability, LifecycleRows
from pybatch._repository.definitions import ensure_definition
from pybatch._statements import Connection, Row, Statements
from pybatch.errors import JobExecutionNotFound
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus, FailureReason


def definition_parameters(definition: DefinitionIdentity, definition_id: int | None = None) -> Row:
    """The parameters naming the definition a new attempt runs (`definition_of`, migration 0014)."""
    return {
        "definition_id": definition_id,
        "definition_job_name": None if definition.job_name is None else definition.job_name.value,
        "manifest_format": definition.manifest_format,
        "definition_revision": definition.revision.value,
        "manifest_digest": definition.digest,
    }


ROWS = LifecycleRows[JobExecution](
    kind=IdentifierKind.JOB_EXECUTION,
    id_parameter="job_execution_id",
    lock_statement=lambda q: q.lock_job_execution,
    get_statement=lambda q: q.get_job_execution,
    transition_statement=lambda q: q.update_job_execution_transition,
    decode=decode_job_execution,
    not_found=lambda execution_id: JobExecutionNotFound(id=execution_id),
    counts_apply=False,  # job executions carry no counters
)


def transition_job_execution(
    q: Statements,
    conn: Connection,
    execution_id: int,
    expected_version: int,
    transition: LifecycleTransition,
) -> JobExecution:
    """Apply a lifecycle transition (compare-and-swap) under the row lock.

    A finished execution also ends its unfinished steps and partition workers in the same
    transaction: ending an execution ends its ownership of everything under it.
    """
    ended = _lifecycle.transition(ROWS, q, conn, execution_id, expected_version, transition)
    if ended.status.is_finished:
        steps.end_unfinished_steps(q, conn, execution_id, ended.status, ended.updated_at)
    return ended


class Executions(LifecycleCapability[JobExecution]):
    _rows = ROWS

    def end(
        self,
        execution_id: int,
        owner: OwnerToken,
        status: BatchStatus,
        reason: FailureReason | None = None,
    ) -> JobExecution:
        """End `owner`'s running execution as `status`, its unfinished steps with it: one statement.

        Raises ExecutionOwnershipLost or IllegalTransition.
        """
        params = {
            "job_execution_id": execution_id,
            "owner_token": owner.value,
            "status": status.value,
            **_lifecycle.failure_reason_columns(reason),
            "now": self._uow.clock.now(),
        }
        return self._uow.commit_statement(
            self._uow.statements.end_job_execution,
            params,
            lambda row: decode_job_execution(decided(row, "ended")[1]),
        )

    def create(
        self, instance_id: int, definition: DefinitionIdentity = DefinitionIdentity.LEGACY
    ) -> JobExecution:
        """Launch the first attempt or restart a STOPPED/FAILED instance (STARTING, unclaimed).

        Raises, in this order: JobInstanceNotFound; CompletedInstance, AbandonedInstance or
        ExecutionAlreadyActive (latest attempt unresolved); the definition checks of
        `ensure_definition` (a new definition is registered here); IncompatibleDefinition (new
        digest without a direct edge).
        """
        check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
        definition_id: int | None = None
        with self._operation() as (q, conn):
            while True:
                row = returned(
                    q.create_job_execution.one(
                        conn,
                        job_instance_id=instance_id,
                        **definition_parameters(definition, definition_id),
                        now=self._uow.clock.now(),
                    )
                )
                if row["outcome"] != "JobInstanceNotFound":  # a corrupt instance is refused
                    created_at = row["instance_created_at"]
                    instance = decode_job_instance(
                        {**row, "id": row["instance_id"], "created_at": created_at}
                    )
                    execution_at(row, "previous_")  # as is the latest attempt
                if decided(row, "created", "unregistered")[0] == "created":
                    return decode_job_execution(row)
                clock = self._uow.clock
                definition_id = ensure_definition(q, conn, clock, instance.job_name, definition)

    def transition(
        self, record_id: int, expected_version: int, change: LifecycleTransition
    ) -> JobExecution:
        """Apply a lifecycle transition with a version compare-and-swap (its steps end with it)."""
        with self._operation() as (q, conn):
            return transition_job_execution(q, conn, record_id, expected_version, change)

    def of_instance(self, instance_id: int) -> list[JobExecution]:
        """Every attempt of an instance in attempt order (docs/contract.md, Reads)."""
        with self._operation() as (q, conn):
            require_job_instance(q, conn, instance_id)
            rows = q.list_job_executions.many(conn, job_instance_id=instance_id)
            return [decode_job_execution(row) for row in rows]
