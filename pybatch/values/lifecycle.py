"""Lifecycle transitions: the table, execution metadata and the checked apply.

The repository locks the row, applies a transition to the decoded metadata and writes the result
with a version compare-and-swap; any error leaves the record unchanged (nothing is written).
"""

from __future__ import annotations

import datetime as _dt
import types
from collections.abc import Mapping

import attrs

from pybatch import errors as e
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import INT64_MAX, aware_utc, is_, maybe
from pybatch.values.names import ExitCode
from pybatch.values.status import BatchStatus, FailureSummary


def _optional_utc(value: _dt.datetime | None) -> _dt.datetime | None:
    return None if value is None else aware_utc(value)


@attrs.frozen
class ExecutionTimestamps:
    """Creation, start and end instants of an execution, in order."""

    created_at: _dt.datetime = attrs.field(converter=aware_utc)
    started_at: _dt.datetime | None = attrs.field(default=None, converter=_optional_utc)
    ended_at: _dt.datetime | None = attrs.field(default=None, converter=_optional_utc)

    def __attrs_post_init__(self) -> None:
        if self.started_at is not None and self.started_at < self.created_at:
            raise e.InvalidTimestampOrder()
        lower = self.started_at if self.started_at is not None else self.created_at
        if self.ended_at is not None and self.ended_at < lower:
            raise e.InvalidTimestampOrder()


_S = BatchStatus
#: The transition table (docs/contract.md, Transition table): from-status -> allowed targets.
#: Everything else is illegal, including self-transitions and every transition to STARTING.
TRANSITIONS: Mapping[BatchStatus, frozenset[BatchStatus]] = types.MappingProxyType(
    {
        _S.STARTING: frozenset({_S.STARTED, _S.STOPPING, _S.FAILED, _S.UNKNOWN}),
        _S.STARTED: frozenset({_S.STOPPING, _S.STOPPED, _S.FAILED, _S.COMPLETED, _S.UNKNOWN}),
        _S.STOPPING: frozenset({_S.STOPPED, _S.FAILED, _S.UNKNOWN}),
        _S.STOPPED: frozenset({_S.ABANDONED}),
        _S.FAILED: frozenset({_S.ABANDONED}),
        _S.UNKNOWN: frozenset({_S.FAILED, _S.ABANDONED}),
        _S.COMPLETED: frozenset(),
        _S.ABANDONED: frozenset(),
    }
)


def is_legal_transition(from_status: BatchStatus, to_status: BatchStatus) -> bool:
    """Whether the transition table allows `from_status -> to_status`."""
    return to_status in TRANSITIONS[from_status]


@attrs.frozen
class LifecycleTransition:
    """A requested transition: target status, caller-supplied instant, failure, rollback flag."""

    target: BatchStatus = attrs.field(validator=is_(BatchStatus))
    at: _dt.datetime = attrs.field(converter=aware_utc)
    failure: FailureSummary | None = attrs.field(default=None, validator=maybe(FailureSummary))
    terminal_rollback: bool = attrs.field(default=False, kw_only=True, validator=is_(bool))

    @classmethod
    def new(cls, target: BatchStatus, at: _dt.datetime) -> LifecycleTransition:
        """A transition that introduces no failure."""
        return cls(target=target, at=at)

    @classmethod
    def failed(cls, at: _dt.datetime, failure: FailureSummary) -> LifecycleTransition:
        """A transition to FAILED carrying its redacted failure summary."""
        return cls(target=BatchStatus.FAILED, at=at, failure=failure)


@attrs.frozen(kw_only=True)
class ExecutionMetadata:
    """Status, exit, timestamps, counters and failure of an execution (docs/contract.md, Values)."""

    status: BatchStatus = attrs.field(validator=is_(BatchStatus))
    exit_status: ExitCode = attrs.field(validator=is_(ExitCode))
    timestamps: ExecutionTimestamps = attrs.field(validator=is_(ExecutionTimestamps))
    counts: ExecutionCounts = attrs.field(factory=ExecutionCounts, validator=is_(ExecutionCounts))
    failure: FailureSummary | None = attrs.field(default=None, validator=maybe(FailureSummary))

    def __attrs_post_init__(self) -> None:
        ended = self.timestamps.ended_at is not None
        if self.status.is_active and ended:
            raise e.ActiveExecutionHasEndTime()
        if self.status.is_finished and not ended:
            raise e.FinishedExecutionMissingEndTime()
        if self.status is BatchStatus.FAILED and self.failure is None:
            raise e.FailedExecutionMissingFailure()


def apply_transition(
    metadata: ExecutionMetadata,
    version: int,
    expected_version: int,
    transition: LifecycleTransition,
    *,
    counts_apply: bool,
) -> tuple[ExecutionMetadata, int]:
    """The metadata after `transition` and `version + 1`; a stale version is refused first.

    `counts_apply`: step executions, whose terminal rollback increments `rolled_back`.
    """
    if type(version) is not int or type(expected_version) is not int:
        raise TypeError("versions are int (bool is not accepted)")
    if expected_version != version:
        raise e.StaleVersion(expected=expected_version, actual=version)
    current, target = metadata.status, transition.target
    if current in (BatchStatus.STOPPED, BatchStatus.FAILED) and target is BatchStatus.STARTING:
        raise e.RestartRequiresNewAttempt(from_status=current.value)
    if not is_legal_transition(current, target):
        raise e.IllegalTransition(from_status=current.value, to_status=target.value)
    if target is BatchStatus.FAILED and transition.failure is None:
        raise e.FailedTransitionMissingFailure()
    times = metadata.timestamps
    lower = times.started_at if times.started_at is not None else times.created_at
    if transition.at < lower or (times.ended_at is not None and transition.at < times.ended_at):
        raise e.InvalidTransitionTime() from e.InvalidTimestampOrder()

    started_at = transition.at if target is BatchStatus.STARTED else times.started_at
    ended_at = (times.ended_at or transition.at) if target.is_finished else None
    counts = metadata.counts
    if transition.terminal_rollback and counts_apply:
        counts = counts.with_terminal_rollback()
    if version >= INT64_MAX:  # bounded by storage (bigint), not by the unsigned 64-bit range
        raise e.VersionExhausted(version=version)
    # The checks above leave the new metadata valid: FAILED carries a failure, and the instants
    # keep their order with an end time exactly when the target is finished.
    updated = ExecutionMetadata(
        status=target,
        exit_status=metadata.exit_status,  # transitions never change the exit status
        timestamps=ExecutionTimestamps(times.created_at, started_at, ended_at),
        counts=counts,
        failure=transition.failure if transition.failure is not None else metadata.failure,
    )
    return updated, version + 1
