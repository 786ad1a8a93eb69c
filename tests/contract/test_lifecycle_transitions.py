"""Lifecycle transitions of job and step executions (B1-B12)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch.errors import (
    FailedTransitionMissingFailure,
    IllegalTransition,
    InvalidTransitionTime,
    JobExecutionNotFound,
    RestartRequiresNewAttempt,
    StaleVersion,
    StepExecutionNotFound,
)
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ActorRef, ExitCode, JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock

S = BatchStatus
Kind = Literal["job", "step"]
Record = JobExecution | StepExecution

FAILURE = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(4242))
OTHER_FAILURE = FailureSummary(FailureCategory.TIMEOUT, FailureId(77))

#: The allowed (from, to) pairs, written out here independently of pybatch's own table.
LEGAL: frozenset[tuple[BatchStatus, BatchStatus]] = frozenset(
    {
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
)

#: A legal path from STARTING to each status.
PATHS: dict[BatchStatus, tuple[BatchStatus, ...]] = {
    S.STARTING: (),
    S.STARTED: (S.STARTED,),
    S.STOPPING: (S.STOPPING,),
    S.STOPPED: (S.STARTED, S.STOPPED),
    S.FAILED: (S.FAILED,),
    S.COMPLETED: (S.STARTED, S.COMPLETED),
    S.ABANDONED: (S.FAILED, S.ABANDONED),
    S.UNKNOWN: (S.UNKNOWN,),
}

_keys = itertools.count(1)


def new_key(job: str = "orders") -> JobInstanceKey:
    return JobInstanceKey(JobName(job), JobParameters.of({"run": next(_keys)}))


def to(target: BatchStatus, at: datetime) -> LifecycleTransition:
    """A transition to `target`, carrying a failure when the target is FAILED."""
    if target is S.FAILED:
        return LifecycleTransition.failed(at, FAILURE)
    return LifecycleTransition.new(target, at)


def transition(uow: UnitOfWork, kind: Kind, record: Record, t: LifecycleTransition) -> Record:
    if kind == "job":
        return uow.executions.transition(record.id, record.version, t)
    return uow.steps.transition(record.id, record.version, t)


def read(uow: UnitOfWork, kind: Kind, record_id: int) -> Record | None:
    if kind == "job":
        return uow.executions.get(record_id)
    return uow.steps.get(record_id)


def create(uow: UnitOfWork, kind: Kind) -> Record:
    execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
    if kind == "job":
        return execution
    return uow.steps.create(execution.id, StepName("extract"))


def drive(uow: UnitOfWork, clock: ManualClock, kind: Kind, record: Record, status: S) -> Record:
    for step in PATHS[status]:
        record = transition(uow, kind, record, to(step, clock.advance()))
    assert record.status is status
    return record


def arrange(repository: JobRepository, clock: ManualClock, kind: Kind, status: S) -> Record:
    """A committed job execution or step execution in `status`."""
    with repository.begin() as uow:
        record = drive(uow, clock, kind, create(uow, kind), status)
        uow.commit()
    return record


def stored(repository: JobRepository, kind: Kind, record_id: int) -> Record:
    with repository.begin() as uow:
        record = read(uow, kind, record_id)
    assert record is not None
    return record


KINDS: tuple[Kind, ...] = ("job", "step")


# --------------------------------------------------------------------------- B1


def test_start_sets_started_at_and_bumps_the_version(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B1."""
    for kind in KINDS:
        created = arrange(repository, clock, kind, S.STARTING)
        at = clock.advance(timedelta(seconds=3))
        with repository.begin() as uow:
            started = transition(uow, kind, created, LifecycleTransition.new(S.STARTED, at))
            uow.commit()
        for record in (started, stored(repository, kind, created.id)):
            assert record.status is S.STARTED
            assert record.metadata.timestamps.started_at == at
            assert record.metadata.timestamps.ended_at is None
            assert record.metadata.timestamps.created_at == created.created_at
            assert record.version == 1
            assert record.metadata.exit_status == ExitCode("UNKNOWN")
            assert record.metadata.failure is None
        assert created.version == 0


# --------------------------------------------------------------------------- B2


def expected_outcome(source: S, target: S) -> str:
    """What the checked transition `source -> target` does (FAILED comes with a failure)."""
    if (source, target) in LEGAL:
        return "ok"
    if source in (S.STOPPED, S.FAILED) and target is S.STARTING:
        return f"RestartRequiresNewAttempt({source})"
    return f"IllegalTransition({source}, {target})"


def attempt(uow: UnitOfWork, kind: Kind, record: Record, target: S, at: datetime) -> str:
    try:
        after = transition(uow, kind, record, to(target, at))
    except RestartRequiresNewAttempt as refused:
        return f"RestartRequiresNewAttempt({refused.from_status})"
    except IllegalTransition as illegal:
        return f"IllegalTransition({illegal.from_status}, {illegal.to_status})"
    if (after.status, after.version) != (target, record.version + 1):
        return f"wrong result {after.status} v{after.version}"
    if after.metadata.exit_status != record.metadata.exit_status:
        return "exit status changed"
    return "ok"


@pytest.mark.parametrize("kind", KINDS)
def test_every_status_pair_moves_exactly_where_the_lifecycle_table_allows(
    repository: JobRepository, clock: ManualClock, kind: Kind
) -> None:
    """All 8x8 (from, to) pairs: success exactly where the table allows one. Scenario B2."""
    pairs = list(itertools.product(S, S))
    with repository.begin() as uow:
        sources = {pair: drive(uow, clock, kind, create(uow, kind), pair[0]) for pair in pairs}
        uow.commit()
    at = clock.advance()
    observed: dict[tuple[S, S], str] = {}
    with repository.begin() as uow:
        for (source, target), record in sources.items():
            observed[source, target] = attempt(uow, kind, record, target, at)
        uow.commit()
    expected = {(source, target): expected_outcome(source, target) for source, target in pairs}
    assert observed == expected
    assert sum(outcome == "ok" for outcome in observed.values()) == 16
    # Durable effect: legal pairs moved to the target, refused pairs are untouched.
    with repository.begin() as uow:
        for (source, target), record in sources.items():
            now = read(uow, kind, record.id)
            assert now is not None
            if (source, target) in LEGAL:
                assert (now.status, now.version) == (target, record.version + 1), (source, target)
            else:
                assert now == record, (source, target)


# --------------------------------------------------------------------------- B3


def test_failed_requires_a_failure_and_stores_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B3."""
    for kind in KINDS:
        started = arrange(repository, clock, kind, S.STARTED)
        at = clock.advance()
        with repository.begin() as uow:
            with pytest.raises(FailedTransitionMissingFailure):
                transition(uow, kind, started, LifecycleTransition(target=S.FAILED, at=at))
            assert read(uow, kind, started.id) == started
            failed = transition(uow, kind, started, LifecycleTransition.failed(at, FAILURE))
            uow.commit()
        for record in (failed, stored(repository, kind, started.id)):
            assert record.status is S.FAILED
            assert record.metadata.failure == FAILURE
            assert record.metadata.timestamps.ended_at == at
            assert record.version == started.version + 1


# --------------------------------------------------------------------------- B4


def test_transition_before_start_is_refused_and_changes_nothing(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B4."""
    for kind in KINDS:
        started = arrange(repository, clock, kind, S.STARTED)
        started_at = started.metadata.timestamps.started_at
        assert started_at is not None
        with repository.begin() as uow:
            for target in (S.COMPLETED, S.STOPPING, S.FAILED):
                early = to(target, started_at - timedelta(microseconds=1))
                with pytest.raises(InvalidTransitionTime):
                    transition(uow, kind, started, early)
            uow.commit()
        assert stored(repository, kind, started.id) == started
        # Exactly at started_at is allowed: the bound is inclusive.
        with repository.begin() as uow:
            done = transition(uow, kind, started, LifecycleTransition.new(S.COMPLETED, started_at))
            uow.commit()
        assert done.metadata.timestamps.ended_at == started_at


def test_transition_before_creation_or_end_is_refused(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B4."""
    for kind in KINDS:
        starting = arrange(repository, clock, kind, S.STARTING)
        failed = arrange(repository, clock, kind, S.FAILED)
        ended_at = failed.metadata.timestamps.ended_at
        assert ended_at is not None
        with repository.begin() as uow:
            with pytest.raises(InvalidTransitionTime):
                transition(
                    uow,
                    kind,
                    starting,
                    to(S.STARTED, starting.created_at - timedelta(microseconds=1)),
                )
            with pytest.raises(InvalidTransitionTime):
                transition(uow, kind, failed, to(S.ABANDONED, ended_at - timedelta(microseconds=1)))
            uow.commit()
        assert stored(repository, kind, starting.id) == starting
        assert stored(repository, kind, failed.id) == failed


# --------------------------------------------------------------------------- B5


def test_abandoning_a_failure_keeps_end_time_and_failure(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B5."""
    for kind in KINDS:
        failed = arrange(repository, clock, kind, S.FAILED)
        at = clock.advance(timedelta(hours=1))
        with repository.begin() as uow:
            abandoned = transition(uow, kind, failed, LifecycleTransition.new(S.ABANDONED, at))
            uow.commit()
        for record in (abandoned, stored(repository, kind, failed.id)):
            assert record.status is S.ABANDONED
            assert record.metadata.timestamps.ended_at == failed.metadata.timestamps.ended_at
            assert record.metadata.timestamps.ended_at != at
            assert record.metadata.failure == FAILURE
            assert record.updated_at == at


def test_abandoning_with_a_new_failure_replaces_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B5."""
    for kind in KINDS:
        failed = arrange(repository, clock, kind, S.FAILED)
        t = LifecycleTransition(target=S.ABANDONED, at=clock.advance(), failure=OTHER_FAILURE)
        with repository.begin() as uow:
            abandoned = transition(uow, kind, failed, t)
            uow.commit()
        assert (
            stored(repository, kind, failed.id).metadata.failure
            == OTHER_FAILURE
            == (abandoned.metadata.failure)
        )


# --------------------------------------------------------------------------- B6


def test_unknown_has_no_end_time_until_failed(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B6."""
    for kind in KINDS:
        started = arrange(repository, clock, kind, S.STARTED)
        with repository.begin() as uow:
            unknown = transition(
                uow, kind, started, LifecycleTransition.new(S.UNKNOWN, clock.advance())
            )
            uow.commit()
        assert unknown.metadata.timestamps.ended_at is None
        assert stored(repository, kind, started.id).metadata.timestamps.ended_at is None
        at = clock.advance()
        with repository.begin() as uow:
            failed = transition(uow, kind, unknown, LifecycleTransition.failed(at, FAILURE))
            uow.commit()
        for record in (failed, stored(repository, kind, started.id)):
            assert record.status is S.FAILED
            assert record.metadata.timestamps.ended_at == at
            assert record.metadata.timestamps.started_at == started.metadata.timestamps.started_at
            assert record.version == 3


# --------------------------------------------------------------------------- B7


def test_stale_version_is_checked_before_any_other_refusal(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B7."""
    for kind in KINDS:
        started = arrange(repository, clock, kind, S.STARTED)
        assert started.version == 1
        at = clock.advance()
        attempts: list[tuple[int, LifecycleTransition]] = [
            (0, LifecycleTransition.new(S.STARTING, at)),  # also illegal
            (0, LifecycleTransition(target=S.FAILED, at=at)),  # also missing its failure
            (0, LifecycleTransition.new(S.COMPLETED, at - timedelta(days=1))),  # also too early
            (0, LifecycleTransition.new(S.COMPLETED, at)),  # otherwise legal
            (7, LifecycleTransition.new(S.COMPLETED, at)),  # a version from the future
        ]
        with repository.begin() as uow:
            for expected, t in attempts:
                with pytest.raises(StaleVersion) as stale:
                    if kind == "job":
                        uow.executions.transition(started.id, expected, t)
                    else:
                        uow.steps.transition(started.id, expected, t)
                assert (stale.value.expected, stale.value.actual) == (expected, 1)
            uow.commit()
        assert stored(repository, kind, started.id) == started


# --------------------------------------------------------------------------- B8


def test_terminal_rollback_counts_once_on_a_step(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario B8."""
    started = arrange(repository, clock, "step", S.STARTED)
    assert isinstance(started, StepExecution)
    assert started.metadata.counts.rolled_back == 0
    with repository.begin() as uow:
        failed = uow.steps.transition(
            started.id,
            started.version,
            LifecycleTransition(S.FAILED, clock.advance(), FAILURE, terminal_rollback=True),
        )
        uow.commit()
    assert failed.metadata.counts.rolled_back == 1
    step = stored(repository, "step", started.id)
    assert step.metadata.counts.rolled_back == 1
    assert step.metadata.counts.committed == 0 and step.metadata.counts.read == 0
    # A transition without the flag leaves the counter alone; another flagged one adds 1 more.
    with repository.begin() as uow:
        abandoned = uow.steps.transition(
            failed.id,
            failed.version,
            LifecycleTransition(S.ABANDONED, clock.advance(), terminal_rollback=True),
        )
        uow.commit()
    assert abandoned.metadata.counts.rolled_back == 2
    row = admin.execute(
        "SELECT rollback_count FROM pybatch.step_execution WHERE id = %s", (started.id,)
    ).fetchone()
    assert row == (2,)


def test_terminal_rollback_has_no_effect_on_a_job_execution(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B8."""
    started = arrange(repository, clock, "job", S.STARTED)
    with repository.begin() as uow:
        failed = uow.executions.transition(
            started.id,
            started.version,
            LifecycleTransition(S.FAILED, clock.advance(), FAILURE, terminal_rollback=True),
        )
        uow.commit()
    assert failed.status is S.FAILED and failed.version == 2
    assert failed.metadata.counts == ExecutionCounts()
    assert stored(repository, "job", started.id) == failed


# --------------------------------------------------------------------------- B9


# --------------------------------------------------------------------------- B10, B11


def test_transition_of_an_unknown_id_is_not_found_in_its_own_table(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B11."""
    t = LifecycleTransition.new(S.STARTED, clock.now())
    with repository.begin() as uow:
        with pytest.raises(JobExecutionNotFound) as job:
            uow.executions.transition(987654, 0, t)
        assert job.value.id == 987654
        with pytest.raises(StepExecutionNotFound) as step:
            uow.steps.transition(876543, 0, t)
        assert step.value.id == 876543
        # A job execution id is not a step id: ids of the other table do not resolve.
        execution = create(uow, "job")
        with pytest.raises(StepExecutionNotFound):
            uow.steps.transition(execution.id + 500, 0, t)


# --------------------------------------------------------------------------- B12


def test_updated_at_is_monotonic_after_a_stop_request(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B12."""
    started = arrange(repository, clock, "job", S.STARTED)
    started_at = started.metadata.timestamps.started_at
    assert started_at is not None
    t1 = started_at + timedelta(seconds=10)
    t2 = started_at + timedelta(seconds=20)
    with repository.begin() as uow:
        uow.stop_requests.request(started.id, started.version, ActorRef("cli:ops"), t2)
        uow.commit()
    assert stored(repository, "job", started.id).updated_at == t2
    with repository.begin() as uow:
        stopping = uow.executions.transition(
            started.id, started.version, LifecycleTransition.new(S.STOPPING, t1)
        )
        uow.commit()
    assert stopping.updated_at == t2
    assert stopping.version == started.version + 1  # the stop request did not bump it
    assert stored(repository, "job", started.id).updated_at == t2
    # A later transition does move it forward.
    t3 = t2 + timedelta(seconds=1)
    with repository.begin() as uow:
        stopped = uow.executions.transition(
            stopping.id, stopping.version, LifecycleTransition.new(S.STOPPED, t3)
        )
        uow.commit()
    assert stopped.updated_at == t3 == stored(repository, "job", started.id).updated_at


def test_updated_at_never_moves_back_for_an_earlier_transition_instant(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario B12."""
    for kind in KINDS:
        started = arrange(repository, clock, kind, S.STARTED)
        started_at = started.metadata.timestamps.started_at
        assert started_at is not None
        t1 = started_at + timedelta(seconds=10)
        t2 = started_at + timedelta(seconds=20)
        with repository.begin() as uow:
            stopping = transition(uow, kind, started, LifecycleTransition.new(S.STOPPING, t2))
            stopped = transition(uow, kind, stopping, LifecycleTransition.new(S.STOPPED, t1))
            uow.commit()
        assert stopping.updated_at == t2
        assert stopped.updated_at == t2
        record = stored(repository, kind, started.id)
        assert record.updated_at == t2
        assert record.metadata.timestamps.ended_at == t1
