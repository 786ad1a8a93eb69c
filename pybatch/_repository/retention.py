"""Retention audit and the purge of whole instance histories, queries/retention.sql.

A plan is applied exactly or, stale, deletes nothing (docs/contract.md, Retention and purge).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from decimal import Decimal
from typing import Any

import attrs

from pybatch._codecs import _primitives as p
from pybatch._repository._capability import Capability
from pybatch._repository.audit_chain import link_audit_record
from pybatch._statements import Row
from pybatch.errors import RetentionPlanStale
from pybatch.values import retention
from pybatch.values.audit import AuditRecordKind
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.status import BatchStatus


@attrs.frozen
class PurgedAuditRecords:
    """The audit records a purge deleted, whose chain links are then marked purged."""

    operator_request_ids: tuple[int, ...] = ()
    recovery_decision_ids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        """No audit record was deleted: there is no link to mark."""
        return not (self.operator_request_ids or self.recovery_decision_ids)


@attrs.frozen
class PurgeResult:
    """Rows actually deleted, and which audit records were among them."""

    counts: retention.PurgeCounts
    audit_records: PurgedAuditRecords


#: Each PurgeCounts field and the retention_action column that stores it.
_COUNT_COLUMNS = tuple(
    (name, f"deleted_{name}") for name in attrs.fields_dict(retention.PurgeCounts)
)

#: The rows a purge counts under each execution it removes (survey and delete alike).
_HISTORY_ROW_COUNTS = tuple(name for name, _ in _COUNT_COLUMNS[:5])


def _decode_record(row: Any) -> retention.RetentionRecord:
    try:
        return retention.RetentionRecord(
            id=_int(row, "id"),
            action=p.enum_at(retention.RetentionAction, row, "action"),
            operation_id=OperationId(row["operation_id"]),
            actor=ActorRef(row["actor_ref"]),
            reason=ReasonCode(row["reason_code"]),
            request_digest=bytes(row["request_digest"]),
            job_instance_id=row["job_instance_id"],
            plan_digest=None if row["plan_digest"] is None else bytes(row["plan_digest"]),
            batch_bound=row["batch_bound"],
            counts=retention.PurgeCounts(
                **{name: int(row[column]) for name, column in _COUNT_COLUMNS}
            ),
            outcome=str(row["outcome_class"]),
            applied_at=p.aware_at(row, "applied_at"),
        )
    except (ValueError, TypeError) as error:
        raise p.DecodeError("retention_action") from error


#: Before every possible instant: the keyset start of a survey.
_EPOCH = _dt.datetime(1, 1, 1, tzinfo=_dt.UTC)


def _int(row: Row, column: str, minimum: int = 0) -> int:
    return p.int64_at(row, column, minimum)


def _sum(row: Row, column: str) -> int:
    """A SUM over bigint columns (numeric in PostgreSQL, a Decimal here) as an int."""
    value = row[column]
    if not isinstance(value, int | Decimal) or value < 0 or value != int(value):
        raise p.DecodeError(column)
    return int(value)


def _decode_ids(row: Row, column: str) -> tuple[int, ...]:
    value = row[column]
    if not isinstance(value, list):
        raise p.DecodeError(column)
    return tuple(p.decode_int64(item, column=column, minimum=1) for item in value)


class Retention(Capability):
    def find_action(
        self, action: retention.RetentionAction, operation_id: OperationId
    ) -> retention.RetentionRecord | None:
        """The recorded retention request of (action, operation id), or None."""
        with self._operation() as (q, conn):
            row = q.find_retention_action.one(
                conn, action=action.value, operation_id=operation_id.value
            )
            return None if row is None else _decode_record(row)

    def purge_batches(self, operation_base: str) -> tuple[int, retention.PurgeCounts]:
        """How many batches a purge recorded under `operation_base`, and what they deleted."""
        with self._operation() as (q, conn):
            row = q.find_purge_batches.one(conn, operation_prefix=f"{operation_base}:")
            if row is None:
                raise p.DecodeError("retention_action")
            counts = {name: _sum(row, column) for name, column in _COUNT_COLUMNS}
            return _int(row, "batches"), retention.PurgeCounts(**counts)

    def append_action(self, draft: retention.RetentionRecordDraft) -> retention.RetentionRecord:
        """Append a retention audit row and its chain link (ConcurrentModification: recorded)."""
        with self._operation() as (q, conn):
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
            record_id = _int(p.returned(row), "id", 1)
            link_audit_record(q, conn, AuditRecordKind.RETENTION_ACTION, record_id)
            return retention.RetentionRecord(id=record_id, **attrs.asdict(draft, recurse=False))

    def survey(
        self, request: retention.PurgePlanRequest, after: tuple[_dt.datetime, int] | None = None
    ) -> retention.PurgeSurvey:
        """The next batch of whole instance histories to purge, oldest first (read-only).

        An instance larger than the batch bound is taken alone. The cutoff is the server's
        clock minus `minimum_age`, so a client clock running ahead never makes a history old.
        """
        with self._operation() as (q, conn):
            rows = q.survey_purge_batch.many(
                conn,
                statuses=[status.value for status in request.statuses.ordered()],
                minimum_age_us=request.minimum_age // _dt.timedelta(microseconds=1),
                job_name=request.job_name.value,
                limit=request.batch.value,
                after_updated_at=_EPOCH if after is None else after[0],
                after_instance_id=0 if after is None else after[1],
            )
            if not rows:
                return retention.PurgeSurvey((), retention.PurgeCounts())
            candidates: list[retention.PurgeCandidate] = []
            final: dict[int, BatchStatus] = {}
            for row in rows:
                instance_id = _int(row, "job_instance_id", 1)
                execution_id = _int(row, "job_execution_id", 1)
                candidates.append(
                    retention.PurgeCandidate(instance_id, execution_id, _int(row, "version"))
                )
                if instance_id not in final:
                    final[instance_id] = p.enum_at(BatchStatus, row, "status")
            candidates.sort(key=retention.candidate_order)
            # Rows come oldest first: the last one is the keyset position of the batch.
            last = rows[-1]
            last_key = (p.aware_at(last, "updated_at"), _int(last, "job_instance_id", 1))
            counts = retention.PurgeCounts(
                **{name: _int(rows[0], name) for name in _HISTORY_ROW_COUNTS},
                job_executions=len(candidates),
                job_instances=len(final),
            )
            return retention.PurgeSurvey(
                tuple(candidates), counts, tuple(sorted(final.items())), last_key
            )

    def apply_purge(self, plan: retention.PurgePlan) -> PurgeResult:
        """Delete exactly the plan's histories, or nothing (RetentionPlanStale).

        Race: instances, then executions, are locked FOR UPDATE in id order, so a concurrent
        launch, restart, hold or transition either committed first (the re-validation on the
        locked rows finds it: stale) or waits and then finds the instance purged. Stale means
        an instance is gone or held, or the executions are not exactly the planned
        (instance, execution, version) triples (compared by SHA-256), or one is unresolved or
        no longer ends in a requested status.
        """
        with self._operation() as (q, conn):
            now = self._uow.clock.now()
            if plan.is_empty():
                return PurgeResult(retention.PurgeCounts(), PurgedAuditRecords())
            instance_ids = plan.instance_ids
            locked = p.returned(q.lock_purge_instances.one(conn, instance_ids=instance_ids))
            if _int(locked, "found") != len(instance_ids) or _int(locked, "held") != 0:
                raise RetentionPlanStale()
            check = p.returned(
                q.lock_purge_executions.one(
                    conn,
                    instance_ids=instance_ids,
                    statuses=[status.value for status in plan.request.statuses.ordered()],
                )
            )
            expected = hashlib.sha256(retention.candidate_encoding(plan.candidates)).digest()
            if (
                p.digest_at(check, "candidates_digest") != expected
                or _int(check, "unresolved") != 0
                or _int(check, "not_requested") != 0
            ):
                raise RetentionPlanStale()
            forget = plan.request.forget_instances
            deleted = p.returned(
                q.delete_purge_histories.one(
                    conn,
                    execution_ids=[candidate.job_execution_id for candidate in plan.candidates],
                    instance_ids=instance_ids,
                    purged_at=now,
                    tombstone=not forget,
                )
            )
            counts = retention.PurgeCounts(
                **{name: _int(deleted, name) for name in (*_HISTORY_ROW_COUNTS, "job_executions")}
            )
            audit_records = PurgedAuditRecords(
                *(_decode_ids(deleted, column) for column in attrs.fields_dict(PurgedAuditRecords))
            )
            if forget:
                q.detach_retention_actions.affected(conn, instance_ids=instance_ids)
                instances = q.delete_purge_instances.affected(conn, instance_ids=instance_ids)
            else:
                instances = _int(deleted, "tombstones")
            return PurgeResult(attrs.evolve(counts, job_instances=instances), audit_records)

    def mark_purged_audit_links(self, deleted: PurgedAuditRecords, retention_action_id: int) -> int:
        """Mark the links whose records this purge deleted, naming its retention action."""
        with self._operation() as (q, conn):
            return q.mark_purged_audit_links.affected(
                conn,
                retention_action_id=retention_action_id,
                operator_request_ids=list(deleted.operator_request_ids),
                recovery_decision_ids=list(deleted.recovery_decision_ids),
            )
