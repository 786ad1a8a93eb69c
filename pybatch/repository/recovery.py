"""Audited recovery of orphaned or ambiguous executions, queries/recovery.sql."""

from __future__ import annotations

import attrs

from pybatch._statements import Connection, Statements
from pybatch.clock import Clock
from pybatch.codecs._primitives import (
    decode_aware,
    decode_bool,
    decode_enum,
    decode_int64,
    decode_text,
)
from pybatch.codecs.executions import decode_job_execution
from pybatch.codecs.recovery import decode_recovery_decision
from pybatch.errors import (
    JobExecutionNotFound,
    RecoveryNotAllowed,
    StaleVersion,
    Unavailable,
)
from pybatch.repository import executions, steps
from pybatch.repository._capability import Capability, job_execution_row
from pybatch.repository.audit_chain import link_audit_record
from pybatch.repository.operator_requests import OperatorRequests
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.audit import AuditRecordKind
from pybatch.values.ids import FailureId, IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.operator import automatic_recovery_record
from pybatch.values.ownership import OwnerToken
from pybatch.values.recovery import (
    OwnerObservation,
    RecoveryDecision,
    RecoveryMarkers,
    RecoveryRequest,
    RecoveryResult,
    RecoverySnapshot,
    RecoveryStepEvidence,
)
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from pybatch.values.timestamps import ExecutionTimestamps


def recover_job_execution(
    q: Statements,
    conn: Connection,
    clock: Clock,
    execution_id: int,
    request: RecoveryRequest,
    *,
    tolerate_chain_errors: bool = False,
) -> RecoveryResult:
    """Mark an unresolved execution FAILED or ABANDONED and record why, atomically.

    With `tolerate_chain_errors` (automatic recovery), a damaged audit chain that refuses the
    decision's link leaves the decision recorded but unlinked (try_link_audit_record) instead
    of refusing the recovery.

    Raises:
        JobExecutionNotFound: no such execution.
        StaleVersion: the version moved on (a replayed request is stale).
        RecoveryNotAllowed: the execution is already finished.

    The execution's unfinished steps and partition workers end FAILED (STALE_RECOVERED) in the
    same transaction, so nothing of the recovered owner commits afterwards.
    """
    prior = executions.lock_job_execution(q, conn, execution_id)
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
        current = decode_job_execution(job_execution_row(q, conn, execution_id))
        raise StaleVersion(expected=request.expected_version, actual=current.version)
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
    decision = decode_recovery_decision(decision_row)
    # The recovered owner's steps and partition workers end with its execution: whatever it
    # still runs can commit no chunk from here on.
    steps.end_unfinished_steps(
        q, conn, execution_id, metadata.status, decided_at, FailureCategory.STALE_RECOVERED
    )
    link_audit_record(
        q,
        conn,
        AuditRecordKind.RECOVERY_DECISION,
        decision.id,
        tolerate_chain_errors=tolerate_chain_errors,
    )
    recovered = attrs.evolve(
        prior,
        metadata=metadata,
        version=prior.version + 1,
        updated_at=max(prior.updated_at, decided_at),
    )
    return RecoveryResult(execution=recovered, decision=decision)


#: The operator reference of recoveries pybatch records on its own (orphaned runs).
AUTOMATIC_RECOVERY_REFERENCE = "pybatch.etl"


def recovery_snapshot(
    q: Statements, conn: Connection, execution_id: int, current_owner: OwnerToken | None
) -> RecoverySnapshot:
    """Observe one execution for a recovery decision; read-only, the token never returned.

    Raises:
        JobExecutionNotFound: no such execution.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.read_recovery_snapshot.one(
        conn,
        job_execution_id=execution_id,
        owner_token=None if current_owner is None else current_owner.value,
    )
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    status = decode_enum(BatchStatus, row["status"], column="status")
    if decode_bool(row["owner_absent"], column="owner_absent"):
        owner = OwnerObservation.ABSENT
    elif decode_bool(row["owner_matches"], column="owner_matches"):
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
    if decode_bool(row["completed_partition"], column="completed_partition"):
        markers |= RecoveryMarkers.COMPLETED_PARTITION
    if decode_bool(row["committed_flow_decision"], column="committed_flow_decision"):
        markers |= RecoveryMarkers.COMMITTED_FLOW_DECISION
    if decode_bool(row["ambiguous_external_effect"], column="ambiguous_external_effect"):
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


class Recovery(Capability):
    """The recovery operations of one unit of work."""

    def recover(self, execution_id: int, request: RecoveryRequest) -> RecoveryResult:
        """Mark an unresolved execution FAILED or ABANDONED with an audit decision."""
        with self._uow.operation() as conn:
            return recover_job_execution(
                self._uow.statements, conn, self._uow.clock, execution_id, request
            )

    def decision(self, execution_id: int) -> RecoveryDecision | None:
        """The latest recovery decision of an execution, or None (docs/contract.md, Recovery).

        Raises:
            JobExecutionNotFound: no such execution.
        """
        with self._operation() as (q, conn):
            job_execution_row(q, conn, execution_id)
            row = q.find_latest_recovery_decision.one(conn, job_execution_id=execution_id)
            return None if row is None else decode_recovery_decision(row)

    def recover_orphaned(self, execution_id: int, *, audited: bool = True) -> RecoveryResult:
        """Record FAILED (OWNER_LOST) for an execution whose owner is gone; fail its open steps.

        The caller has proved the owner gone (its lease ran out). With `audited` it is also
        recorded like an operator's request (RECOVER by pybatch.etl), in the same savepoint.
        A damaged audit chain never blocks it: the decision and the request are then kept
        unlinked, an error line names them and `pybatch audit verify` reports the chain
        broken. The evidence digest binds the execution's id, status, durable `updated_at`
        and version, so a decision about one observation can never apply to a later one.

        Raises:
            JobExecutionNotFound: no such execution.
            StaleVersion, RecoveryNotAllowed: it changed or ended meanwhile.
        """
        with self._operation() as (q, conn):
            clock = self._uow.clock
            orphan = decode_job_execution(job_execution_row(q, conn, execution_id))
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
            failure = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(orphan.id))
            request = RecoveryRequest.mark_failed(
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
