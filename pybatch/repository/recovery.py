"""Audited recovery of orphaned or ambiguous executions (behaviour.md 4.9), queries/recovery.sql."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import attrs
import psycopg

from pybatch._statements import Statements
from pybatch.clock import Clock
from pybatch.codecs._primitives import (
    DecodeError,
    decode_aware,
    decode_digest,
    decode_enum,
    decode_int64,
    decode_optional_aware,
    decode_text,
)
from pybatch.codecs.executions import decode_job_execution
from pybatch.errors import (
    JobExecutionNotFound,
    RecoveryNotAllowed,
    StaleVersion,
)
from pybatch.repository.audit_chain import link_audit_record
from pybatch.values.audit import AuditRecordKind
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import JobExecution
from pybatch.values.recovery import (
    OwnerObservation,
    RecoveryDecision,
    RecoveryMarkers,
    RecoveryRequest,
    RecoverySnapshot,
    RecoveryStepEvidence,
    UnresolvedExecution,
)
from pybatch.values.status import BatchStatus
from pybatch.values.timestamps import ExecutionTimestamps

__all__ = [
    "RecoveryResult",
    "decode_recovery_decision",
    "recover_job_execution",
    "recovery_decision",
    "recovery_snapshot",
    "unresolved_executions",
]

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
    insert_recovery_decision; audit_chain.sql append_audit_link, set_audit_chain_head.
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
    link_audit_record(q, conn, AuditRecordKind.RECOVERY_DECISION, int(decision_id))
    recovered = attrs.evolve(
        prior,
        metadata=metadata,
        version=prior.version + 1,
        updated_at=max(prior.updated_at, decided_at),
    )
    return RecoveryResult(execution=recovered, decision_id=int(decision_id))


def decode_recovery_decision(row: Any) -> RecoveryDecision:
    """Decode a recovery_decision row; an unknown status or a bad digest fails closed."""
    return RecoveryDecision(
        id=decode_int64(row["id"], column="id", minimum=1),
        job_execution_id=decode_int64(
            row["job_execution_id"], column="job_execution_id", minimum=1
        ),
        execution_version=decode_int64(
            row["execution_version"], column="execution_version", minimum=0
        ),
        prior_status=decode_enum(BatchStatus, row["prior_status"], column="prior_status"),
        resulting_status=decode_enum(
            BatchStatus, row["resulting_status"], column="resulting_status"
        ),
        reason_code=decode_text(row["reason_code"], column="reason_code"),
        operator_reference=decode_text(row["operator_reference"], column="operator_reference"),
        evidence_digest=decode_digest(row["evidence_digest"], column="evidence_digest"),
        decided_at=decode_aware(row["decided_at"], column="decided_at"),
    )


def recovery_decision(
    q: Statements, conn: Connection, execution_id: int
) -> RecoveryDecision | None:
    """The latest recovery decision of an execution, or None (4.5, G8).

    Raises:
        JobExecutionNotFound: no such execution.

    Statements: executions.sql get_job_execution; recovery.sql latest_recovery_decision.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    if q.get_job_execution(conn, job_execution_id=execution_id) is None:
        raise JobExecutionNotFound(id=execution_id)
    row = q.latest_recovery_decision(conn, job_execution_id=execution_id)
    return None if row is None else decode_recovery_decision(row)


def unresolved_executions(
    q: Statements, conn: Connection, clock: Clock, older_than: _dt.timedelta, limit: int
) -> list[UnresolvedExecution]:
    """Unresolved executions not written for `older_than`, oldest first, at most `limit`.

    Statements: recovery.sql list_unresolved_job_executions.
    """
    if not 1 <= limit <= 500:
        raise ValueError("limit is from 1 to 500")
    rows = q.list_unresolved_job_executions(conn, cutoff=clock.now() - older_than, limit=limit)
    found: list[UnresolvedExecution] = []
    for row in rows:
        stop = row["stop_requested"]
        if type(stop) is not bool:
            raise DecodeError("stop_requested")
        found.append(
            UnresolvedExecution(
                execution_id=decode_int64(row["id"], column="id", minimum=1),
                instance_id=decode_int64(
                    row["job_instance_id"], column="job_instance_id", minimum=1
                ),
                job_name=decode_text(row["job_name"], column="job_name"),
                attempt=decode_int64(row["attempt"], column="attempt", minimum=1),
                status=decode_enum(BatchStatus, row["status"], column="status"),
                updated_at=decode_aware(row["updated_at"], column="updated_at"),
                lease_expires_at=decode_optional_aware(
                    row["lease_expires_at"], column="lease_expires_at"
                ),
                stop_requested=stop,
            )
        )
    return found


def _flag(row: Any, column: str) -> bool:
    value = row[column]
    if type(value) is not bool:
        raise DecodeError(column)
    return value


def recovery_snapshot(
    q: Statements, conn: Connection, execution_id: int, current_owner: OwnerToken | None
) -> RecoverySnapshot:
    """Observe one execution for a recovery decision; read-only, the token never returned.

    Raises:
        JobExecutionNotFound: no such execution.

    Statements: recovery.sql read_recovery_snapshot.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.read_recovery_snapshot(
        conn,
        job_execution_id=execution_id,
        owner_token=None if current_owner is None else current_owner.value,
    )
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    status = decode_enum(BatchStatus, row["status"], column="status")
    if _flag(row, "owner_absent"):
        owner = OwnerObservation.ABSENT
    elif _flag(row, "owner_matches"):
        owner = OwnerObservation.CURRENT_PROCESS
    else:
        owner = OwnerObservation.OTHER_PROCESS
    latest = None
    if row["latest_step_id"] is not None:
        latest = RecoveryStepEvidence(
            id=decode_int64(row["latest_step_id"], column="latest_step_id", minimum=1),
            status=decode_enum(BatchStatus, row["latest_step_status"], column="latest_step_status"),
            checkpoint_schema=decode_text(
                row["latest_step_checkpoint_schema"], column="latest_step_checkpoint_schema"
            ),
            checkpoint_schema_version=decode_int64(
                row["latest_step_checkpoint_schema_version"],
                column="latest_step_checkpoint_schema_version",
                minimum=1,
            ),
        )
    markers = RecoveryMarkers.NONE
    if (
        status is BatchStatus.UNKNOWN
        or row["failure_category"] == "UNKNOWN_COMMIT"
        or (latest is not None and latest.status is BatchStatus.UNKNOWN)
    ):
        markers |= RecoveryMarkers.UNKNOWN_COMMIT
    if _flag(row, "completed_partition"):
        markers |= RecoveryMarkers.COMPLETED_PARTITION
    if _flag(row, "committed_flow_decision"):
        markers |= RecoveryMarkers.COMMITTED_FLOW_DECISION
    if _flag(row, "ambiguous_external_effect"):
        markers |= RecoveryMarkers.AMBIGUOUS_EXTERNAL_EFFECT
    return RecoverySnapshot(
        execution_id=execution_id,
        status=status,
        attempt=decode_int64(row["attempt"], column="attempt", minimum=1),
        version=decode_int64(row["version"], column="version", minimum=0),
        owner=owner,
        updated_at=decode_aware(row["updated_at"], column="updated_at"),
        server_time=decode_aware(row["server_time"], column="server_time"),
        latest_step=latest,
        markers=markers,
    )
