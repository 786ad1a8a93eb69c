"""Audited recovery of orphaned or ambiguous executions (behaviour.md 4.9), queries/recovery.sql."""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from pybatch._statements import Statements
from pybatch.clock import Clock
from pybatch.codecs.executions import decode_job_execution
from pybatch.errors import (
    JobExecutionNotFound,
    RecoveryNotAllowed,
    StaleVersion,
)
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.records import JobExecution
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.timestamps import ExecutionTimestamps

__all__ = ["RecoveryResult", "recover_job_execution"]

Connection = psycopg.Connection[Any]


@attrs.frozen
class RecoveryResult:
    """The recovered execution and the id of its audit decision."""

    execution: JobExecution
    decision_id: int


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
    row = q.lock_job_execution(conn, job_execution_id=execution_id)
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
    changed = q.update_job_execution_recovered(
        conn,
        **common,
        failure_category=None if failure is None else failure.category.value,
        failure_id=None if failure is None else failure.failure_id,
    )
    if changed != 1:
        current = q.get_job_execution(conn, job_execution_id=execution_id)
        if current is None:
            raise JobExecutionNotFound(id=execution_id)
        raise StaleVersion(expected=request.expected_version, actual=int(current["version"]))
    decision_id = q.insert_recovery_decision(
        conn,
        **common,
        prior_status=prior.status.value,
        reason_code=request.reason_code,
        operator_reference=request.operator_reference,
        evidence_digest=request.evidence_digest,
    )["id"]
    recovered = attrs.evolve(
        prior,
        metadata=metadata,
        version=prior.version + 1,
        updated_at=max(prior.updated_at, decided_at),
    )
    return RecoveryResult(execution=recovered, decision_id=int(decision_id))
