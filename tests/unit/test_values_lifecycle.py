"""Lifecycle table and checked transitions, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs
import pytest

from pybatch import errors
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import INT64_MAX, FailureId
from pybatch.values.lifecycle import (
    TRANSITIONS,
    ExecutionMetadata,
    ExecutionTimestamps,
    LifecycleTransition,
    apply_transition,
    is_legal_transition,
)
from pybatch.values.names import ExitCode
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

S = BatchStatus
T0 = datetime(2026, 3, 1, 12, 0, 0, 1, tzinfo=UTC)
FAILURE = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(42))
OTHER_FAILURE = FailureSummary(FailureCategory.TIMEOUT, FailureId(43))

ALLOWED = {
    (S.STARTING, S.STARTED),
    (S.STARTING, S.STOPPING),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.UNKNOWN),
    (S.STARTED, S.STOPPING),
    (S.STARTED, S.STOPPED),
    (S.STARTED, S.FAILED),
    (S.STARTED, S.COMPLETED),
    (S.STARTED, S.UNKNOWN),
    (S.STOPPING, S.STOPPED),
    (S.STOPPING, S.FAILED),
    (S.STOPPING, S.UNKNOWN),
    (S.STOPPED, S.ABANDONED),
    (S.FAILED, S.ABANDONED),
    (S.UNKNOWN, S.FAILED),
    (S.UNKNOWN, S.ABANDONED),
}


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def metadata_in(status: BatchStatus) -> ExecutionMetadata:
    """A valid metadata snapshot in `status` (created T0, started +1 s, ended +2 s if finished)."""
    started = None if status is S.STARTING else at(1)
    ended = at(2) if status.is_finished else None
    return ExecutionMetadata(
        status=status,
        exit_status=ExitCode("UNKNOWN"),
        timestamps=ExecutionTimestamps(T0, started, ended),
        failure=FAILURE if status is S.FAILED else None,
    )


def transition_to(target: BatchStatus, when: datetime) -> LifecycleTransition:
    if target is S.FAILED:
        return LifecycleTransition.failed(when, OTHER_FAILURE)
    return LifecycleTransition.new(target, when)


def test_table_as_data() -> None:
    assert {(f, t) for f, targets in TRANSITIONS.items() for t in targets} == ALLOWED
    assert set(TRANSITIONS) == set(BatchStatus)


@pytest.mark.parametrize("source", list(BatchStatus))
@pytest.mark.parametrize("target", list(BatchStatus))
def test_legal_transitions_apply_and_illegal_ones_name_both_statuses(
    source: BatchStatus, target: BatchStatus
) -> None:
    """Scenario B2."""
    metadata = metadata_in(source)
    transition = transition_to(target, at(3))
    if (source, target) in ALLOWED:
        updated, version = apply_transition(metadata, 4, 4, transition, counts_apply=True)
        assert updated.status is target
        assert version == 5
        assert is_legal_transition(source, target)
    elif source in (S.STOPPED, S.FAILED) and target is S.STARTING:
        with pytest.raises(errors.RestartRequiresNewAttempt) as restart:
            apply_transition(metadata, 4, 4, transition, counts_apply=True)
        assert restart.value.from_status == source.value
    else:
        with pytest.raises(errors.IllegalTransition) as illegal:
            apply_transition(metadata, 4, 4, transition, counts_apply=True)
        assert (illegal.value.from_status, illegal.value.to_status) == (source.value, target.value)


def test_start_sets_started_at_and_keeps_exit() -> None:
    """Scenario B1."""
    updated, version = apply_transition(
        metadata_in(S.STARTING),
        0,
        0,
        LifecycleTransition.new(S.STARTED, at(5)),
        counts_apply=True,
    )
    assert (updated.status, updated.timestamps.started_at, version) == (S.STARTED, at(5), 1)
    assert updated.exit_status == ExitCode("UNKNOWN")
    assert updated.timestamps.ended_at is None


def test_failed_needs_a_failure_and_sets_ended_at() -> None:
    """Scenario B3."""
    started = metadata_in(S.STARTED)
    with pytest.raises(errors.FailedTransitionMissingFailure):
        apply_transition(started, 1, 1, LifecycleTransition.new(S.FAILED, at(3)), counts_apply=True)
    updated, _ = apply_transition(
        started, 1, 1, LifecycleTransition.failed(at(3), FAILURE), counts_apply=True
    )
    assert (updated.failure, updated.timestamps.ended_at) == (FAILURE, at(3))


def test_transition_time_before_start_or_end_is_refused() -> None:
    """Scenario B4."""
    started = metadata_in(S.STARTED)  # started at +1 s
    with pytest.raises(errors.InvalidTransitionTime) as error:
        apply_transition(started, 1, 1, LifecycleTransition.new(S.STOPPING, T0), counts_apply=True)
    assert isinstance(error.value.__cause__, errors.InvalidTimestampOrder)
    failed = metadata_in(S.FAILED)  # ended at +2 s
    with pytest.raises(errors.InvalidTransitionTime):
        apply_transition(
            failed, 1, 1, LifecycleTransition.new(S.ABANDONED, at(1)), counts_apply=True
        )
    # equal instants are allowed
    apply_transition(started, 1, 1, LifecycleTransition.new(S.STOPPING, at(1)), counts_apply=True)


def test_abandon_keeps_end_time_and_failure() -> None:
    """Scenario B5."""
    updated, _ = apply_transition(
        metadata_in(S.FAILED),
        2,
        2,
        LifecycleTransition.new(S.ABANDONED, at(9)),
        counts_apply=True,
    )
    assert (updated.status, updated.timestamps.ended_at, updated.failure) == (
        S.ABANDONED,
        at(2),
        FAILURE,
    )


def test_unknown_has_no_end_then_failed_sets_it() -> None:
    """Scenario B6."""
    unknown, version = apply_transition(
        metadata_in(S.STARTED), 1, 1, LifecycleTransition.new(S.UNKNOWN, at(3)), counts_apply=True
    )
    assert unknown.timestamps.ended_at is None
    failed, version = apply_transition(
        unknown, version, version, LifecycleTransition.failed(at(4), FAILURE), counts_apply=True
    )
    assert failed.timestamps.ended_at == at(4)
    assert version == 3


def test_stale_version_is_checked_first() -> None:
    """Scenario B7."""
    completed = metadata_in(S.COMPLETED)
    with pytest.raises(errors.StaleVersion) as error:
        apply_transition(completed, 5, 4, LifecycleTransition.new(S.STARTED, T0), counts_apply=True)
    assert (error.value.expected, error.value.actual) == (4, 5)
    assert isinstance(error.value, errors.LifecycleError)
    assert isinstance(error.value, errors.RepositoryError)


def test_terminal_rollback_counts_only_on_steps() -> None:
    """Scenario B8."""
    transition = LifecycleTransition(S.FAILED, at(3), FAILURE, terminal_rollback=True)
    step, _ = apply_transition(metadata_in(S.STARTED), 1, 1, transition, counts_apply=True)
    job, _ = apply_transition(metadata_in(S.STARTED), 1, 1, transition, counts_apply=False)
    assert step.counts.rolled_back == 1
    assert job.counts == ExecutionCounts()
    exhausted = attrs.evolve(metadata_in(S.STARTED), counts=ExecutionCounts(rolled_back=INT64_MAX))
    with pytest.raises(errors.CountExhausted):
        apply_transition(exhausted, 1, 1, transition, counts_apply=True)


def test_version_exhausted_at_the_storage_bound() -> None:
    started = metadata_in(S.STARTED)
    with pytest.raises(errors.VersionExhausted) as error:
        apply_transition(
            started,
            INT64_MAX,
            INT64_MAX,
            LifecycleTransition.new(S.STOPPING, at(3)),
            counts_apply=True,
        )
    assert error.value.version == INT64_MAX
    _, version = apply_transition(
        started,
        INT64_MAX - 1,
        INT64_MAX - 1,
        LifecycleTransition.new(S.STOPPING, at(3)),
        counts_apply=True,
    )
    assert version == INT64_MAX


def test_metadata_invariants() -> None:
    with pytest.raises(errors.ActiveExecutionHasEndTime):
        ExecutionMetadata(
            status=S.STARTED,
            exit_status=ExitCode("UNKNOWN"),
            timestamps=ExecutionTimestamps(T0, T0, at(1)),
        )
    with pytest.raises(errors.FinishedExecutionMissingEndTime):
        ExecutionMetadata(
            status=S.COMPLETED, exit_status=ExitCode("UNKNOWN"), timestamps=ExecutionTimestamps(T0)
        )
    with pytest.raises(errors.FailedExecutionMissingFailure):
        ExecutionMetadata(
            status=S.FAILED,
            exit_status=ExitCode("UNKNOWN"),
            timestamps=ExecutionTimestamps(T0, None, T0),
        )
    assert (
        ExecutionMetadata(
            status=S.UNKNOWN, exit_status=ExitCode("UNKNOWN"), timestamps=ExecutionTimestamps(T0)
        ).timestamps.ended_at
        is None
    )


def test_transition_timestamps_normalised_and_bools_refused() -> None:
    transition = LifecycleTransition.new(S.STARTED, T0)
    assert transition.at.tzinfo is UTC
    with pytest.raises(errors.NaiveTimestamp):
        LifecycleTransition.new(S.STARTED, datetime(2026, 1, 1))
    with pytest.raises(TypeError):
        apply_transition(metadata_in(S.STARTING), True, 1, transition, counts_apply=True)
