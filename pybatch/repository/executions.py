"""Job executions: launch, restart, transitions, enrichment, reads (behaviour.md 4.3-4.5).

Statements come from queries/executions.sql; the instance lock from queries/instances.sql.
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from pybatch._statements import Statements
from pybatch.clock import Clock
from pybatch.codecs._jsonb import to_jsonb
from pybatch.codecs._primitives import decode_enum
from pybatch.codecs.executions import (
    decode_job_execution,
    decode_job_instance,
    encode_execution_metadata,
    encode_identifying_parameters,
)
from pybatch.errors import (
    AbandonedInstance,
    CompletedInstance,
    ConcurrentModification,
    ExecutionAlreadyActive,
    IncompatibleDefinition,
    JobExecutionNotFound,
    JobInstanceNotFound,
    StaleVersion,
    Unavailable,
    VersionOutOfRange,
)
from pybatch.repository.definitions import ensure_definition
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import INT64_MAX, IdentifierKind, check_identifier, check_version
from pybatch.values.lifecycle import LifecycleTransition, apply_exit_enrichment, apply_transition
from pybatch.values.names import ExitCode
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus

__all__ = [
    "check_expected_version",
    "create_job_execution",
    "enrich_job_exit_status",
    "get_job_execution",
    "job_executions",
    "transition_job_execution",
]

Connection = psycopg.Connection[Any]


def _refuse_latest(instance_id: int, latest: JobExecution | None, tombstone: Any) -> None:
    """Launch check order, step 2: the latest attempt decides (behaviour.md 4.3)."""
    if latest is None:
        if tombstone is not None:
            status = decode_enum(BatchStatus, tombstone, column="final_status")
            if status is BatchStatus.COMPLETED:
                raise CompletedInstance(id=instance_id, purged=True)
            if status is BatchStatus.ABANDONED:
                raise AbandonedInstance(id=instance_id, purged=True)
        return
    status = latest.status
    if status is BatchStatus.COMPLETED:
        raise CompletedInstance(id=instance_id)
    if status is BatchStatus.ABANDONED:
        raise AbandonedInstance(id=instance_id)
    if status.is_unresolved:
        raise ExecutionAlreadyActive(
            instance_id=instance_id, execution_id=latest.id, status=status.value
        )


def create_job_execution(
    q: Statements,
    conn: Connection,
    clock: Clock,
    instance_id: int,
    definition: DefinitionIdentity,
) -> JobExecution:
    """Launch the first attempt or restart a STOPPED/FAILED instance (behaviour.md 4.3).

    Raises:
        JobInstanceNotFound: no such instance.
        CompletedInstance, AbandonedInstance: the latest attempt is terminal.
        ExecutionAlreadyActive: the latest attempt is STARTING, STARTED, STOPPING or UNKNOWN.
        DefinitionJobMismatch, UnsupportedManifestVersion, DefinitionDrift: definition checks,
            run only after the status check (rule 2).
        IncompatibleDefinition: a restart changed the digest without a direct edge.

    Statements: instances.sql lock_job_instance, update_job_instance_last_attempt;
    executions.sql find_latest_job_execution, insert_job_execution; definitions.sql
    find_definition_upgrade (and ensure's statements).
    """
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    # Lock order - the instance row first: it serializes launches and restarts (rule 1).
    row = q.lock_job_instance(conn, job_instance_id=instance_id)
    if row is None:
        raise JobInstanceNotFound(id=instance_id)
    # Fail closed (behaviour.md 6.3): a corrupt instance or latest attempt is decoded, and
    # refused, before it decides anything or is copied into the new attempt.
    instance = decode_job_instance(row)
    latest_row = q.find_latest_job_execution(conn, job_instance_id=instance_id)
    latest = None if latest_row is None else decode_job_execution(latest_row)
    _refuse_latest(instance_id, latest, row["final_status"])
    definition_id = ensure_definition(q, conn, clock, instance.job_name, definition)
    upgrade_from: int | None = None
    # Two definition rows of one job name never share a digest (job_definition_digest_unique),
    # so another row means another digest: a direct edge must exist.
    if latest is not None and latest.definition_id != definition_id:
        edge = q.find_definition_upgrade(
            conn, from_definition_id=latest.definition_id, to_definition_id=definition_id
        )
        if edge is None:
            raise IncompatibleDefinition(instance_id=instance_id)
        upgrade_from = int(latest.definition_id)
    attempt = int(row["last_attempt"]) + 1
    if q.update_job_instance_last_attempt(conn, job_instance_id=instance_id, attempt=attempt) != 1:
        raise ConcurrentModification()
    now = clock.now()
    row = q.insert_job_execution(
        conn,
        job_instance_id=instance_id,
        definition_id=definition_id,
        upgrade_from_definition_id=upgrade_from,
        restart_of_execution_id=None if latest is None else latest.id,
        attempt=attempt,
        parameters=to_jsonb(encode_identifying_parameters(instance.key)),
        now=now,
    )
    return decode_job_execution(row)


def check_expected_version(expected_version: int) -> int:
    """An expected version to compare with a stored one (behaviour.md 2.2).

    Raises:
        Unavailable: above 2^63-1, where no stored version can be (bigint).
        VersionOutOfRange: negative.
    """
    try:
        return check_version(expected_version)
    except VersionOutOfRange:
        if type(expected_version) is int and expected_version > INT64_MAX:
            raise Unavailable() from None
        raise


def _locked(q: Statements, conn: Connection, execution_id: int) -> JobExecution:
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.lock_job_execution(conn, job_execution_id=execution_id)
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    return decode_job_execution(row)


def _cas_lost(q: Statements, conn: Connection, execution_id: int, expected: int) -> Exception:
    """Tell a stale version from a vanished row after a compare-and-swap changed nothing."""
    row = q.get_job_execution(conn, job_execution_id=execution_id)
    if row is None:
        return JobExecutionNotFound(id=execution_id)
    return StaleVersion(expected=expected, actual=int(row["version"]))


def transition_job_execution(
    q: Statements,
    conn: Connection,
    execution_id: int,
    expected_version: int,
    transition: LifecycleTransition,
) -> JobExecution:
    """Apply a lifecycle transition under the row lock, then compare-and-swap (4.4).

    Raises:
        JobExecutionNotFound, then the lifecycle errors in behaviour.md 3.2 order.

    Statements: executions.sql lock_job_execution, update_job_execution_transition.
    """
    check_expected_version(expected_version)
    current = _locked(q, conn, execution_id)
    metadata, version = apply_transition(
        current.metadata, current.version, expected_version, transition, counts_apply=False
    )
    columns = encode_execution_metadata(metadata)
    del columns["exit_code"]  # transitions never change the exit status
    changed = q.update_job_execution_transition(
        conn,
        **columns,
        transitioned_at=transition.at,
        job_execution_id=execution_id,
        expected_version=expected_version,
    )
    if changed != 1:
        raise _cas_lost(q, conn, execution_id, expected_version)
    return attrs.evolve(
        current,
        metadata=metadata,
        version=version,
        updated_at=max(current.updated_at, transition.at),
    )


def enrich_job_exit_status(
    q: Statements,
    conn: Connection,
    clock: Clock,
    execution_id: int,
    expected_version: int,
    exit_status: ExitCode,
) -> JobExecution:
    """Replace the exit status in any status, bumping the version (behaviour.md 3.3, 4.4).

    Statements: executions.sql lock_job_execution, update_job_execution_exit_code.
    """
    check_expected_version(expected_version)
    current = _locked(q, conn, execution_id)
    metadata, version = apply_exit_enrichment(
        current.metadata, current.version, expected_version, exit_status
    )
    now = clock.now()
    changed = q.update_job_execution_exit_code(
        conn,
        exit_code=exit_status.value,
        now=now,
        job_execution_id=execution_id,
        expected_version=expected_version,
    )
    if changed != 1:
        raise _cas_lost(q, conn, execution_id, expected_version)
    return attrs.evolve(
        current, metadata=metadata, version=version, updated_at=max(current.updated_at, now)
    )


def get_job_execution(q: Statements, conn: Connection, execution_id: int) -> JobExecution | None:
    """One job execution, or None (statements: executions.sql get_job_execution)."""
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.get_job_execution(conn, job_execution_id=execution_id)
    return None if row is None else decode_job_execution(row)


def job_executions(q: Statements, conn: Connection, instance_id: int) -> list[JobExecution]:
    """Every attempt of an instance in attempt order (behaviour.md 4.5).

    Statements: instances.sql get_job_instance; executions.sql list_job_executions.
    """
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    if q.get_job_instance(conn, job_instance_id=instance_id) is None:
        raise JobInstanceNotFound(id=instance_id)
    rows = q.list_job_executions(conn, job_instance_id=instance_id)
    return [decode_job_execution(row) for row in rows]
