"""Retention vocabulary: holds, purge requests and plans, retention records.

A purge takes whole instance histories; a plan's digest binds the request and every (instance,
execution, version), so apply can tell whether anything changed since the survey.
"""

from __future__ import annotations

import datetime as _dt
import struct
from collections.abc import Iterable

import attrs

from pybatch import errors as e
from pybatch.values._canonical import CanonicalWriter
from pybatch.values.ids import Code, aware_utc, digest, is_
from pybatch.values.names import ActorRef, JobName, OperationId, ReasonCode
from pybatch.values.status import BatchStatus

PLAN_DIGEST_DOMAIN = "oxide-batch.retention-plan.v1"
RETENTION_DIGEST_DOMAIN = "pybatch.retention-request.v1"
MINIMUM_AGE = _dt.timedelta(hours=1)
DEFAULT_MINIMUM_AGE = _dt.timedelta(days=30)
#: The finished statuses in declaration order: STOPPED, FAILED, COMPLETED, ABANDONED.
_TERMINAL_ORDER = tuple(status for status in BatchStatus if status.is_finished)


@attrs.frozen
class PurgeBatchBound:
    """How many executions one purge batch may delete: 1 to 1000 (default 1000)."""

    value: int = 1000

    def __attrs_post_init__(self) -> None:
        if type(self.value) is not int or not 1 <= self.value <= 1000:
            raise e.BatchBoundOutOfRange(requested=int(self.value))


@attrs.frozen
class TerminalStatusSet:
    """A non-empty set of finished statuses a purge may take (checked however it is built)."""

    statuses: frozenset[BatchStatus] = attrs.field(
        validator=attrs.validators.deep_iterable(is_(BatchStatus), is_(frozenset))
    )

    def __attrs_post_init__(self) -> None:
        if not self.statuses:
            raise e.EmptyStatusSet()
        for status in BatchStatus:  # declaration order: the first offender is reported
            if status in self.statuses and status not in _TERMINAL_ORDER:
                raise e.NonTerminalStatus(status=status.value)

    @classmethod
    def of(cls, statuses: Iterable[BatchStatus]) -> TerminalStatusSet:
        """Validate and build; an active or UNKNOWN status is refused."""
        return cls(frozenset(statuses))

    def ordered(self) -> list[BatchStatus]:
        """In declaration order STOPPED, FAILED, COMPLETED, ABANDONED."""
        return [status for status in _TERMINAL_ORDER if status in self.statuses]


@attrs.frozen(kw_only=True)
class PurgePlanRequest:
    """What to purge: finished histories of one job, older than `minimum_age` (at least 1 h)."""

    job_name: JobName
    statuses: TerminalStatusSet
    minimum_age: _dt.timedelta = DEFAULT_MINIMUM_AGE
    batch: PurgeBatchBound = PurgeBatchBound()
    #: Delete the instance rows too (erasure) instead of leaving tombstones.
    forget_instances: bool = False

    def __attrs_post_init__(self) -> None:
        if self.minimum_age < MINIMUM_AGE:
            raise e.AgeBoundTooSmall(minimum="1 hour")


@attrs.frozen(order=True)
class PurgeCandidate:
    """One execution of a candidate instance, at the version the survey saw."""

    job_instance_id: int
    job_execution_id: int
    version: int


_CANDIDATE = struct.Struct(">QQQ")


def candidate_encoding(candidates: Iterable[PurgeCandidate]) -> bytes:
    """u64be (instance, execution, version) of each candidate; apply compares its locked rows'."""
    pack = _CANDIDATE.pack
    return b"".join([pack(c.job_instance_id, c.job_execution_id, c.version) for c in candidates])


def candidate_order(candidate: PurgeCandidate) -> tuple[int, int, int]:
    """The sort key of PurgeCandidate's own order, as a plain tuple (much faster to compare)."""
    return (candidate.job_instance_id, candidate.job_execution_id, candidate.version)


@attrs.frozen
class PurgeCounts:
    """Rows per table, in deletion order; `job_instances` counts tombstoned or deleted ones."""

    flow_decisions: int = 0
    recovery_decisions: int = 0
    operator_requests: int = 0
    step_partitions: int = 0
    step_executions: int = 0
    job_executions: int = 0
    job_instances: int = 0

    def __add__(self, other: PurgeCounts) -> PurgeCounts:
        return PurgeCounts(
            *(a + b for a, b in zip(attrs.astuple(self), attrs.astuple(other), strict=True))
        )

    def as_dict(self) -> dict[str, int]:
        """Table name to rows."""
        return attrs.asdict(self)


@attrs.frozen
class PurgeSurvey:
    """The candidates a survey found, and the rows a purge of them would delete."""

    candidates: tuple[PurgeCandidate, ...]
    counts: PurgeCounts
    #: Latest status per candidate instance (for tombstones and the dry-run report).
    final_statuses: tuple[tuple[int, BatchStatus], ...] = ()
    #: The (latest updated_at, instance id) of the last instance taken: a dry run's next page.
    last_key: tuple[_dt.datetime, int] | None = None


@attrs.frozen(kw_only=True)
class PurgePlan:
    """A sealed survey: apply deletes exactly these candidates, or nothing (RetentionPlanStale)."""

    request: PurgePlanRequest
    candidates: tuple[PurgeCandidate, ...]
    counts: PurgeCounts
    final_statuses: tuple[tuple[int, BatchStatus], ...]
    digest: bytes = attrs.field(repr=lambda value: value.hex())

    @classmethod
    def new(cls, request: PurgePlanRequest, survey: PurgeSurvey) -> PurgePlan:
        """Seal a survey with the plan digest of docs/contract.md, Retention vocabulary."""
        candidates = tuple(sorted(survey.candidates, key=candidate_order))
        writer = CanonicalWriter(PLAN_DIGEST_DOMAIN, request.job_name.value)
        writer.text(*(status.value for status in request.statuses.ordered()))
        writer.u64(int(request.minimum_age.total_seconds()))
        writer.u64(request.batch.value)
        writer.raw(candidate_encoding(candidates))
        if request.forget_instances:
            writer.text("forget_instances")  # absent by default: the upstream digest unchanged
        return cls(
            request=request,
            candidates=candidates,
            counts=survey.counts,
            final_statuses=survey.final_statuses,
            digest=writer.digest(),
        )

    def is_empty(self) -> bool:
        """No candidates: apply deletes nothing."""
        return not self.candidates

    @property
    def instance_ids(self) -> list[int]:
        """The candidate instances, ascending."""
        return sorted({candidate.job_instance_id for candidate in self.candidates})


class RetentionAction(Code):
    """A retention action; with the operation id, the idempotency key."""

    HOLD = "HOLD"
    RELEASE_HOLD = "RELEASE_HOLD"
    APPLY_PURGE = "APPLY_PURGE"


@attrs.frozen(kw_only=True)
class RetentionHold:
    """A hold keeps an instance out of every purge; it never blocks lifecycle operations."""

    job_instance_id: int
    actor: ActorRef
    reason: ReasonCode
    placed_at: _dt.datetime = attrs.field(converter=aware_utc)


def retention_request_digest(action: RetentionAction, target: str, reason: ReasonCode) -> bytes:
    """The retention request digest: action, target and reason, not the actor."""
    return CanonicalWriter(RETENTION_DIGEST_DOMAIN, action.value, target, reason.value).digest()


@attrs.frozen(kw_only=True)
class RetentionRecordDraft:
    """A retention audit row about to be appended."""

    action: RetentionAction
    operation_id: OperationId
    actor: ActorRef
    reason: ReasonCode
    request_digest: bytes = attrs.field(validator=digest)
    job_instance_id: int | None
    plan_digest: bytes | None
    batch_bound: int | None
    counts: PurgeCounts
    outcome: str
    applied_at: _dt.datetime = attrs.field(converter=aware_utc)

    def __attrs_post_init__(self) -> None:
        purge = self.action is RetentionAction.APPLY_PURGE
        if purge != (self.plan_digest is not None) or purge != (self.batch_bound is not None):
            raise ValueError("APPLY_PURGE carries a plan digest and a batch bound; others none")


@attrs.frozen(kw_only=True)
class RetentionRecord(RetentionRecordDraft):
    """A stored retention audit row."""

    id: int
