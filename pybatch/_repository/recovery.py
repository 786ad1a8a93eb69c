"""Audited recovery of orphaned or ambiguous executions, queries/recovery.sql."""

from __future__ import annotations

from pybatch._clock import Clock
from pybatch._codecs._primitives import aware_at, bool_at, enum_at, int64_at, returned, text_at
from pybatch._codecs.executions import decode_job_execution, decode_recovery_decision
from pybatch._repository import _lifecycle, executions, steps
from pybatch._repository._capability import Capability, job_execution_row
from pybatch._repository.audit_chain import link_audit_record
from pybatch._repository.operator_requests import OperatorRequests
from pybatch._statements import Connection, Statements
from pybatch.errors import JobExecutionNotFound, RecoveryNotAllowed, StaleVersion
from pybatch.values import recovery
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.audit import AuditRecordKind
from pybatch.values.ids import FailureId, IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata, ExecutionTimestamps
from pybatch.values.operator import automatic_recovery_record
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary


def recover_job_execution(
    q: Statements,
    conn: Connection,
    clock: Clock,
    execution_id: int,
    request: recovery.RecoveryRequest,
    *,
    tolerate_chain_errors: bool = False,
) -> recovery.RecoveryResult:
    """Mark an unresolved execution FAILED or ABANDONED and record the audited decision.

    Raises JobExecutionNotFound, then StaleVersion (a replayed request is stale), then
    RecoveryNotAllowed (already finished). `tolerate_chain_errors`: see link_audit_record.
    """
    prior = _lifecycle.lock(executions.ROWS, q, conn, execution_id)
    if prior.version != request.expected_version:
        raise StaleVersion(expected=request.expected_version, actual=prior.version)
    if not prior.status.is_unresolved:
        raise RecoveryNotAllowed(id=execution_id, status=prior.status.value)
    times = prior.metadata.timestamps
    # The decision's end time never goes below what is stored: a run stamped by a client
    # whose clock ran ahead is still recoverable by one whose clock is right (its end time is
    # then its start). Nothing decides on `decided_at`; the latest decision is the highest id.
    decided_at = max(clock.now(), times.started_at or times.created_at)
    metadata = ExecutionMetadata(
        status=request.status,
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
    new = (metadata, prior.version + 1)
    recovered = _lifecycle.swapped(
        executions.ROWS, q, conn, prior, changed, request.expected_version, new, decided_at
    )
    decision_row = q.insert_recovery_decision.one(
        conn,
        **common,
        prior_status=prior.status.value,
        reason_code=request.reason_code,
        operator_reference=request.operator_reference,
        evidence_digest=request.evidence_digest,
    )
    decision = decode_recovery_decision(returned(decision_row))
    # The recovered owner's steps and partition workers end with its execution in this
    # transaction: whatever it still runs can commit no chunk from here on.
    steps.end_unfinished_steps(
        q, conn, execution_id, metadata.status, decided_at, FailureCategory.STALE_RECOVERED
    )
    kind = AuditRecordKind.RECOVERY_DECISION
    link_audit_record(q, conn, kind, decision.id, tolerate_chain_errors=tolerate_chain_errors)
    return recovery.RecoveryResult(execution=recovered, decision=decision)


def evidence_digest(execution: JobExecution, observation: str, **more: object) -> bytes:
    """The evidence a recovery decision binds: any write to the execution since changes it."""
    observed = {
        "execution_id": execution.id,
        "observation": observation,
        "status": execution.status.value,
        "updated_at": execution.updated_at.isoformat(),
        "version": execution.version,
    }
    return sha256(canonical_json({**observed, **more}))


#: The operator reference of recoveries pybatch records on its own (orphaned runs).
AUTOMATIC_RECOVERY_REFERENCE = "pybatch.etl"


_MARKER_COLUMNS = (
    ("completed_partition", recovery.RecoveryMarkers.COMPLETED_PARTITION),
    ("committed_flow_decision", recovery.RecoveryMarkers.COMMITTED_FLOW_DECISION),
    ("ambiguous_external_effect", recovery.RecoveryMarkers.AMBIGUOUS_EXTERNAL_EFFECT),
)


def recovery_snapshot(
    q: Statements, conn: Connection, execution_id: int, current_owner: OwnerToken | None
) -> recovery.RecoverySnapshot:
    """Observe one execution for a recovery decision (JobExecutionNotFound); the token stays."""
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.read_recovery_snapshot.one(
        conn,
        job_execution_id=execution_id,
        owner_token=None if current_owner is None else current_owner.value,
    )
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    status = enum_at(BatchStatus, row, "status")
    if bool_at(row, "owner_absent"):
        owner = recovery.OwnerObservation.ABSENT
    elif bool_at(row, "owner_matches"):
        owner = recovery.OwnerObservation.CURRENT_PROCESS
    else:
        owner = recovery.OwnerObservation.OTHER_PROCESS
    latest = None
    if row["latest_step_id"] is not None:
        latest = recovery.RecoveryStepEvidence(
            id=int64_at(row, "latest_step_id"),
            status=enum_at(BatchStatus, row, "latest_step_status"),
            checkpoint_schema=text_at(row, "latest_step_checkpoint_schema"),
            checkpoint_schema_version=int64_at(row, "latest_step_checkpoint_schema_version"),
        )
    markers = recovery.RecoveryMarkers.NONE
    if (
        status is BatchStatus.UNKNOWN
        or row["failure_category"] == "UNKNOWN_COMMIT"
        or (latest is not None and latest.status is BatchStatus.UNKNOWN)
    ):
        markers |= recovery.RecoveryMarkers.UNKNOWN_COMMIT
    for column, marker in _MARKER_COLUMNS:
        if bool_at(row, column):
            markers |= marker
    return recovery.RecoverySnapshot(
        execution_id=execution_id,
        status=status,
        attempt=int64_at(row, "attempt"),
        version=int64_at(row, "version", 0),
        owner=owner,
        updated_at=aware_at(row, "updated_at"),
        server_time=aware_at(row, "server_time"),
        latest_step=latest,
        markers=markers,
    )


class Recovery(Capability):
    def recover(
        self, execution_id: int, request: recovery.RecoveryRequest
    ) -> recovery.RecoveryResult:
        """Mark an unresolved execution FAILED or ABANDONED with an audit decision."""
        with self._operation() as (q, conn):
            return recover_job_execution(q, conn, self._uow.clock, execution_id, request)

    def decision(self, execution_id: int) -> recovery.RecoveryDecision | None:
        """The latest recovery decision of an execution, or None (JobExecutionNotFound)."""
        with self._operation() as (q, conn):
            job_execution_row(q, conn, execution_id)
            row = q.find_latest_recovery_decision.one(conn, job_execution_id=execution_id)
            return None if row is None else decode_recovery_decision(row)

    def recover_orphaned(
        self, execution_id: int, *, audited: bool = True
    ) -> recovery.RecoveryResult:
        """Record FAILED (OWNER_LOST) for an execution whose lease ran out; fail its open steps.

        With `audited` it is also recorded as a RECOVER request by pybatch.etl. A damaged audit
        chain never blocks it (both stay unlinked). The evidence digest binds id, status,
        `updated_at` and version, so a decision about one observation never applies to a later
        one. Raises JobExecutionNotFound, then StaleVersion or RecoveryNotAllowed.
        """
        with self._operation() as (q, conn):
            clock = self._uow.clock
            orphan = decode_job_execution(job_execution_row(q, conn, execution_id))
            evidence = evidence_digest(orphan, "OWNER_LOST")
            failure = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(orphan.id))
            request = recovery.RecoveryRequest(
                orphan.version, "OWNER_LOST", AUTOMATIC_RECOVERY_REFERENCE, evidence, failure
            )
            result = recover_job_execution(
                q, conn, clock, orphan.id, request, tolerate_chain_errors=True
            )
            if audited:
                OperatorRequests(self._uow).append(
                    automatic_recovery_record(result, clock.now()), tolerate_chain_errors=True
                )
            return result
