"""The retention service: idempotent holds and purges of whole histories.

Hold, release and each purge batch replay by operation id like operator requests. A purge runs
survey -> plan -> apply in bounded batches, each in one transaction with its audit record; a
batch whose plan went stale deletes nothing and is replanned.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import attrs

from pybatch import errors as e
from pybatch._repository.retention import PurgedAuditRecords
from pybatch._unit_of_work import UnitOfWork
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.retention import (
    PurgeCounts,
    PurgePlan,
    PurgePlanRequest,
    PurgeSurvey,
    RetentionAction,
    RetentionRecord,
    RetentionRecordDraft,
    retention_request_digest,
)

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository

#: A survey's keyset position: the (latest updated_at, instance id) of the last instance taken.
_Key = tuple[_dt.datetime, int]

STALE_RETRIES = 5  # Replans of one stale batch before the purge gives up.
MAX_PURGE_OPERATION_BASE = 47  # Longest caller-chosen base of a purge's per-batch operation ids.


@attrs.frozen
class RetentionOutcome:
    """How a retention request was settled, with its audit record."""

    #: APPLIED, REPLAYED, or NOOP: applied with nothing to change (the record says APPLIED).
    outcome: str
    record: RetentionRecord
    #: For NOOP: what was already so.
    detail: str = ""

    def describe(self) -> str:
        """One line: the outcome, the action, the operation id (and for NOOP, why)."""
        record = self.record
        line = f"{self.outcome} {record.action.value} operation {record.operation_id.value}"
        return f"{line}: {self.detail}" if self.detail else line

    @property
    def counts(self) -> PurgeCounts:
        """Rows actually deleted (zero for holds and releases)."""
        return self.record.counts


@attrs.frozen
class _Applied:
    """What an effect did, for its audit record."""

    job_instance_id: int | None = None
    plan_digest: bytes | None = None
    batch_bound: int | None = None
    counts: PurgeCounts = attrs.Factory(PurgeCounts)
    purged: PurgedAuditRecords | None = None
    #: Set when nothing was changed: what was already so (the outcome is NOOP).
    noop: str = ""


@attrs.frozen
class PurgeProgress:
    """After each batch: the batch number, what it deleted and the running total."""

    batch: int
    outcome: RetentionOutcome
    total: PurgeCounts


@attrs.frozen
class PurgeSummary:
    """How a whole purge was settled: APPLIED (a batch deleted), REPLAYED (all recorded), NOOP."""

    outcome: str
    operation_base: str
    batches: int
    total: PurgeCounts

    def describe(self) -> str:
        """One line: the outcome, the operation id and the batches."""
        line = f"{self.outcome} PURGE operation {self.operation_base}"
        if self.outcome == "NOOP":
            return f"{line}: nothing to purge"
        if self.outcome == "REPLAYED":
            return f"{line}: {self.batches} batches recorded before, nothing left to purge"
        return f"{line}: purged in {self.batches} batches"


class RetentionService:
    """Hold, release and purge, each idempotent by operation id and audited."""

    def __init__(self, repository: JobRepository) -> None:
        self.repository = repository

    def hold(
        self, operation_id: OperationId, actor: ActorRef, instance_id: int, reason: ReasonCode
    ) -> RetentionOutcome:
        """Place (or replace) the instance's hold: no purge takes it until released."""

        def effect(uow: UnitOfWork) -> _Applied:
            hold, placed = uow.holds.place_unless_held(instance_id, actor, reason, uow.clock.now())
            since = f"{hold.placed_at:%Y-%m-%d %H:%M:%S}"
            noop = (
                f"the hold already exists ({hold.reason.value} by {hold.actor.value} since {since})"
            )
            return _Applied(job_instance_id=instance_id, noop="" if placed else noop)

        target = f"instance:{instance_id}"
        return self._submit(RetentionAction.HOLD, operation_id, actor, reason, target, effect)

    def release(
        self, operation_id: OperationId, actor: ActorRef, instance_id: int, reason: ReasonCode
    ) -> RetentionOutcome:
        """Clear the instance's hold (a release without a hold is recorded too)."""

        def effect(uow: UnitOfWork) -> _Applied:
            noop = "the instance has no hold" if uow.holds.release(instance_id) is None else ""
            return _Applied(job_instance_id=instance_id, noop=noop)

        action, target = RetentionAction.RELEASE_HOLD, f"instance:{instance_id}"
        return self._submit(action, operation_id, actor, reason, target, effect)

    def plan(self, request: PurgePlanRequest) -> PurgePlan:
        """Survey the next batch in a rolled-back unit of work and seal it."""
        return PurgePlan.new(request, self._survey(request, None))

    def _survey(self, request: PurgePlanRequest, after: _Key | None) -> PurgeSurvey:
        """The next batch after the keyset position `after`, in a rolled-back unit of work."""
        with self.repository.begin() as uow:
            return uow.retention.survey(request, after)

    def forecast(self, request: PurgePlanRequest) -> PurgeCounts:
        """What a purge would delete now, over every batch (read-only, for --dry-run)."""
        total, after = PurgeCounts(), None
        while True:
            survey = self._survey(request, after)
            if not survey.candidates:
                return total
            total, after = total + survey.counts, survey.last_key

    def apply(
        self, operation_id: OperationId, actor: ActorRef, reason: ReasonCode, plan: PurgePlan
    ) -> RetentionOutcome:
        """Apply one sealed plan with its audit record, or nothing (RetentionPlanStale)."""

        def effect(uow: UnitOfWork) -> _Applied:
            result = uow.retention.apply_purge(plan)
            bound = plan.request.batch.value
            return _Applied(None, plan.digest, bound, result.counts, result.audit_records)

        action, target = RetentionAction.APPLY_PURGE, f"plan:{plan.digest.hex()}"
        return self._submit(action, operation_id, actor, reason, target, effect)

    def purge(
        self, request: PurgePlanRequest, operation_base: str, actor: ActorRef, reason: ReasonCode
    ) -> Iterator[PurgeProgress]:
        """Purge batch after batch until nothing is left; yield after each batch.

        A batch's operation id is `<operation_base>:<16 hex of its plan digest>`, so a rerun
        replays applied batches and goes on. A last survey from the start catches instances
        that became candidates behind the keyset; STALE_RETRIES stale plans raise.
        """
        if len(OperationId(operation_base).value) > MAX_PURGE_OPERATION_BASE:  # checked now
            raise e.RequestFieldInvalid(
                field="operation id of a purge",
                rule=e.TextRule.TOO_LONG,
                max_bytes=MAX_PURGE_OPERATION_BASE,
            )
        return self._purge(request, operation_base, actor, reason)

    def _purge(
        self, request: PurgePlanRequest, operation_base: str, actor: ActorRef, reason: ReasonCode
    ) -> Iterator[PurgeProgress]:
        total, batch, stale = PurgeCounts(), 0, 0
        after: _Key | None = None
        while True:
            survey = self._survey(request, after)
            plan = PurgePlan.new(request, survey)
            if plan.is_empty():
                if after is None:
                    return
                after = None  # once more from the start
                continue
            operation_id = OperationId(f"{operation_base}:{plan.digest.hex()[:16]}")
            try:
                outcome = self.apply(operation_id, actor, reason, plan)
            except e.RetentionPlanStale:
                stale += 1
                if stale >= STALE_RETRIES:
                    raise
                continue
            stale, after = 0, survey.last_key
            batch += 1
            total = total + outcome.counts
            yield PurgeProgress(batch, outcome, total)
            if outcome.outcome == "REPLAYED" and outcome.counts == PurgeCounts():
                return  # nothing more can change by repeating this plan

    def summarize(self, operation_base: str, batches: list[PurgeProgress]) -> PurgeSummary:
        """How the purge that yielded `batches` under `operation_base` was settled."""
        if any(batch.outcome.outcome == "APPLIED" for batch in batches):
            return PurgeSummary("APPLIED", operation_base, len(batches), batches[-1].total)
        with self.repository.begin() as uow:
            recorded, total = uow.retention.purge_batches(operation_base)
        if recorded:
            return PurgeSummary("REPLAYED", operation_base, recorded, total)
        return PurgeSummary("NOOP", operation_base, 0, PurgeCounts())

    def _probe(
        self, action: RetentionAction, operation_id: OperationId, digest: bytes
    ) -> RetentionOutcome | None:
        with self.repository.begin() as uow:
            recorded = uow.retention.find_action(action, operation_id)
        if recorded is None:
            return None
        if recorded.request_digest != digest:
            raise e.OperationIdConflict(action=action.value, operation_id=operation_id.value)
        return RetentionOutcome("REPLAYED", recorded)

    def _submit(
        self,
        action: RetentionAction,
        operation_id: OperationId,
        actor: ActorRef,
        reason: ReasonCode,
        target: str,
        effect: Callable[[UnitOfWork], _Applied],
    ) -> RetentionOutcome:
        digest = retention_request_digest(action, target, reason)
        if (replay := self._probe(action, operation_id, digest)) is not None:
            return replay
        with self.repository.begin() as uow:
            applied = effect(uow)
            draft = RetentionRecordDraft(
                action=action,
                operation_id=operation_id,
                actor=actor,
                reason=reason,
                request_digest=digest,
                job_instance_id=applied.job_instance_id,
                plan_digest=applied.plan_digest,
                batch_bound=applied.batch_bound,
                counts=applied.counts,
                outcome="APPLIED",
                applied_at=uow.clock.now(),
            )
            try:
                record = uow.retention.append_action(draft)
            except e.ConcurrentModification:
                uow.rollback()
                if (again := self._probe(action, operation_id, digest)) is None:
                    raise
                return again
            if applied.purged is not None and not applied.purged.is_empty():
                uow.retention.mark_purged_audit_links(applied.purged, record.id)
            try:
                uow.commit()
            except e.CommitOutcomeUnknown:
                raise e.OperationOutcomeUnknown() from None
        return RetentionOutcome("NOOP" if applied.noop else "APPLIED", record, applied.noop)
