"""Job executions (queries/executions.sql): launch, restart, transitions, enrichment, reads."""

from __future__ import annotations

from pybatch._codecs._jsonb import to_jsonb
from pybatch._codecs._primitives import returned
from pybatch._codecs.executions import decode_job_execution
from pybatch._codecs.instances import encode_identifying_parameters
from pybatch._repository import _lifecycle, instances, steps
from pybatch._repository._capability import require_job_instance
from pybatch._repository._lifecycle import LifecycleCapability, LifecycleRows
from pybatch._repository.definitions import ensure_definition
from pybatch._statements import Connection, Statements
from pybatch.errors import (
    AbandonedInstance,
    CompletedInstance,
    ExecutionAlreadyActive,
    IncompatibleDefinition,
    JobExecutionNotFound,
)
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import IdentifierKind
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus


def _refuse_latest(
    instance_id: int, latest: JobExecution | None, tombstone: BatchStatus | None
) -> None:
    """Launch check order, step 2: the latest attempt (or a purged one's tombstone) decides."""
    status, purged = (tombstone, True) if latest is None else (latest.status, False)
    if status is BatchStatus.COMPLETED:
        raise CompletedInstance(id=instance_id, purged=purged)
    if status is BatchStatus.ABANDONED:
        raise AbandonedInstance(id=instance_id, purged=purged)
    if latest is not None and latest.status.is_unresolved:
        raise ExecutionAlreadyActive(
            instance_id=instance_id, execution_id=latest.id, status=latest.status.value
        )


ROWS = LifecycleRows[JobExecution](
    kind=IdentifierKind.JOB_EXECUTION,
    id_parameter="job_execution_id",
    lock_statement=lambda q: q.lock_job_execution,
    get_statement=lambda q: q.get_job_execution,
    transition_statement=lambda q: q.update_job_execution_transition,
    exit_code_statement=lambda q: q.update_job_execution_exit_code,
    failure_reason_statement=lambda q: q.update_job_execution_failure_reason,
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

    def create(
        self, instance_id: int, definition: DefinitionIdentity = DefinitionIdentity.LEGACY
    ) -> JobExecution:
        """Launch the first attempt or restart a STOPPED/FAILED instance.

        Raises, in this order: JobInstanceNotFound; CompletedInstance, AbandonedInstance or
        ExecutionAlreadyActive (latest attempt unresolved); the definition checks of
        `ensure_definition`; IncompatibleDefinition (new digest without a direct edge).
        """
        with self._operation() as (q, conn):
            clock = self._uow.clock
            locked = instances.lock_job_instance(q, conn, instance_id)
            instance = locked.instance
            latest_row = q.find_latest_job_execution.one(conn, job_instance_id=instance_id)
            latest = None if latest_row is None else decode_job_execution(latest_row)
            _refuse_latest(instance_id, latest, locked.final_status)
            definition_id = ensure_definition(q, conn, clock, instance.job_name, definition)
            upgrade_from: int | None = None
            # Two definition rows of one job name never share a digest
            # (job_definition_digest_unique), so another row means another digest: a direct
            # edge must exist.
            if latest is not None and latest.definition_id != definition_id:
                edge = q.find_definition_upgrade.one(
                    conn, from_definition_id=latest.definition_id, to_definition_id=definition_id
                )
                if edge is None:
                    raise IncompatibleDefinition(instance_id=instance_id)
                upgrade_from = int(latest.definition_id)
            attempt = locked.last_attempt + 1
            instances.record_job_instance_attempt(q, conn, instance_id, attempt)
            row = q.insert_job_execution.one(
                conn,
                job_instance_id=instance_id,
                definition_id=definition_id,
                upgrade_from_definition_id=upgrade_from,
                restart_of_execution_id=None if latest is None else latest.id,
                attempt=attempt,
                parameters=to_jsonb(encode_identifying_parameters(instance.key)),
                now=clock.now(),
            )
            return decode_job_execution(returned(row))

    def transition(
        self, record_id: int, expected_version: int, transition: LifecycleTransition
    ) -> JobExecution:
        """Apply a lifecycle transition with a version compare-and-swap."""
        with self._operation() as (q, conn):
            return transition_job_execution(q, conn, record_id, expected_version, transition)

    def of_instance(self, instance_id: int) -> list[JobExecution]:
        """Every attempt of an instance in attempt order (docs/contract.md, Reads)."""
        with self._operation() as (q, conn):
            require_job_instance(q, conn, instance_id)
            rows = q.list_job_executions.many(conn, job_instance_id=instance_id)
            return [decode_job_execution(row) for row in rows]
