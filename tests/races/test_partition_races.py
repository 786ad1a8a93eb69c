"""Partition races with real concurrent connections: each has exactly one winner and the
others get typed errors."""

from __future__ import annotations

from typing import Any, cast

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository, UnitOfWork
from pybatch import _partitioned as partitioned
from pybatch.errors import (
    PartitionPlanExists,
    PartitionWorkerStale,
    StaleVersion,
)
from pybatch.values.ownership import ExecutionLease
from pybatch.values.status import BatchStatus
from tests.contract.test_step_partitions import Fixture, claim, entries, plan, to
from tests.support.clock import ManualClock
from tests.support.race import DEADLINE_SECONDS, portable, race, race_processes, race_units_of_work

S = BatchStatus


def test_two_parents_racing_to_create_one_plan(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    f = Fixture(repository, clock)

    def create(uow: UnitOfWork, index: int) -> int:
        return len(uow.partitions.create_plan(f.parent.id, entries(f"x{index}", "y")))

    outcomes = race_units_of_work(repository, 4, create)
    assert sum(o.ok for o in outcomes) == 1
    assert {type(o.error) for o in outcomes if not o.ok} == {PartitionPlanExists}
    row = admin.execute("SELECT COUNT(*) FROM pybatch.step_partition").fetchone()
    assert row == (2,)


def test_ends_racing_with_a_stale_worker_have_one_winner(
    repository: JobRepository, clock: ManualClock
) -> None:
    f = Fixture(repository, clock)
    plan(repository, f.parent, "a")
    claimed, current = claim(repository, f.parent.id)
    stale = f.worker()  # a sibling step that is not the partition's worker
    worker_of = [current.id, current.id, stale.id]
    outcomes = race_units_of_work(
        repository,
        3,
        lambda uow, i: uow.partitions.end_worker(
            claimed.id, claimed.version, worker_of[i], to(S.COMPLETED, clock), None
        ),
    )
    assert [o.ok for o in outcomes].count(True) == 1
    assert isinstance(outcomes[2].error, PartitionWorkerStale)
    assert {type(o.error) for o in outcomes[:2] if not o.ok} == {StaleVersion}
    with repository.begin() as uow:
        (stored,) = uow.partitions.plan(f.parent.id)
    assert (stored.status, stored.worker_step_execution_id) == (S.COMPLETED, current.id)


@pytest.mark.parametrize("fresh", [False, True], ids=["claim", "fresh_claim"])
def test_eight_claimers_never_take_the_same_partition(
    repository: JobRepository, clock: ManualClock, fresh: bool
) -> None:
    f = Fixture(repository, clock)
    plan(repository, f.parent, *(f"k{i:02d}" for i in range(60)))
    parent = f.parent

    def claim_all(index: int) -> list[str]:
        taken: list[str] = []
        while True:
            with repository.begin() as uow:
                claimed = uow.partitions.claim(parent, fresh=fresh)
                uow.commit()
            if claimed is None:
                return taken
            taken.append(claimed[0].key.value)

    outcomes = race(8, claim_all, timeout=120)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    keys = [key for o in outcomes for key in (o.value or [])]
    assert sorted(keys) == [f"k{i:02d}" for i in range(60)]  # each exactly once
    with repository.begin() as uow:
        stored = uow.partitions.plan(parent.id)
        workers = uow.steps.of_execution(f.execution.id)
    assert {p.status for p in stored} == {S.STARTED} and {p.version for p in stored} == {1}
    assert len({p.worker_step_execution_id for p in stored}) == 60
    assert len(workers) == 61  # the parent and one worker step per claim, none wasted


def claim_and_end_in_process(
    config: dict[str, Any], barrier: Any, parent_id: int, fresh: bool
) -> list[str]:
    """Child process: its own repository; behind the barrier, claim and end until none is left."""
    with JobRepository.connect(ConnectionConfig(**config)) as repository:
        with repository.begin() as uow:
            parent = uow.steps.get(parent_id)
        assert parent is not None
        barrier.wait(DEADLINE_SECONDS)
        keys: list[str] = []
        lease = ExecutionLease()
        while (
            claimed := repository.run_in_unit_of_work(
                lambda uow: partitioned._claim_in(uow, (parent, lease, fresh))
            )
        ) is not None:
            partition, worker, *_ = claimed
            partitioned._end_worker(repository, partition, worker.id, S.COMPLETED)
            keys.append(partition.key.value)
        return keys


@pytest.mark.parametrize("fresh", [False, True], ids=["claim", "fresh_claim"])
def test_worker_processes_claim_and_end_every_partition_exactly_once(
    pg_config: ConnectionConfig, repository: JobRepository, clock: ManualClock, fresh: bool
) -> None:
    f = Fixture(repository, clock)
    expected = [f"k{i:02d}" for i in range(40)]
    plan(repository, f.parent, *expected)
    results = race_processes(4, claim_and_end_in_process, [portable(pg_config), f.parent.id, fresh])
    keys = [key for taken in cast(list[list[str]], results) for key in taken]
    assert sorted(keys) == expected  # each claimed by exactly one process
    with repository.begin() as uow:
        stored = uow.partitions.plan(f.parent.id)
        workers = uow.steps.of_execution(f.execution.id)
    assert {(p.status, p.version) for p in stored} == {(S.COMPLETED, 2)}
    assert len(workers) == 41  # the parent and one worker step per claim, none wasted
    assert {w.status for w in workers if w.id != f.parent.id} == {S.COMPLETED}
