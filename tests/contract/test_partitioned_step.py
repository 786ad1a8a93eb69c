"""The partitioned-step ETL API: local worker processes, a worker joining from "another
host", failed partitions named, and a restart that reruns only what did not complete.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import PartitionPlanNotCommitted, PartitionsFailed
from pybatch.etl import Job, PartitionRun, join_partitioned_step
from pybatch.values.status import BatchStatus

S = BatchStatus
ROWS_PER_PARTITION = 20


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, part text NOT NULL, worker bigint)"
    )


def plan_of(n: int) -> dict[str, dict[str, int]]:
    return {f"p{i:03d}": {"first": i * ROWS_PER_PARTITION + 1} for i in range(n)}


def load(partition: PartitionRun) -> None:
    """Write the partition's rows in chunks of 5, resuming from the checkpoint."""
    first = int(partition.partition_context["first"])
    offset = int(partition.checkpoint.get("offset", 0))
    while offset < ROWS_PER_PARTITION:
        ids = range(first + offset, first + min(offset + 5, ROWS_PER_PARTITION))
        with partition.chunk() as chunk:
            chunk.executemany(
                "INSERT INTO public.orders (id, part, worker) VALUES (%s, %s, %s)",
                [(i, partition.key, partition.execution.id) for i in ids],
            )
            offset += len(ids)
            chunk.commit(read=len(ids), written=len(ids), checkpoint={"offset": offset})


def business(admin: psycopg.Connection[Any]) -> tuple[int, int]:
    row = admin.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM public.orders").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.usefixtures("orders")
def test_local_workers_complete_every_partition_once(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    with Job(repository, "fanout", {"run": 1}).launch() as run:
        outcome = run.partitioned_step("load", plan_of(12), load, workers=3)
    parent = outcome.step
    assert parent.status is S.COMPLETED
    assert parent.metadata.counts.written == 12 * ROWS_PER_PARTITION
    assert business(admin) == (12 * ROWS_PER_PARTITION, 12 * ROWS_PER_PARTITION)
    with repository.begin() as uow:
        plan = uow.partitions.plan(parent.id)
        assert uow.partitions.count_by_status(parent.id) == {S.COMPLETED: 12}
    assert len({p.worker_step_execution_id for p in plan}) == 12
    assert run.execution.status is S.COMPLETED


@pytest.mark.usefixtures("orders")
def test_failed_partitions_are_named_and_a_restart_reruns_only_them(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    broken = {"p002", "p005"}

    def flaky(partition: PartitionRun) -> None:
        if partition.key in broken:
            raise RuntimeError("source file missing")
        load(partition)

    with (
        pytest.raises(PartitionsFailed) as failed,
        Job(repository, "fanout", {"run": 2}).launch() as first,
    ):
        first.partitioned_step("load", plan_of(8), flaky, workers=2)
    assert failed.value.keys == ("p002", "p005") and failed.value.status == "FAILED"
    assert first.execution.status is S.FAILED
    assert business(admin) == (6 * ROWS_PER_PARTITION, 6 * ROWS_PER_PARTITION)
    ran: list[str] = []

    def record(partition: PartitionRun) -> None:
        ran.append(partition.key)
        load(partition)

    broken.clear()
    with Job(repository, "fanout", {"run": 2}).launch() as second:
        outcome = second.partitioned_step("load", plan_of(8), record, workers=0)
    assert sorted(ran) == ["p002", "p005"]
    assert outcome.step.status is S.COMPLETED
    assert outcome.step.metadata.counts.written == 8 * ROWS_PER_PARTITION
    assert business(admin) == (8 * ROWS_PER_PARTITION, 8 * ROWS_PER_PARTITION)


@pytest.mark.usefixtures("orders")
def test_a_worker_from_another_host_joins_the_same_plan(
    repository: JobRepository, pg_config: Any, admin: psycopg.Connection[Any]
) -> None:
    joined: list[int] = []

    def remote() -> None:  # another host: its own repository, found by job name
        with JobRepository.connect(pg_config) as other:
            joined.append(join_partitioned_step(other, "fanout", {"run": 3}, "load", load))

    thread = threading.Thread(target=remote)
    thread.start()
    with Job(repository, "fanout", {"run": 3}).launch() as run:
        outcome = run.partitioned_step("load", plan_of(10), load, workers=1)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert outcome.step.status is S.COMPLETED
    assert business(admin) == (10 * ROWS_PER_PARTITION, 10 * ROWS_PER_PARTITION)
    assert len(joined) == 1  # it joined; how many it took depends on timing


def test_claim_refused_before_the_plan_is_published(repository: JobRepository) -> None:
    from pybatch.values.names import NodeId, StepName
    from pybatch.values.partitions import PartitionPlanEntry
    from pybatch.values.state import ExecutionContext

    with Job(repository, "fanout", {"run": 4}).launch() as run, repository.begin() as uow:
        parent = uow.flow.create_step(run.execution.id, StepName("s"), NodeId("s"))
        from pybatch.values.lifecycle import LifecycleTransition

        parent = uow.steps.transition(
            parent.id, 0, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        uow.partitions.create_plan(parent.id, [PartitionPlanEntry("a", ExecutionContext.empty())])
        with pytest.raises(PartitionPlanNotCommitted):
            uow.partitions.claim(parent)


@pytest.mark.usefixtures("orders")
def test_a_partition_holds_one_connection_for_all_its_chunks_and_gives_it_back(
    repository: JobRepository, admin: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pool checkout per partition, not per chunk; more partitions than pooled
    connections still all run, so each partition gave its connection back."""
    transactions = repository.transactions
    lease = transactions.lease
    leases = 0

    def counting_lease(*args: Any, **kwargs: Any) -> Any:
        nonlocal leases
        if threading.current_thread() is threading.main_thread():  # not the lease keeper
            leases += 1
        return lease(*args, **kwargs)

    monkeypatch.setattr(transactions, "lease", counting_lease)
    per_partition: dict[str, int] = {}

    def traced(partition: PartitionRun) -> None:
        first = int(partition.partition_context["first"])
        before = leases
        for start in range(0, ROWS_PER_PARTITION, 5):
            with partition.chunk() as chunk:
                ids = range(first + start, first + start + 5)
                chunk.executemany(
                    "INSERT INTO public.orders (id, part, worker) VALUES (%s, %s, %s)",
                    [(i, partition.key, partition.execution.id) for i in ids],
                )
                chunk.commit(read=5, written=5, checkpoint={"offset": start + 5})
        per_partition[partition.key] = leases - before

    partitions = repository.config.pool_size * 2
    with Job(repository, "fanout", {"run": 5}).launch() as run:
        outcome = run.partitioned_step("load", plan_of(partitions), traced, workers=0)
    assert outcome.step.status is S.COMPLETED
    assert per_partition == {key: 1 for key in plan_of(partitions)}
    assert business(admin) == (partitions * ROWS_PER_PARTITION,) * 2
