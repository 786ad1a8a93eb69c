"""Retention audit and the purge of whole instance histories (4.14), queries/retention.sql.

The purge unit is a whole instance history: a candidate instance is of the requested job,
not held, has no unresolved attempt, and its latest attempt has a requested status and was
last written before the cutoff. Apply locks the candidates' instances and executions, checks
that exactly the planned executions exist at the planned versions (anything else: the plan
is stale and nothing is deleted), then deletes children first and leaves a tombstone (or,
with forget_instances, deletes the instance rows as well).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import attrs
import psycopg

from pybatch._statements import Statements
from pybatch.codecs._primitives import (
    DecodeError,
    decode_aware,
    decode_enum,
    decode_int64,
    returned,
)
from pybatch.errors import RetentionPlanStale
from pybatch.repository.audit_chain import link_audit_record
from pybatch.values.audit import AuditRecordKind
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.retention import (
    PurgeCandidate,
    PurgeCounts,
    PurgePlan,
    PurgePlanRequest,
    PurgeSurvey,
    RetentionAction,
    RetentionRecord,
    RetentionRecordDraft,
)
from pybatch.values.status import BatchStatus

__all__ = [
    "append_retention_action",
    "apply_purge",
    "find_retention_action",
    "mark_purged_audit_links",
    "PurgeResult",
    "PurgedAuditRecords",
    "purge_survey",
]

Connection = psycopg.Connection[Any]


@attrs.frozen
class PurgedAuditRecords:
    """The audit records a purge deleted, so their chain links can be marked purged."""

    operator_request_ids: tuple[int, ...] = ()
    recovery_decision_ids: tuple[int, ...] = ()


@attrs.frozen
class PurgeResult:
    """Rows actually deleted, and which audit records were among them."""

    counts: PurgeCounts
    audit_records: PurgedAuditRecords


_COUNT_COLUMNS = (
    ("flow_decisions", "deleted_flow_decisions"),
    ("recovery_decisions", "deleted_recovery_decisions"),
    ("operator_requests", "deleted_operator_requests"),
    ("step_partitions", "deleted_step_partitions"),
    ("step_executions", "deleted_step_executions"),
    ("job_executions", "deleted_job_executions"),
    ("job_instances", "deleted_job_instances"),
)


def _decode_record(row: Any) -> RetentionRecord:
    try:
        return RetentionRecord(
            id=decode_int64(row["id"], column="id", minimum=0),
            action=decode_enum(RetentionAction, row["action"], column="action"),
            operation_id=OperationId(row["operation_id"]),
            actor=ActorRef(row["actor_ref"]),
            reason=ReasonCode(row["reason_code"]),
            request_digest=bytes(row["request_digest"]),
            job_instance_id=row["job_instance_id"],
            plan_digest=None if row["plan_digest"] is None else bytes(row["plan_digest"]),
            batch_bound=row["batch_bound"],
            counts=PurgeCounts(**{name: int(row[column]) for name, column in _COUNT_COLUMNS}),
            outcome=str(row["outcome_class"]),
            applied_at=decode_aware(row["applied_at"], column="applied_at"),
        )
    except (ValueError, TypeError) as error:
        raise DecodeError("retention_action") from error


def find_retention_action(
    q: Statements, conn: Connection, action: RetentionAction, operation_id: OperationId
) -> RetentionRecord | None:
    """The recorded retention request of (action, operation id), or None.

    Statements: retention.sql find_retention_action.
    """
    row = q.find_retention_action.one(conn, action=action.value, operation_id=operation_id.value)
    return None if row is None else _decode_record(row)


def append_retention_action(
    q: Statements, conn: Connection, draft: RetentionRecordDraft
) -> RetentionRecord:
    """Append a retention audit row (and its audit-chain link) in the effect's transaction.

    Raises:
        ConcurrentModification: the (action, operation id) is already recorded.

    Statements: retention.sql insert_retention_action; audit_chain.sql append_audit_link,
    set_audit_chain_head.
    """
    counts = draft.counts.as_dict()
    row = q.insert_retention_action.one(
        conn,
        job_instance_id=draft.job_instance_id,
        action=draft.action.value,
        operation_id=draft.operation_id.value,
        actor_ref=draft.actor.value,
        reason_code=draft.reason.value,
        request_digest=draft.request_digest,
        plan_digest=draft.plan_digest,
        batch_bound=draft.batch_bound,
        outcome_class=draft.outcome,
        applied_at=draft.applied_at,
        **{column: counts[name] for name, column in _COUNT_COLUMNS},
    )
    record_id = decode_int64(returned(row)["id"], column="id", minimum=1)
    link_audit_record(q, conn, AuditRecordKind.RETENTION_ACTION, record_id)
    return RetentionRecord(id=record_id, **attrs.asdict(draft, recurse=False))


#: Before every possible instant: the keyset start of a survey.
_EPOCH = _dt.datetime(1, 1, 1, tzinfo=_dt.UTC)


def purge_survey(
    q: Statements,
    conn: Connection,
    request: PurgePlanRequest,
    now: _dt.datetime,
    after: tuple[_dt.datetime, int] | None = None,
) -> PurgeSurvey:
    """The next batch of whole instance histories to purge (read-only).

    Instances are taken oldest latest-execution first (then by id) while their executions
    fit in the batch bound; an instance larger than the bound is taken alone.

    Statements: retention.sql survey_purge_instances, list_instance_executions,
    count_purge_rows.
    """
    cutoff = now - request.minimum_age
    bound = request.batch.value
    found: list[tuple[_dt.datetime, int, BatchStatus, int]] = []
    for status in request.statuses.ordered():
        rows = q.survey_purge_instances.many(
            conn,
            status=status.value,
            cutoff=cutoff,
            job_name=request.job_name.value,
            limit=bound,
            after_updated_at=_EPOCH if after is None else after[0],
            after_instance_id=0 if after is None else after[1],
        )
        for row in rows:
            found.append(
                (
                    decode_aware(row["updated_at"], column="updated_at"),
                    decode_int64(row["job_instance_id"], column="job_instance_id", minimum=0),
                    decode_enum(BatchStatus, row["status"], column="status"),
                    decode_int64(row["execution_count"], column="execution_count", minimum=0),
                )
            )
    found.sort(key=lambda item: (item[0], item[1]))
    chosen: list[tuple[int, BatchStatus]] = []
    total = 0
    last_key: tuple[_dt.datetime, int] | None = None
    for updated, instance_id, status, count in found:
        if chosen and total + count > bound:
            break
        chosen.append((instance_id, status))
        last_key = (updated, instance_id)
        total += count
        if total >= bound:
            break
    if not chosen:
        return PurgeSurvey((), PurgeCounts())
    instance_ids = sorted(instance_id for instance_id, _ in chosen)
    executions = q.list_instance_executions.many(conn, instance_ids=instance_ids)
    candidates = tuple(
        sorted(
            PurgeCandidate(
                decode_int64(row["job_instance_id"], column="job_instance_id", minimum=0),
                decode_int64(row["id"], column="id", minimum=0),
                decode_int64(row["version"], column="version", minimum=0),
            )
            for row in executions
        )
    )
    counts = _count(q, conn, instance_ids, [c.job_execution_id for c in candidates])
    return PurgeSurvey(candidates, counts, tuple(sorted(chosen)), last_key)


def _count(
    q: Statements, conn: Connection, instance_ids: list[int], execution_ids: list[int]
) -> PurgeCounts:
    row = returned(
        q.count_purge_rows.one(conn, instance_ids=instance_ids, execution_ids=execution_ids)
    )
    return PurgeCounts(
        flow_decisions=decode_int64(row["flow_decisions"], column="flow_decisions", minimum=0),
        recovery_decisions=decode_int64(
            row["recovery_decisions"], column="recovery_decisions", minimum=0
        ),
        operator_requests=decode_int64(
            row["operator_requests"], column="operator_requests", minimum=0
        ),
        step_partitions=decode_int64(row["step_partitions"], column="step_partitions", minimum=0),
        step_executions=decode_int64(row["step_executions"], column="step_executions", minimum=0),
        job_executions=len(execution_ids),
        job_instances=len(instance_ids),
    )


def apply_purge(q: Statements, conn: Connection, plan: PurgePlan, now: _dt.datetime) -> PurgeResult:
    """Delete exactly the plan's histories, or nothing (RetentionPlanStale).

    Race: the instances, then their executions, are locked FOR UPDATE in ascending id
    order, so a concurrent launch, restart, hold or transition on a candidate either
    committed first (and the re-validation below finds the change: stale) or waits for
    this purge and then finds the instance purged.

    Raises:
        RetentionPlanStale: an instance is gone or held, an execution was added, removed,
            changed version, or no longer ends in a requested status.

    Statements: retention.sql lock_purge_instances, lock_purge_executions,
    delete_purge_flow_decisions, delete_purge_recovery_decisions,
    delete_purge_operator_requests, delete_purge_step_partitions,
    delete_purge_step_executions, delete_purge_job_executions, tombstone_purged_instances,
    list_purge_audit_records,
    detach_retention_actions, delete_purge_instances.
    """
    if plan.is_empty():
        return PurgeResult(PurgeCounts(), PurgedAuditRecords())
    instance_ids = plan.instance_ids
    locked = q.lock_purge_instances.many(conn, instance_ids=instance_ids)
    if [decode_int64(row["id"], column="id", minimum=0) for row in locked] != instance_ids or any(
        row["held"] for row in locked
    ):
        raise RetentionPlanStale()
    rows = q.lock_purge_executions.many(conn, instance_ids=instance_ids)
    current = tuple(
        sorted(
            PurgeCandidate(
                decode_int64(row["job_instance_id"], column="job_instance_id", minimum=0),
                decode_int64(row["id"], column="id", minimum=0),
                decode_int64(row["version"], column="version", minimum=0),
            )
            for row in rows
        )
    )
    if current != plan.candidates:
        raise RetentionPlanStale()
    latest: dict[int, tuple[int, BatchStatus]] = {}
    for row in rows:
        status = decode_enum(BatchStatus, row["status"], column="status")
        instance_id, attempt = (
            decode_int64(row["job_instance_id"], column="job_instance_id", minimum=0),
            decode_int64(row["attempt"], column="attempt", minimum=0),
        )
        if status.is_unresolved:
            raise RetentionPlanStale()
        if instance_id not in latest or attempt > latest[instance_id][0]:
            latest[instance_id] = (attempt, status)
    if any(status not in plan.request.statuses.statuses for _, status in latest.values()):
        raise RetentionPlanStale()
    execution_ids = [candidate.job_execution_id for candidate in plan.candidates]
    ids = {"execution_ids": execution_ids}
    both = {"execution_ids": execution_ids, "instance_ids": instance_ids}
    audit = q.list_purge_audit_records.many(conn, **both)
    audit_records = PurgedAuditRecords(
        operator_request_ids=tuple(
            decode_int64(r["record_id"], column="record_id", minimum=0)
            for r in audit
            if r["record_kind"] == "OPERATOR_REQUEST"
        ),
        recovery_decision_ids=tuple(
            decode_int64(r["record_id"], column="record_id", minimum=0)
            for r in audit
            if r["record_kind"] == "RECOVERY_DECISION"
        ),
    )
    counts = PurgeCounts(
        flow_decisions=q.delete_purge_flow_decisions.affected(conn, **ids),
        recovery_decisions=q.delete_purge_recovery_decisions.affected(conn, **ids),
        operator_requests=q.delete_purge_operator_requests.affected(conn, **both),
        step_partitions=q.delete_purge_step_partitions.affected(conn, **ids),
        step_executions=q.delete_purge_step_executions.affected(conn, **ids),
        job_executions=q.delete_purge_job_executions.affected(conn, **ids),
    )
    if plan.request.forget_instances:
        q.detach_retention_actions.affected(conn, instance_ids=instance_ids)
        instances = q.delete_purge_instances.affected(conn, instance_ids=instance_ids)
    else:
        instances = q.tombstone_purged_instances.affected(
            conn,
            instance_ids=instance_ids,
            final_statuses=[latest[instance_id][1].value for instance_id in instance_ids],
            purged_at=now,
        )
    return PurgeResult(attrs.evolve(counts, job_instances=instances), audit_records)


def mark_purged_audit_links(
    q: Statements, conn: Connection, deleted: PurgedAuditRecords, retention_action_id: int
) -> int:
    """Mark the links whose records this purge deleted, naming its retention action.

    Statements: retention.sql mark_purged_audit_links.
    """
    return int(
        q.mark_purged_audit_links.affected(
            conn,
            retention_action_id=retention_action_id,
            operator_request_ids=list(deleted.operator_request_ids),
            recovery_decision_ids=list(deleted.recovery_decision_ids),
        )
    )
