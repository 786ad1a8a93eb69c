"""Audited recovery of orphaned or ambiguous executions (behaviour.md 4.9), queries/recovery.sql."""

from __future__ import annotations

import attrs

from pybatch._statements import Connection, Statements
from pybatch.clock import Clock
from pybatch.codecs.executions import decode_job_execution
from pybatch.codecs.recovery import decode_recovery_decision
from pybatch.errors import (
    JobExecutionNotFound,
    RecoveryNotAllowed,
    StaleVersion,
    Unavailable,
)
from pybatch.repository import steps
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.ids import FailureId, IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata, LifecycleTransition
from pybatch.values.recovery import RecoveryDecision, RecoveryRequest, RecoveryResult
from pybatch.values.status import FailureCategory, FailureSummary
from pybatch.values.timestamps import ExecutionTimestamps

__all__ = ["recover_job_execution", "recover_orphaned_execution", "recovery_decision"]


def recover_job_execution(
    q: Statements, conn: Connection, clock: Clock, execution_id: int, request: RecoveryRequest
) -> RecoveryResult:
    """Mark an unresolved execution FAILED or ABANDONED and record why, atomically (4.9).

    Raises:
        JobExecutionNotFound: no such execution.
        StaleVersion: the version moved on (a replayed request is stale, rule 10).
        RecoveryNotAllowed: the execution is already finished.
        InvalidTimestampOrder: the clock is behind the execution's start.

    Statements: executions.sql lock_job_execution; recovery.sql update_job_execution_recovered,
    insert_recovery_decision.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.lock_job_execution.one(conn, job_execution_id=execution_id)
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    prior = decode_job_execution(row)
    if prior.version != request.expected_version:
        raise StaleVersion(expected=request.expected_version, actual=prior.version)
    if not prior.status.is_unresolved:
        raise RecoveryNotAllowed(id=execution_id, status=prior.status.value)
    decided_at = clock.now()
    times = prior.metadata.timestamps
    metadata = ExecutionMetadata(
        status=request.disposition.status,
        exit_status=prior.metadata.exit_status,
        timestamps=ExecutionTimestamps(times.created_at, times.started_at, decided_at),
        counts=prior.metadata.counts,
        failure=request.failure,
    )
    failure = request.failure
    common = {
        "job_execution_id": execution_id,
        "expected_version": request.expected_version,
        "status": metadata.status.value,
        "decided_at": decided_at,
    }
    changed = q.update_job_execution_recovered.affected(
        conn,
        **common,
        failure_category=None if failure is None else failure.category.value,
        failure_id=None if failure is None else failure.failure_id,
    )
    if changed != 1:
        current = q.get_job_execution.one(conn, job_execution_id=execution_id)
        if current is None:
            raise JobExecutionNotFound(id=execution_id)
        raise StaleVersion(
            expected=request.expected_version, actual=decode_job_execution(current).version
        )
    decision_row = q.insert_recovery_decision.one(
        conn,
        **common,
        prior_status=prior.status.value,
        reason_code=request.reason_code,
        operator_reference=request.operator_reference,
        evidence_digest=request.evidence_digest,
    )
    if decision_row is None:  # INSERT ... RETURNING always returns its row
        raise Unavailable()
    recovered = attrs.evolve(
        prior,
        metadata=metadata,
        version=prior.version + 1,
        updated_at=max(prior.updated_at, decided_at),
    )
    return RecoveryResult(execution=recovered, decision=decode_recovery_decision(decision_row))


def recovery_decision(
    q: Statements, conn: Connection, execution_id: int
) -> RecoveryDecision | None:
    """The latest recovery decision of an execution, or None (behaviour.md 4.9, G8).

    Raises:
        JobExecutionNotFound: no such execution.

    Statements: executions.sql get_job_execution; recovery.sql find_latest_recovery_decision.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    if q.get_job_execution.one(conn, job_execution_id=execution_id) is None:
        raise JobExecutionNotFound(id=execution_id)
    row = q.find_latest_recovery_decision.one(conn, job_execution_id=execution_id)
    return None if row is None else decode_recovery_decision(row)


#: The operator reference of recoveries pybatch records on its own (orphaned runs).
AUTOMATIC_RECOVERY_REFERENCE = "pybatch.etl"


def recover_orphaned_execution(
    q: Statements, conn: Connection, clock: Clock, execution_id: int
) -> RecoveryResult:
    """Record FAILED (OWNER_LOST) for an execution whose owner is gone; fail its open steps.

    The caller has proved the owner gone (its liveness lock was free). The evidence digest
    binds the execution's id, status, durable `updated_at` and version, so a decision about
    one observation can never apply to a later one (rule 10).

    Raises:
        JobExecutionNotFound: no such execution.
        StaleVersion, RecoveryNotAllowed: it changed or ended meanwhile.

    Statements: executions.sql get_job_execution; steps.sql list_step_executions and the
    step transition's; then recover_job_execution's.
    """
    row = q.get_job_execution.one(conn, job_execution_id=execution_id)
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    orphan = decode_job_execution(row)
    evidence = sha256(
        canonical_json(
            {
                "execution_id": orphan.id,
                "observation": "OWNER_LOST",
                "status": orphan.status.value,
                "updated_at": orphan.updated_at.isoformat(),
                "version": orphan.version,
            }
        )
    )
    for step in steps.step_executions(q, conn, orphan.id):
        if step.status.is_active:
            at = max(clock.now(), step.updated_at)
            failure = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(step.id))
            steps.transition_step_execution(
                q, conn, step.id, step.version, LifecycleTransition.failed(at, failure)
            )
    failure = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(orphan.id))
    request = RecoveryRequest.mark_failed(
        orphan.version, "OWNER_LOST", AUTOMATIC_RECOVERY_REFERENCE, evidence, failure
    )
    return recover_job_execution(q, conn, clock, orphan.id, request)
