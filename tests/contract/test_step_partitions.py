"""Step partitions in the repository (F1-F35, N6).

What a partitioned step relies on: a plan is all or nothing and published before any worker
starts, a partition mirrors its worker's durable row, aggregation ends the parent atomically
and is safe to replay, and a restart never reruns a completed partition.
"""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch.errors import (
    CommitOutcomeUnknown,
    CountExhausted,
    DuplicatePartitionKey,
    EmptyPartitionPlan,
    IllegalTransition,
    PartitionAggregationIncomplete,
    PartitionContextTooLarge,
    PartitionParentNotActive,
    PartitionPlanExists,
    PartitionPlanNotCommitted,
    PartitionPlanTooLarge,
    PartitionStateCorrupt,
    PartitionWorkerStale,
    RepositoryDomainError,
    StaleVersion,
    StateSchemaVersionNotStorable,
    StepExecutionNotFound,
    StepPartitionNotFound,
    Unavailable,
)
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ExitCode, JobName, NodeId, StateSchemaId, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.partitions import PartitionPlanEntry, StepPartition
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.state import ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.contract.test_one_round_trip_transactions import traced
from tests.support.clock import ManualClock
from tests.support.race import terminate_backend
from tests.support.rows import write_exit_code

S = BatchStatus
SCHEMA = StateSchemaId("tests.partition.v1")
_keys = itertools.count(1)
_names = itertools.count(1)


def entry(key: str, **payload: Any) -> PartitionPlanEntry:
    return PartitionPlanEntry(key, ExecutionContext(SCHEMA, 1, {"key": key, **payload}))


def entries(*keys: str) -> list[PartitionPlanEntry]:
    return [entry(key) for key in keys]


def to(status: BatchStatus, clock: ManualClock, failure_id: int = 1) -> LifecycleTransition:
    if status is S.FAILED:
        return LifecycleTransition.failed(
            clock.advance(), FailureSummary(FailureCategory.USER_COMPONENT, FailureId(failure_id))
        )
    return LifecycleTransition.new(status, clock.advance())


def launch(
    repository: JobRepository, clock: ManualClock, instance_id: int | None = None
) -> JobExecution:
    with repository.begin() as uow:
        if instance_id is None:
            key = JobInstanceKey(JobName("parts"), JobParameters.of({"run": next(_keys)}))
            instance_id = uow.instances.select_or_create(key).instance.id
        execution = uow.executions.create(instance_id)
        execution = uow.executions.transition(execution.id, 0, to(S.STARTED, clock))
        uow.commit()
    return execution


def new_step(
    repository: JobRepository,
    clock: ManualClock,
    execution: JobExecution,
    name: str | None = None,
    *,
    started: bool = True,
) -> StepExecution:
    with repository.begin() as uow:
        name = name or f"s{next(_names)}"
        step = uow.flow.create_step(execution.id, StepName(name), NodeId(name))
        if started:
            step = uow.steps.transition(step.id, 0, to(S.STARTED, clock))
        uow.commit()
    return step


def move(
    repository: JobRepository, clock: ManualClock, step_id: int, *statuses: BatchStatus
) -> StepExecution:
    with repository.begin() as uow:
        step = uow.steps.get(step_id)
        assert step is not None
        for status in statuses:
            step = uow.steps.transition(step.id, step.version, to(status, clock, step.id))
        uow.commit()
    return step


def plan(repository: JobRepository, parent: StepExecution, *keys: str) -> list[StepPartition]:
    with repository.begin() as uow:
        created = uow.partitions.create_plan(parent.id, entries(*keys))
        uow.commit()
    return created


def claim(
    repository: JobRepository, parent_id: int, *, fresh: bool = False
) -> tuple[StepPartition, StepExecution]:
    """The next partition of a STARTED parent, claimed for a new worker step."""
    with repository.begin() as uow:
        parent = uow.steps.get(parent_id)
        assert parent is not None
        claimed = uow.partitions.claim(parent, fresh=fresh)
        uow.commit()
    assert claimed is not None
    return claimed


def end(
    repository: JobRepository,
    clock: ManualClock,
    partition: StepPartition,
    worker_id: int,
    status: BatchStatus = S.COMPLETED,
) -> StepPartition:
    """End the worker in `status` (one already ended stays as it is), completing its partition."""
    with repository.begin() as uow:
        transition = to(status, clock, worker_id)
        uow.partitions.end_worker(partition.id, partition.version, worker_id, transition, None)
        uow.commit()
    (done,) = (
        p for p in stored_plan(repository, partition.step_execution_id) if p.id == partition.id
    )
    return done


def set_counts(admin: psycopg.Connection[Any], step_id: int, *counts: int) -> None:
    admin.execute(
        "UPDATE pybatch.step_execution SET read_count = %s, processed_count = %s,"
        " write_count = %s, filter_count = %s, commit_count = %s, rollback_count = %s"
        " WHERE id = %s",
        (*counts, step_id),
    )


def set_exit(repository: JobRepository, step_id: int, exit_code: str) -> None:
    with repository.begin() as uow:
        step = uow.steps.get(step_id)
        assert step is not None
        write_exit_code(uow, step, exit_code)
        uow.commit()


def partition_rows(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT COUNT(*) FROM pybatch.step_partition").fetchone()
    assert row is not None
    return int(row[0])


def stored_plan(repository: JobRepository, parent_id: int) -> list[StepPartition]:
    """The committed plan of `parent_id` in key byte order, read in a fresh unit of work."""
    with repository.begin() as uow:
        return uow.partitions.plan(parent_id)


def stored_step(repository: JobRepository, step_id: int) -> StepExecution:
    with repository.begin() as uow:
        step = uow.steps.get(step_id)
    assert step is not None
    return step


class Fixture:
    """A STARTED job execution with a STARTED parent step."""

    def __init__(self, repository: JobRepository, clock: ManualClock) -> None:
        self.repository, self.clock = repository, clock
        self.execution = launch(repository, clock)
        self.parent = new_step(repository, clock, self.execution, "load")

    def worker(self) -> StepExecution:
        return new_step(self.repository, self.clock, self.execution)

    def run(self, partition: StepPartition, status: BatchStatus = S.COMPLETED) -> StepPartition:
        """Claim `partition` (the next in ordinal order) for a new worker, end it in `status`."""
        claimed, worker = claim(self.repository, self.parent.id)
        assert claimed.id == partition.id
        return end(self.repository, self.clock, claimed, worker.id, status)


@pytest.fixture
def f(repository: JobRepository, clock: ManualClock) -> Fixture:
    return Fixture(repository, clock)


# --------------------------------------------------------------------------- values


def test_partition_context_is_bounded_to_4_kib() -> None:
    with pytest.raises(PartitionContextTooLarge):
        PartitionPlanEntry(
            "k", ExecutionContext(SCHEMA, 1, {"x": "a" * 5000}, limits=StateLimits.STEP)
        )
    assert PartitionPlanEntry("k", ExecutionContext(SCHEMA, 1, {"x": "a" * 3000})).key.value == "k"


# --------------------------------------------------------------------------- plans


def test_a_plan_is_numbered_in_entry_order_and_read_in_key_byte_order(f: Fixture) -> None:
    """Scenario F1."""
    created = plan(f.repository, f.parent, "b", "a", "B")
    assert [(p.key.value, p.ordinal) for p in created] == [("b", 1), ("a", 2), ("B", 3)]
    assert all(
        (p.status, p.worker_step_execution_id, p.version, p.exit_status)
        == (S.STARTING, None, 0, ExitCode("UNKNOWN"))
        and p.counts == ExecutionCounts()
        for p in created
    )
    with f.repository.begin() as uow:
        read = uow.partitions.plan(f.parent.id)
    assert [p.key.value for p in read] == ["B", "a", "b"]  # byte order: upper case first
    assert read[1].context == ExecutionContext(SCHEMA, 1, {"key": "a"})


def test_an_empty_or_oversized_plan_is_refused(f: Fixture, admin: psycopg.Connection[Any]) -> None:
    """Scenario F2."""
    with f.repository.begin() as uow:
        with pytest.raises(EmptyPartitionPlan):
            uow.partitions.create_plan(f.parent.id, [])
        with pytest.raises(PartitionPlanTooLarge) as too_large:
            uow.partitions.create_plan(f.parent.id, entries(*map(str, range(1025))))
        assert too_large.value.max == 1024
        created = uow.partitions.create_plan(f.parent.id, entries(*map(str, range(1024))))
        uow.commit()
    assert len(created) == 1024 and created[-1].ordinal == 1024
    assert partition_rows(admin) == 1024


def test_byte_identical_keys_are_duplicates_whitespace_is_kept(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario F3."""
    other = new_step(f.repository, f.clock, f.execution)
    with f.repository.begin() as uow:
        with pytest.raises(DuplicatePartitionKey):
            uow.partitions.create_plan(f.parent.id, entries("a", "b", "a"))
        uow.commit()
    assert partition_rows(admin) == 0  # not even "a" and "b" were kept
    assert [p.key.value for p in plan(f.repository, other, "a", "a ")] == ["a", "a "]
    assert [p.key.value for p in stored_plan(f.repository, other.id)] == ["a", "a "]


def test_a_context_schema_version_beyond_integer_is_refused_before_any_write(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Valid as a u32, 2^31 does not fit the integer column: refused typed, nothing written."""
    too_big = PartitionPlanEntry("b", ExecutionContext(SCHEMA, 2**31, {"key": "b"}))
    with f.repository.begin() as uow, pytest.raises(RepositoryDomainError) as refused:
        uow.partitions.create_plan(f.parent.id, [entry("a"), too_big])
    assert isinstance(refused.value.error, StateSchemaVersionNotStorable)
    assert partition_rows(admin) == 0
    fits = PartitionPlanEntry("b", ExecutionContext(SCHEMA, 2**31 - 1, {"key": "b"}))
    with f.repository.begin() as uow:
        created = uow.partitions.create_plan(f.parent.id, [entry("a"), fits])
        uow.commit()
    assert created[1].context.schema_version == 2**31 - 1


def test_a_plan_is_refused_twice_or_under_an_inactive_parent_and_is_all_or_nothing(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario F4, F5, F6."""
    first = plan(f.repository, f.parent, "a")
    with f.repository.begin() as uow:
        with pytest.raises(PartitionPlanExists) as exists:
            uow.partitions.create_plan(f.parent.id, entries("x"))
        assert exists.value.step_execution_id == f.parent.id
        uow.commit()
    assert stored_plan(f.repository, f.parent.id) == first
    for path in ((S.STOPPING,), (S.COMPLETED,), (S.FAILED,)):
        parent = new_step(f.repository, f.clock, f.execution)
        move(f.repository, f.clock, parent.id, *path)
        with f.repository.begin() as uow, pytest.raises(PartitionParentNotActive) as inactive:
            uow.partitions.create_plan(parent.id, entries("x", "y"))
        assert (inactive.value.step_execution_id, inactive.value.status) == (
            parent.id,
            path[-1].value,
        )
    assert partition_rows(admin) == 1  # only the first plan's row


def test_input_checks_precede_parent_checks(f: Fixture) -> None:
    """Scenario F35."""
    with f.repository.begin() as uow:
        with pytest.raises(EmptyPartitionPlan):
            uow.partitions.create_plan(10**9, [])
        with pytest.raises(StepExecutionNotFound):
            uow.partitions.create_plan(10**9, entries("a"))
        with pytest.raises(StepExecutionNotFound):
            uow.partitions.plan(10**9)
        assert uow.partitions.plan(f.parent.id) == []


# --------------------------------------------------------------------------- claim and end


def test_a_claim_waits_for_the_plan_to_be_published(f: Fixture) -> None:
    """Scenario F7."""
    with f.repository.begin() as uow:
        (created,) = uow.partitions.create_plan(f.parent.id, entries("a"))
        with pytest.raises(PartitionPlanNotCommitted) as unpublished:
            uow.partitions.claim(f.parent)
        assert unpublished.value.step_execution_id == f.parent.id
        uow.commit()
    claimed, _ = claim(f.repository, f.parent.id)
    assert (claimed.id, claimed.status) == (created.id, S.STARTED)


@pytest.mark.parametrize("fresh", [False, True], ids=["claim", "fresh_claim"])
def test_a_claim_needs_a_started_parent(
    repository: JobRepository, clock: ManualClock, fresh: bool
) -> None:
    """Scenario F8, F9."""
    execution = launch(repository, clock)
    parent = new_step(repository, clock, execution, started=False)
    (created,) = plan(repository, parent, "a")
    with repository.begin() as uow:
        assert uow.partitions.claim(parent, fresh=fresh) is None  # STARTING: nothing claimable
    assert stored_plan(repository, parent.id) == [created]
    move(repository, clock, parent.id, S.STARTED)
    assigned, worker = claim(repository, parent.id, fresh=fresh)
    assert (assigned.status, assigned.worker_step_execution_id, assigned.version) == (
        S.STARTED,
        worker.id,
        1,
    )
    assert assigned.exit_status == ExitCode("UNKNOWN") and assigned.counts == ExecutionCounts()
    with repository.begin() as uow:
        assert uow.partitions.plan(parent.id) == [assigned]


@pytest.mark.parametrize("fresh", [False, True], ids=["claim", "fresh_claim"])
def test_each_claim_takes_the_next_partition_for_a_new_sibling_worker(
    f: Fixture, fresh: bool
) -> None:
    """A STARTED partition is never claimed again; each worker is a new step of the parent's
    execution, behind exactly one partition.

    Scenario F10, F11, F12.
    """
    first, second = plan(f.repository, f.parent, "a", "b")
    claims = [claim(f.repository, f.parent.id, fresh=fresh) for _ in range(2)]
    assert [p.id for p, _ in claims] == [first.id, second.id]
    workers = [worker for _, worker in claims]
    assert len({w.id for w in workers}) == 2 and f.parent.id not in {w.id for w in workers}
    assert all(w.job_execution_id == f.execution.id for w in workers)
    assert all(w.status is S.STARTED for w in workers)
    with f.repository.begin() as uow:
        assert uow.partitions.claim(f.parent, fresh=fresh) is None  # both are STARTED
    assert stored_plan(f.repository, f.parent.id) == [p for p, _ in claims]


def test_a_fresh_claim_takes_only_a_first_attempts_unassigned_partitions(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """The fresh claim (a worker's first choice) gives a partition what the full claim gives it,
    and leaves a lost worker's partition and a later attempt's plan to the full claim, which
    resumes them from the earlier worker."""
    a, b, c, d = plan(f.repository, f.parent, "a", "b", "c", "d")
    full, full_worker = claim(f.repository, f.parent.id)
    fresh, fresh_worker = claim(f.repository, f.parent.id, fresh=True)
    assert (full.id, fresh.id) == (a.id, b.id)
    assert (
        attrs.evolve(
            fresh,
            id=a.id,
            key=a.key,
            ordinal=a.ordinal,
            context=a.context,
            worker_step_execution_id=full_worker.id,
        )
        == full
    )
    assert (
        attrs.evolve(
            fresh_worker,
            id=full_worker.id,
            step_name=full_worker.step_name,
            logical_id=full_worker.logical_id,
        )
        == full_worker
    )
    set_counts(admin, full_worker.id, 5, 5, 5, 0, 1, 0)
    admin.execute(  # a's worker is lost: its lease ran out
        "UPDATE pybatch.step_partition SET worker_lease_expires_at = now() - interval '1 second'"
        " WHERE id = %s",
        (full.id,),
    )
    with f.repository.begin() as uow:
        assert uow.partitions.recover_lost(full.id, full.version, full_worker.id)
        uow.commit()
    assert claim(f.repository, f.parent.id, fresh=True)[0].id == c.id
    assert claim(f.repository, f.parent.id, fresh=True)[0].id == d.id
    with f.repository.begin() as uow:
        assert uow.partitions.claim(f.parent, fresh=True) is None  # only a lost one is left
    retried, retry_worker = claim(f.repository, f.parent.id)
    assert retried.id == a.id and retry_worker.metadata.counts.read == 5

    fail_job(f.repository, f.clock, f.execution)  # a later attempt carries a, b, c, d over
    second = launch(f.repository, f.clock, f.execution.job_instance_id)
    target = new_step(f.repository, f.clock, second, "load")
    with f.repository.begin() as uow:
        carried = uow.partitions.restart_plan(f.parent.id, target.id)
        uow.commit()
    assert [p.status for p in carried] == [S.STARTING] * 4
    with f.repository.begin() as uow:
        assert uow.partitions.claim(target, fresh=True) is None
    resumed, resumed_worker = claim(f.repository, target.id)
    assert resumed.key == a.key and resumed_worker.metadata.counts.read == 5


def test_an_unknown_partition_is_not_found(f: Fixture) -> None:
    """Scenario F13."""
    (created,) = plan(f.repository, f.parent, "a")
    with f.repository.begin() as uow:
        with pytest.raises(StepPartitionNotFound) as missing:
            uow.partitions.end_worker(
                created.id + 100, 0, f.parent.id, to(S.COMPLETED, f.clock), None
            )
        assert missing.value.id == created.id + 100
        uow.commit()
    assert stored_plan(f.repository, f.parent.id) == [created]


def test_a_completed_partition_mirrors_its_workers_durable_row(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario F14."""
    plan(f.repository, f.parent, "a")
    assigned, worker = claim(f.repository, f.parent.id)
    set_counts(admin, worker.id, 5, 5, 5, 0, 1, 0)
    set_exit(f.repository, worker.id, "ALL_LOADED")
    done = end(f.repository, f.clock, assigned, worker.id)
    assert (done.status, done.exit_status.value, done.version) == (S.COMPLETED, "ALL_LOADED", 2)
    c = done.counts
    assert (c.read, c.processed, c.written, c.filtered, c.committed, c.rolled_back) == (
        5,
        5,
        5,
        0,
        1,
        0,
    )
    # The partition mirrors the worker's durable row, and that is what is committed.
    ended = stored_step(f.repository, worker.id)
    assert (done.status, done.exit_status, done.counts) == (
        ended.status,
        ended.metadata.exit_status,
        ended.metadata.counts,
    )
    assert stored_plan(f.repository, f.parent.id) == [done]


def test_an_end_from_a_stale_or_unfinishable_worker_is_refused(f: Fixture) -> None:
    """Scenario F15, F16."""
    plan(f.repository, f.parent, "a")
    assigned, worker = claim(f.repository, f.parent.id)
    sibling = f.worker()
    with f.repository.begin() as uow:
        for stale_worker in (f.parent.id, sibling.id):
            with pytest.raises(PartitionWorkerStale) as stale:
                uow.partitions.end_worker(
                    assigned.id, 1, stale_worker, to(S.COMPLETED, f.clock), None
                )
            assert (stale.value.partition_id, stale.value.worker) == (assigned.id, stale_worker)
        uow.commit()
    assert stored_plan(f.repository, f.parent.id) == [assigned]
    move(f.repository, f.clock, worker.id, S.FAILED, S.ABANDONED)
    with f.repository.begin() as uow, pytest.raises(PartitionAggregationIncomplete) as abandoned:
        uow.partitions.end_worker(assigned.id, 1, worker.id, to(S.COMPLETED, f.clock), None)
    assert (abandoned.value.step_execution_id, abandoned.value.status) == (
        f.parent.id,
        "ABANDONED",
    )
    assert stored_plan(f.repository, f.parent.id) == [assigned]


def test_an_end_is_allowed_while_the_parent_is_stopping_not_once_stopped(f: Fixture) -> None:
    """Scenario F17."""
    plan(f.repository, f.parent, "a", "b")
    claims = [claim(f.repository, f.parent.id) for _ in range(2)]
    for _, worker in claims:
        move(f.repository, f.clock, worker.id, S.COMPLETED)
    move(f.repository, f.clock, f.parent.id, S.STOPPING)
    (first, first_worker), (second, second_worker) = claims
    assert end(f.repository, f.clock, first, first_worker.id).status is S.COMPLETED
    move(f.repository, f.clock, f.parent.id, S.STOPPED)
    with f.repository.begin() as uow, pytest.raises(PartitionParentNotActive) as stopped:
        uow.partitions.end_worker(second.id, 1, second_worker.id, to(S.COMPLETED, f.clock), None)
    assert (stopped.value.step_execution_id, stopped.value.status) == (f.parent.id, "STOPPED")
    assert stored_plan(f.repository, f.parent.id)[1] == second  # still STARTED


# --------------------------------------------------------------------------- aggregate


def aggregate(f: Fixture, version: int | None = None) -> StepExecution:
    with f.repository.begin() as uow:
        parent = uow.steps.get(f.parent.id)
        assert parent is not None
        ended = uow.partitions.aggregate(
            f.parent.id, parent.version if version is None else version, f.clock.advance()
        )
        uow.commit()
    return ended


def test_aggregating_completed_partitions_sums_counts_and_takes_the_first_keys_exit(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario F19."""
    parts = plan(f.repository, f.parent, "b", "a")
    exits = {"a": "FROM_A", "b": "FROM_B"}
    for _ in parts:
        assigned, worker = claim(f.repository, f.parent.id)
        set_counts(admin, worker.id, 2, 2, 2, 0, 1, 0)
        set_exit(f.repository, worker.id, exits[assigned.key.value])
        end(f.repository, f.clock, assigned, worker.id)
    before = f.parent.version
    ended = aggregate(f)
    assert (ended.status, ended.metadata.exit_status.value, ended.version) == (
        S.COMPLETED,
        "FROM_A",
        before + 1,
    )
    assert ended.metadata.counts.read == 4 and ended.metadata.counts.committed == 2
    with f.repository.begin() as uow:
        assert uow.steps.get(f.parent.id) == ended


@pytest.mark.parametrize("order", ["key order", "reverse key order"])
@pytest.mark.parametrize(
    ("statuses", "expected", "exit_from"),
    [
        ({"a": S.COMPLETED, "b": S.UNKNOWN, "c": S.FAILED, "d": S.UNKNOWN}, S.UNKNOWN, "b"),
        ({"a": S.COMPLETED, "b": S.STOPPED, "c": S.STOPPED}, S.STOPPED, "b"),
    ],
)
def test_most_severe_status_wins_and_the_first_such_key_gives_the_exit(
    f: Fixture,
    statuses: dict[str, BatchStatus],
    expected: BatchStatus,
    exit_from: str,
    order: str,
) -> None:
    """The parent ends in the most severe child status; its exit is that of the first child
    in key order with that status, whatever order the partitions completed in.

    Scenario F20.
    """
    keys = sorted(statuses)
    # Claims follow the entries' order: reversed entries complete in reverse key order.
    parts = plan(f.repository, f.parent, *(keys if order == "key order" else reversed(keys)))
    for _ in parts:
        assigned, worker = claim(f.repository, f.parent.id)
        key = assigned.key.value
        set_exit(f.repository, worker.id, f"EXIT_{key.upper()}")
        end(f.repository, f.clock, assigned, worker.id, statuses[key])
    ended = aggregate(f)
    assert ended.status is expected
    assert ended.metadata.exit_status == ExitCode(f"EXIT_{exit_from.upper()}")
    assert stored_step(f.repository, f.parent.id) == ended


def test_failed_aggregate_copies_the_first_failed_workers_failure(f: Fixture) -> None:
    """Scenario F21."""
    parts = plan(f.repository, f.parent, "c", "b", "a")
    failed_workers: dict[str, int] = {}
    for partition in parts:
        key = partition.key.value
        if key == "a":
            f.run(partition)
            continue
        done = f.run(partition, S.FAILED)
        assert done.worker_step_execution_id is not None
        failed_workers[key] = done.worker_step_execution_id
    ended = aggregate(f)
    assert ended.status is S.FAILED
    assert ended.metadata.failure == FailureSummary(
        FailureCategory.USER_COMPONENT, FailureId(failed_workers["b"])
    )


def test_an_active_child_blocks_aggregation(f: Fixture) -> None:
    """Scenario F22."""
    first, second = plan(f.repository, f.parent, "a", "b")
    f.run(first)
    with f.repository.begin() as uow, pytest.raises(PartitionAggregationIncomplete) as starting:
        uow.partitions.aggregate(f.parent.id, f.parent.version, f.clock.advance())
    assert starting.value.status == "STARTING"
    assert claim(f.repository, f.parent.id)[0].id == second.id
    with f.repository.begin() as uow, pytest.raises(PartitionAggregationIncomplete) as started:
        uow.partitions.aggregate(f.parent.id, f.parent.version, f.clock.advance())
    assert started.value.status == "STARTED"
    with f.repository.begin() as uow:
        assert uow.steps.get(f.parent.id) == f.parent


@pytest.mark.parametrize(
    "change",
    ["read_count = 99", "exit_code = 'CHANGED_LATER'", "status = 'STOPPED'"],
    ids=["counts", "exit", "status"],
)
def test_a_worker_changed_after_completion_is_corrupt(
    f: Fixture, admin: psycopg.Connection[Any], change: str
) -> None:
    """A worker row that no longer matches its completed partition (status, exit or counts)
    is refused, and the parent is left as it was.

    Scenario F23.
    """
    (created,) = plan(f.repository, f.parent, "a")
    done = f.run(created)
    admin.execute(
        f"UPDATE pybatch.step_execution SET {change} WHERE id = %s",
        (done.worker_step_execution_id,),
    )
    with f.repository.begin() as uow, pytest.raises(PartitionStateCorrupt):
        uow.partitions.aggregate(f.parent.id, f.parent.version, f.clock.advance())
    assert stored_step(f.repository, f.parent.id) == f.parent
    assert stored_plan(f.repository, f.parent.id) == [done]


def test_a_replayed_aggregation_returns_the_parent_and_a_new_one_is_refused(f: Fixture) -> None:
    """Scenario F24, F25."""
    (created,) = plan(f.repository, f.parent, "a")
    f.run(created)
    expected = f.parent.version
    ended = aggregate(f, expected)
    assert ended.version == expected + 1
    assert aggregate(f, expected) == ended
    with f.repository.begin() as uow, pytest.raises(PartitionParentNotActive) as terminal:
        uow.partitions.aggregate(f.parent.id, ended.version, f.clock.advance())
    assert (terminal.value.step_execution_id, terminal.value.status) == (f.parent.id, "COMPLETED")
    assert stored_step(f.repository, f.parent.id) == ended


def test_completed_aggregate_onto_a_stopping_parent_is_illegal(f: Fixture) -> None:
    """Scenario F26."""
    (created,) = plan(f.repository, f.parent, "a")
    f.run(created)
    stopping = move(f.repository, f.clock, f.parent.id, S.STOPPING)
    with f.repository.begin() as uow, pytest.raises(IllegalTransition) as illegal:
        uow.partitions.aggregate(f.parent.id, stopping.version, f.clock.advance())
    assert (illegal.value.from_status, illegal.value.to_status) == ("STOPPING", "COMPLETED")
    assert stored_step(f.repository, f.parent.id) == stopping


def test_an_aggregated_counter_sum_beyond_its_range_is_count_exhausted(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario F27."""
    for _ in plan(f.repository, f.parent, "a", "b"):
        assigned, worker = claim(f.repository, f.parent.id)
        set_counts(admin, worker.id, 2**62, 0, 0, 0, 0, 0)
        end(f.repository, f.clock, assigned, worker.id)
    with f.repository.begin() as uow, pytest.raises(CountExhausted):
        uow.partitions.aggregate(f.parent.id, f.parent.version, f.clock.advance())
    assert stored_step(f.repository, f.parent.id) == f.parent


def test_aggregation_after_a_lost_commit_acknowledgement_is_safe_to_retry(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario F34."""
    (created,) = plan(f.repository, f.parent, "a")
    f.run(created)
    expected = f.parent.version
    with f.repository.begin() as uow:
        uow.partitions.aggregate(f.parent.id, expected, f.clock.advance())
        terminate_backend(admin, uow.connection.info.backend_pid)
        with pytest.raises(CommitOutcomeUnknown):
            uow.commit()
    # The commit did not land: the retry performs the aggregation...
    ended = aggregate(f, expected)
    assert ended.status is S.COMPLETED and ended.version == expected + 1
    # ...and a second retry (as if it had landed) returns the parent unchanged.
    assert aggregate(f, expected) == ended


# --------------------------------------------------------------------------- restart


def fail_job(repository: JobRepository, clock: ManualClock, execution: JobExecution) -> None:
    with repository.begin() as uow:
        for step in uow.steps.of_execution(execution.id):
            if step.status.is_active:
                uow.steps.transition(step.id, step.version, to(S.FAILED, clock))
        current = uow.executions.get(execution.id)
        assert current is not None
        uow.executions.transition(current.id, current.version, to(S.FAILED, clock))
        uow.commit()


def test_a_restarted_plan_carries_completed_partitions_only(f: Fixture) -> None:
    """Scenario F28, F31."""
    parts = plan(f.repository, f.parent, "a", "b", "c")
    done_a = f.run(parts[0])
    f.run(parts[1], S.FAILED)
    assert claim(f.repository, f.parent.id)[0].id == parts[2].id
    fail_job(f.repository, f.clock, f.execution)
    second = launch(f.repository, f.clock, f.execution.job_instance_id)
    target = new_step(f.repository, f.clock, second, "load")
    with f.repository.begin() as uow:
        carried = uow.partitions.restart_plan(f.parent.id, target.id)
        with pytest.raises(PartitionPlanNotCommitted):
            uow.partitions.claim(target)
        uow.commit()
    a, b, c = carried
    assert (a.status, a.worker_step_execution_id, a.version) == (
        S.COMPLETED,
        done_a.worker_step_execution_id,
        0,
    )
    assert a.counts == done_a.counts and a.exit_status == done_a.exit_status
    for fresh in (b, c):
        assert (fresh.status, fresh.worker_step_execution_id, fresh.version) == (
            S.STARTING,
            None,
            0,
        )
        assert fresh.counts == ExecutionCounts() and fresh.exit_status == ExitCode("UNKNOWN")
    assert [p.ordinal for p in carried] == [1, 2, 3]
    assert [p.context for p in carried] == [p.context for p in parts]
    assert stored_plan(f.repository, target.id) == carried


def new_step_id(uow: Any, execution: JobExecution) -> int:
    name = f"w{next(_names)}"
    return int(uow.flow.create_step(execution.id, StepName(name), NodeId(name)).id)


def test_a_plan_restart_from_an_unfit_source_or_target_is_refused(
    f: Fixture, clock: ManualClock
) -> None:
    """Scenario F29, F30, F33."""
    plan(f.repository, f.parent, "a")
    running_target = new_step(f.repository, clock, f.execution, "other")
    with f.repository.begin() as uow, pytest.raises(PartitionStateCorrupt):
        uow.partitions.restart_plan(f.parent.id, running_target.id)  # job still STARTED
    assert stored_plan(f.repository, running_target.id) == []
    fail_job(f.repository, clock, f.execution)
    second = launch(f.repository, clock, f.execution.job_instance_id)
    target = new_step(f.repository, clock, second, "load")
    renamed = new_step(f.repository, clock, second, "elsewhere")
    done = new_step(f.repository, clock, second)
    with f.repository.begin() as uow:
        with pytest.raises(PartitionStateCorrupt):  # different logical ids
            uow.partitions.restart_plan(f.parent.id, renamed.id)
        with pytest.raises(PartitionStateCorrupt):  # missing source
            uow.partitions.restart_plan(10**9, target.id)
        uow.commit()
    assert stored_plan(f.repository, renamed.id) == []
    assert stored_plan(f.repository, target.id) == []
    empty_source = new_step(f.repository, clock, second, "load-empty")
    move(f.repository, clock, done.id, S.COMPLETED)
    with f.repository.begin() as uow:
        uow.partitions.restart_plan(f.parent.id, target.id)
        uow.commit()
    carried = stored_plan(f.repository, target.id)
    with f.repository.begin() as uow:
        with pytest.raises(PartitionPlanExists) as exists:
            uow.partitions.restart_plan(f.parent.id, target.id)
        assert exists.value.step_execution_id == target.id
    assert stored_plan(f.repository, target.id) == carried
    assert empty_source.id > 0
    # A COMPLETED source job: no plan restart.
    completed_job = launch(f.repository, clock)
    source = new_step(f.repository, clock, completed_job, "load")
    plan(f.repository, source, "a")
    move(f.repository, clock, source.id, S.COMPLETED)
    with f.repository.begin() as uow:
        current = uow.executions.get(completed_job.id)
        assert current is not None
        uow.executions.transition(current.id, current.version, to(S.COMPLETED, clock))
        uow.commit()
    third = launch(f.repository, clock)
    with f.repository.begin() as uow, pytest.raises(PartitionStateCorrupt):
        uow.partitions.restart_plan(source.id, new_step_id(uow, third))


def test_a_plan_restart_onto_a_completed_target_or_from_an_empty_source_is_refused(
    f: Fixture,
) -> None:
    """Scenario F30."""
    plan(f.repository, f.parent, "a")
    no_plan = new_step(f.repository, f.clock, f.execution, "load-2")
    fail_job(f.repository, f.clock, f.execution)
    second = launch(f.repository, f.clock, f.execution.job_instance_id)
    completed_target = new_step(f.repository, f.clock, second, "load")
    move(f.repository, f.clock, completed_target.id, S.COMPLETED)
    target_2 = new_step(f.repository, f.clock, second, "load-2")
    with f.repository.begin() as uow:
        with pytest.raises(PartitionParentNotActive) as inactive:
            uow.partitions.restart_plan(f.parent.id, completed_target.id)
        assert (inactive.value.step_execution_id, inactive.value.status) == (
            completed_target.id,
            "COMPLETED",
        )
        with pytest.raises(PartitionStateCorrupt):
            uow.partitions.restart_plan(no_plan.id, target_2.id)
        uow.commit()
    assert stored_plan(f.repository, completed_target.id) == []
    assert stored_plan(f.repository, target_2.id) == []


# --------------------------------------------------------------------------- corrupt rows


def test_a_tampered_partition_context_checksum_fails_closed(
    f: Fixture, admin: psycopg.Connection[Any]
) -> None:
    """Scenario N6."""
    (created,) = plan(f.repository, f.parent, "a")
    admin.execute(
        'UPDATE pybatch.step_partition SET context_payload = \'{"key": "b"}\' WHERE id = %s',
        (created.id,),
    )
    with f.repository.begin() as uow:
        with pytest.raises(PartitionStateCorrupt):
            uow.partitions.plan(f.parent.id)
        with pytest.raises(PartitionStateCorrupt):
            uow.partitions.claim(f.parent)


def test_corrupt_status_code_fails_closed(f: Fixture, admin: psycopg.Connection[Any]) -> None:
    plan(f.repository, f.parent, "a")
    admin.execute("ALTER TABLE pybatch.step_partition DISABLE TRIGGER step_partition_rules")
    admin.execute(
        "UPDATE pybatch.step_partition SET status = 'PAUSED', worker_step_execution_id = %s",
        (f.parent.id,),
    )
    with f.repository.begin() as uow, pytest.raises(PartitionStateCorrupt):
        uow.partitions.plan(f.parent.id)


def test_end_partition_worker_ends_worker_and_partition_together(f: Fixture) -> None:
    plan(f.repository, f.parent, "a", "b")
    assigned, worker = claim(f.repository, f.parent.id)
    other, _ = claim(f.repository, f.parent.id)
    with f.repository.begin() as uow:
        with pytest.raises(PartitionWorkerStale):  # the worker of another partition
            uow.partitions.end_worker(
                other.id, other.version, worker.id, to(S.COMPLETED, f.clock), ExitCode("COMPLETED")
            )
        assert uow.steps.get(worker.id) == worker  # nothing staged
        uow.partitions.end_worker(
            assigned.id, assigned.version, worker.id, to(S.FAILED, f.clock), ExitCode("BAD_ROW")
        )
        uow.commit()
    done, _ = stored_plan(f.repository, f.parent.id)
    assert (done.status, done.exit_status.value, done.version) == (S.FAILED, "BAD_ROW", 2)
    with f.repository.begin() as uow:
        ended = uow.steps.get(worker.id)
    assert ended is not None and ended.status is S.FAILED
    assert ended.metadata.exit_status.value == "BAD_ROW" and ended.version == worker.version + 2
    assert ended.metadata.failure is not None


def end_and_claim(
    uow: UnitOfWork,
    parent: StepExecution,
    partition: StepPartition,
    worker_id: int,
    clock: Any,
    *,
    fresh: bool = False,
) -> tuple[StepPartition, StepExecution] | None:
    """A worker loop's step: end `partition` COMPLETED and claim the next, in one round trip."""
    end = (to(S.COMPLETED, clock, worker_id), ExitCode("COMPLETED"))
    ending = (partition.id, partition.version, worker_id, end)
    return uow.partitions.claim(parent, fresh=fresh, ending=ending)


def step_rows(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT COUNT(*) FROM pybatch.step_execution").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("fresh", [False, True], ids=["claim", "fresh_claim"])
def test_an_end_refused_after_a_recovery_claims_nothing_and_names_the_refusal(
    f: Fixture, admin: psycopg.Connection[Any], fresh: bool
) -> None:
    """Another process recovered the partition (same worker, version + 1): the end is refused
    as stale and the next partition stays unclaimed, though the partition now sits at the
    version a successful end would have given it."""
    plan(f.repository, f.parent, "a", "b")
    assigned, worker = claim(f.repository, f.parent.id)
    admin.execute(
        "UPDATE pybatch.step_partition SET worker_lease_expires_at = now() - interval '1 second'"
        " WHERE id = %s",
        (assigned.id,),
    )
    with f.repository.begin() as uow:
        assert uow.partitions.recover_lost(assigned.id, assigned.version, worker.id)
        uow.commit()
    before, steps = stored_plan(f.repository, f.parent.id), step_rows(admin)
    with f.repository.begin() as uow, pytest.raises(StaleVersion) as stale:
        end_and_claim(uow, f.parent, assigned, worker.id, f.clock, fresh=fresh)
    assert (stale.value.expected, stale.value.actual) == (1, 2)
    assert stored_plan(f.repository, f.parent.id) == before and step_rows(admin) == steps
    assert before[1].worker_step_execution_id is None


@pytest.mark.parametrize("fresh", [False, True], ids=["claim", "fresh_claim"])
def test_an_end_and_its_claim_commit_together_in_one_round_trip_or_not_at_all(
    f: Fixture, admin: psycopg.Connection[Any], pg_config: Any, clock: ManualClock, fresh: bool
) -> None:
    """The end and the claim are one transaction under one Sync: a claim stopped by a lock wait
    (the new worker's foreign key waits on a locked job execution) leaves the end uncommitted."""
    plan(f.repository, f.parent, "a", "b")
    assigned, worker = claim(f.repository, f.parent.id)
    before, steps = stored_plan(f.repository, f.parent.id), step_rows(admin)
    config = attrs.evolve(pg_config, lock_timeout=datetime.timedelta(milliseconds=200))
    with psycopg.connect(admin.info.dsn) as holder:
        holder.execute(
            "SELECT 1 FROM pybatch.job_execution WHERE id = %s FOR UPDATE", (f.execution.id,)
        )
        with JobRepository.connect(config, clock=clock) as short_wait, short_wait.begin() as uow:
            with pytest.raises(Unavailable):
                end_and_claim(uow, f.parent, assigned, worker.id, f.clock, fresh=fresh)
    assert stored_plan(f.repository, f.parent.id) == before and step_rows(admin) == steps
    claims: list[Any] = []
    with f.repository.begin() as uow:
        conn = uow._lease.connection
        assert conn is not None

        def run() -> None:
            claims.append(end_and_claim(uow, f.parent, assigned, worker.id, f.clock, fresh=fresh))

        trace = traced(conn, run)
    assert [m for m in trace if m.startswith("F") and "\tSync" in m] == ["F\t4\tSync"]
    assert claims[0] is not None and claims[0][0].id == before[1].id
    done, _ = stored_plan(f.repository, f.parent.id)
    assert (done.status, done.version) == (S.COMPLETED, assigned.version + 1)
