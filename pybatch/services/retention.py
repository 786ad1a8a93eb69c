"""The retention service: idempotent holds and purges of whole histories.

See docs/contract.md, Holds; Retention and purge.

Hold, release and each purge batch are requests with an operation id, replayed like
operator requests (a recorded request with the same retention request digest replays,
another digest is OperationIdConflict). A purge runs survey -> plan -> apply in bounded
batches; each batch is applied in one transaction with its audit record, and a batch whose
plan went stale (a hold, a restart, another purge) deletes nothing and is planned again.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import attrs

from pybatch.errors import (
    CommitOutcomeUnknown,
    ConcurrentModification,
    OperationIdConflict,
    OperationOutcomeUnknown,
    RetentionPlanStale,
)
from pybatch.repository.retention import PurgedAuditRecords
from pybatch.unit_of_work import UnitOfWork
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.retention import (
    PurgeCounts,
    PurgePlan,
    PurgePlanRequest,
    RetentionAction,
    RetentionRecord,
    RetentionRecordDraft,
    retention_request_digest,
)

if TYPE_CHECKING:
    from pybatch.job_repository import JobRepository

#: A survey's keyset position: the (latest updated_at, instance id) of the last instance taken.
_Key = tuple[_dt.datetime, int]

#: How often one batch is planned again after going stale before the purge gives up.
STALE_RETRIES = 5
#: The longest caller-chosen base of a purge's per-batch operation ids.
MAX_PURGE_OPERATION_BASE = 47


@attrs.frozen
class RetentionOutcome:
    """How a retention request was settled, with its audit record."""

    outcome: str
    record: RetentionRecord

    @property
    def counts(self) -> PurgeCounts:
        """Rows actually deleted (zero for holds and releases)."""
        return self.record.counts


@attrs.frozen
class _Applied:
    draft: RetentionRecordDraft
    purged: PurgedAuditRecords | None = None


@attrs.frozen
class PurgeProgress:
    """After each batch: the batch number, what it deleted and the running total."""

    batch: int
    outcome: RetentionOutcome
    total: PurgeCounts


class RetentionService:
    """Hold, release and purge, each idempotent by operation id and audited."""

    def __init__(self, repository: JobRepository) -> None:
        self.repository = repository

    # ------------------------------------------------------------------ holds

    def hold(
        self, operation_id: OperationId, actor: ActorRef, instance_id: int, reason: ReasonCode
    ) -> RetentionOutcome:
        """Place (or replace) the instance's hold: no purge takes it until released."""
        digest = retention_request_digest(RetentionAction.HOLD, f"instance:{instance_id}", reason)

        def effect(uow: UnitOfWork) -> _Applied:
            uow.holds.place(instance_id, actor, reason, uow.clock.now())
            return _Applied(
                self._draft(RetentionAction.HOLD, operation_id, actor, reason, digest, uow)
            )

        return self._submit(RetentionAction.HOLD, operation_id, digest, effect, instance_id)

    def release(
        self, operation_id: OperationId, actor: ActorRef, instance_id: int, reason: ReasonCode
    ) -> RetentionOutcome:
        """Clear the instance's hold (a release without a hold is recorded too)."""
        action = RetentionAction.RELEASE_HOLD
        digest = retention_request_digest(action, f"instance:{instance_id}", reason)

        def effect(uow: UnitOfWork) -> _Applied:
            uow.holds.release(instance_id)
            return _Applied(self._draft(action, operation_id, actor, reason, digest, uow))

        return self._submit(action, operation_id, digest, effect, instance_id)

    # ------------------------------------------------------------------ purge

    def plan(self, request: PurgePlanRequest) -> PurgePlan:
        """Survey the next batch in a rolled-back unit of work and seal it."""
        return self._plan(request, None)[0]

    def _plan(self, request: PurgePlanRequest, after: _Key | None) -> tuple[PurgePlan, _Key | None]:
        """The sealed plan of the next batch after `after`, and the keyset position it ends at."""
        with self.repository.begin() as uow:
            survey = uow.retention.survey(request, after)
        return PurgePlan.new(request, survey), survey.last_key

    def forecast(self, request: PurgePlanRequest) -> PurgeCounts:
        """What a purge would delete now, over every batch (read-only, for --dry-run)."""
        total, after = PurgeCounts(), None
        while True:
            with self.repository.begin() as uow:
                survey = uow.retention.survey(request, after)
            if not survey.candidates:
                return total
            total, after = total + survey.counts, survey.last_key

    def apply(
        self, operation_id: OperationId, actor: ActorRef, reason: ReasonCode, plan: PurgePlan
    ) -> RetentionOutcome:
        """Apply one sealed plan with its audit record, or nothing (RetentionPlanStale)."""
        action = RetentionAction.APPLY_PURGE
        digest = retention_request_digest(action, f"plan:{plan.digest.hex()}", reason)

        def effect(uow: UnitOfWork) -> _Applied:
            result = uow.retention.apply_purge(plan)
            draft = self._draft(
                action,
                operation_id,
                actor,
                reason,
                digest,
                uow,
                plan_digest=plan.digest,
                batch_bound=plan.request.batch.value,
                counts=result.counts,
            )
            return _Applied(draft, result.audit_records)

        return self._submit(action, operation_id, digest, effect, None)

    def purge(
        self,
        request: PurgePlanRequest,
        operation_base: str,
        actor: ActorRef,
        reason: ReasonCode,
    ) -> Iterator[PurgeProgress]:
        """Purge batch after batch until nothing is left; yield after each batch.

        Each batch's operation id is `<operation_base>:<first 16 hex of its plan digest>`,
        so re-running an interrupted purge with the same base replays a batch that was
        applied and goes on with the rest.

        Each survey starts where the previous batch ended (the keyset of its oldest-first
        order), so it never walks again over what was purged or passed over; when that
        finds nothing, one more survey from the start catches any instance that became a
        candidate behind it (a hold released meanwhile), and the purge ends when that one
        finds nothing either.

        Raises:
            RetentionPlanStale: one batch went stale STALE_RETRIES times in a row.
        """
        if not 1 <= len(operation_base) <= MAX_PURGE_OPERATION_BASE:
            raise ValueError(
                f"the operation id of a purge is 1 to {MAX_PURGE_OPERATION_BASE} bytes"
            )
        total, batch, stale = PurgeCounts(), 0, 0
        after: _Key | None = None
        while True:
            plan, last_key = self._plan(request, after)
            if plan.is_empty():
                if after is None:
                    return
                after = None  # once more from the start
                continue
            operation_id = OperationId(f"{operation_base}:{plan.digest.hex()[:16]}")
            try:
                outcome = self.apply(operation_id, actor, reason, plan)
            except RetentionPlanStale:
                stale += 1
                if stale >= STALE_RETRIES:
                    raise
                continue
            stale, after = 0, last_key
            batch += 1
            total = total + outcome.counts
            yield PurgeProgress(batch, outcome, total)
            if outcome.outcome == "REPLAYED" and outcome.counts == PurgeCounts():
                return  # nothing more can change by repeating this plan

    # ------------------------------------------------------------------ mechanics

    @staticmethod
    def _draft(
        action: RetentionAction,
        operation_id: OperationId,
        actor: ActorRef,
        reason: ReasonCode,
        digest: bytes,
        uow: UnitOfWork,
        *,
        plan_digest: bytes | None = None,
        batch_bound: int | None = None,
        counts: PurgeCounts | None = None,
    ) -> RetentionRecordDraft:
        return RetentionRecordDraft(
            action=action,
            operation_id=operation_id,
            actor=actor,
            reason=reason,
            request_digest=digest,
            job_instance_id=None,
            plan_digest=plan_digest,
            batch_bound=batch_bound,
            counts=counts or PurgeCounts(),
            outcome="APPLIED",
            applied_at=uow.clock.now(),
        )

    def _probe(
        self, action: RetentionAction, operation_id: OperationId, digest: bytes
    ) -> RetentionOutcome | None:
        with self.repository.begin() as uow:
            recorded = uow.retention.find_action(action, operation_id)
        if recorded is None:
            return None
        if recorded.request_digest != digest:
            raise OperationIdConflict(action=action.value, operation_id=operation_id.value)
        return RetentionOutcome("REPLAYED", recorded)

    def _submit(
        self,
        action: RetentionAction,
        operation_id: OperationId,
        digest: bytes,
        effect: Callable[[UnitOfWork], _Applied],
        instance_id: int | None,
    ) -> RetentionOutcome:
        replay = self._probe(action, operation_id, digest)
        if replay is not None:
            return replay
        with self.repository.begin() as uow:
            applied = effect(uow)
            draft = applied.draft
            if instance_id is not None:
                draft = attrs.evolve(draft, job_instance_id=instance_id)
            try:
                record = uow.retention.append_action(draft)
            except ConcurrentModification:
                uow.rollback()
                again = self._probe(action, operation_id, digest)
                if again is None:
                    raise
                return again
            if applied.purged is not None and not applied.purged.is_empty():
                uow.retention.mark_purged_audit_links(applied.purged, record.id)
            try:
                uow.commit()
            except CommitOutcomeUnknown:
                raise OperationOutcomeUnknown() from None
        return RetentionOutcome("APPLIED", record)
