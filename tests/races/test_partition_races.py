"""Partition races with real concurrent connections: each has exactly one winner and the
others get typed errors (behaviour.md 4.8, 5.2)."""

from __future__ import annotations

from typing import Any

import psycopg

from pybatch import JobRepository, UnitOfWork
from pybatch.errors import PartitionPlanExists, PartitionWorkerStale, StaleVersion
from pybatch.values.status import BatchStatus
from tests.contract.test_f_partitions import Fixture, assign, entries, move, plan
from tests.support.clock import ManualClock
from tests.support.race import race_units_of_work

S = BatchStatus


def test_two_parents_racing_to_create_one_plan(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    f = Fixture(repository, clock)

    def create(uow: UnitOfWork, index: int) -> int:
        return len(uow.create_step_partition_plan(f.parent.id, entries(f"x{index}", "y")))

    outcomes = race_units_of_work(repository, 4, create)
    assert sum(o.ok for o in outcomes) == 1
    assert {type(o.error) for o in outcomes if not o.ok} == {PartitionPlanExists}
    row = admin.execute("SELECT COUNT(*) FROM pybatch.step_partition").fetchone()
    assert row == (2,)


def test_assignments_racing_for_one_partition(
    repository: JobRepository, clock: ManualClock
) -> None:
    f = Fixture(repository, clock)
    (partition,) = plan(repository, f.parent, "a")
    workers = [f.worker() for _ in range(4)]
    outcomes = race_units_of_work(
        repository,
        4,
        lambda uow, i: uow.assign_step_partition(partition.id, 0, workers[i].id),
    )
    assert sum(o.ok for o in outcomes) == 1
    assert {type(o.error) for o in outcomes if not o.ok} == {StaleVersion}


def test_completions_racing_with_a_stale_worker_have_one_winner(
    repository: JobRepository, clock: ManualClock
) -> None:
    f = Fixture(repository, clock)
    (partition,) = plan(repository, f.parent, "a")
    old = f.worker()
    assigned = assign(repository, partition, old.id)
    move(repository, clock, old.id, S.FAILED)
    with repository.begin() as uow:
        failed = uow.complete_step_partition(assigned.id, assigned.version, old.id)
        uow.commit()
    current = f.worker()
    retried = assign(repository, failed, current.id)
    move(repository, clock, current.id, S.COMPLETED)
    worker_of = [current.id, current.id, old.id]
    outcomes = race_units_of_work(
        repository,
        3,
        lambda uow, i: uow.complete_step_partition(retried.id, retried.version, worker_of[i]),
    )
    assert [o.ok for o in outcomes].count(True) == 1
    assert isinstance(outcomes[2].error, PartitionWorkerStale)
    assert {type(o.error) for o in outcomes[:2] if not o.ok} == {StaleVersion}
    with repository.begin() as uow:
        (stored,) = uow.step_partition_plan(f.parent.id)
    assert (stored.status, stored.worker_step_execution_id) == (S.COMPLETED, current.id)
