"""Partition workers own their partitions through leases.

What a script author relies on: while a worker lives, nothing that happens to its idle
connections lets another worker recover its partition; a worker killed mid-partition has
its partition recovered once its lease runs out and finished exactly once; a role without
pybatch's grants cannot block that recovery by taking a lock key; a worker whose partition
was recovered gets a typed error naming the lost ownership and touches nothing.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch import _partitioned as partitioned
from pybatch._lease_keeper import PartitionLeaseKeeper
from pybatch.errors import PartitionOwnershipLost
from pybatch.etl import ETL_STATE_SCHEMA, Job, JobRun, PartitionRun, join_partitioned_step
from pybatch.values.flow import StartLimit
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.records import StepExecution
from pybatch.values.status import BatchStatus, FailureCategory

S = BatchStatus
ROWS = 20
CHUNK = 5
LEASE = ExecutionLease(datetime.timedelta(seconds=2))
PARAMS = {"run": 1}


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute(
        "CREATE TABLE public.orders (id bigint NOT NULL, part text NOT NULL, worker bigint)"
    )


def rows(admin: psycopg.Connection[Any]) -> tuple[int, int]:
    """(rows, distinct ids): no unique key, so a chunk applied twice shows as a mismatch."""
    row = admin.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM public.orders").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def loader(pause: Callable[[PartitionRun, int], None] | None = None) -> Any:
    """Write the partition's ROWS in chunks of CHUNK from its checkpoint; `pause` after each."""

    def load(partition: PartitionRun) -> None:
        first = int(partition.partition_context["first"])
        offset = int(partition.checkpoint.get("offset", 0))
        while offset < ROWS:
            ids = range(first + offset, first + offset + CHUNK)
            with partition.chunk() as chunk:
                chunk.executemany(
                    "INSERT INTO public.orders (id, part, worker) VALUES (%s, %s, %s)",
                    [(i, partition.key, partition.execution.id) for i in ids],
                )
                offset += CHUNK
                chunk.commit(read=CHUNK, written=CHUNK, checkpoint={"offset": offset})
            if pause is not None and offset < ROWS:
                pause(partition, offset)

    return load


def publish(repository: JobRepository, job: Job, partitions: int) -> tuple[JobRun, StepExecution]:
    """Launch the job and publish a plan of `partitions` partitions for step "load"."""
    run = job.launch()
    plan = {f"p{i}": {"first": i * ROWS + 1} for i in range(partitions)}
    entries = partitioned.plan_entries(plan, ETL_STATE_SCHEMA)
    _skipped, parent = partitioned.start_partitioned_step(
        repository, run.instance.id, run.execution.id, "load", entries, StartLimit.unrestricted()
    )
    return run, parent


def plan_state(admin: psycopg.Connection[Any], parent_id: int) -> list[tuple[Any, ...]]:
    """(key, status, worker, owner token set, lease set) of each partition, in key order."""
    return admin.execute(
        "SELECT partition_key, status, worker_step_execution_id,"
        " worker_owner_token IS NOT NULL, worker_lease_expires_at IS NOT NULL"
        " FROM pybatch.step_partition WHERE step_execution_id = %s ORDER BY partition_key",
        (parent_id,),
    ).fetchall()


def worker_steps(repository: JobRepository, run: JobRun, parent_id: int) -> list[StepExecution]:
    with repository.begin() as uow:
        return [s for s in uow.steps.of_execution(run.execution.id) if s.id != parent_id]


def wait_for_partition_lease_expiry(admin: psycopg.Connection[Any], worker_id: int) -> None:
    """A dead worker's lease runs out on the database clock; wait until it has."""
    deadline = time.monotonic() + 30
    while True:
        row = admin.execute(
            "SELECT worker_lease_expires_at <= clock_timestamp() FROM pybatch.step_partition"
            " WHERE worker_step_execution_id = %s",
            (worker_id,),
        ).fetchone()
        assert row is not None
        if row[0]:
            return
        assert time.monotonic() < deadline, "the dead worker's lease never ran out"
        time.sleep(0.05)


def recover_lost(repository: JobRepository, parent_id: int) -> int:
    """One recovery pass over the plan, as any worker runs it; how many partitions it took back."""
    return partitioned.recover_lost_workers(repository, parent_id)


def join_in_thread(config: ConnectionConfig, load: Any) -> list[int]:
    """Another worker joins the plan; returns how many partitions it ran."""
    ran: list[int] = []

    def join() -> None:
        with JobRepository.connect(config) as other:
            ran.append(join_partitioned_step(other, "fanout", PARAMS, "load", load, lease=LEASE))

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the joining worker never finished the plan"
    return ran


def finish(repository: JobRepository, run: JobRun, parent: StepExecution) -> StepExecution:
    ended, unfinished = partitioned.aggregate_plan(repository, parent)
    assert unfinished == []
    with run:
        pass
    return ended


# --------------------------------------------------------------------------- (a) intruder


@pytest.mark.usefixtures("orders")
def test_a_role_without_grants_cannot_block_recovery_of_a_dead_workers_partition(
    repository: JobRepository,
    pg_config: ConnectionConfig,
    admin: psycopg.Connection[Any],
    db_dsn: str,
) -> None:
    """Any role may take any advisory-lock key (the worker step's old one too): the lease rules."""
    run, parent = publish(repository, Job(repository, "fanout", PARAMS, lease=LEASE.duration), 2)
    # A worker claims p0, commits one chunk, and dies (its lease is no longer renewed).
    claimed = repository.run_in_unit_of_work(
        lambda uow: partitioned._claim_in(uow, (parent, LEASE, False))
    )
    assert claimed is not None
    partition, dead, token, _ = claimed
    worker_run = JobRun(repository, run.instance, run.execution, None)

    def die(partition_run: PartitionRun, offset: int) -> None:
        raise SystemExit("killed")

    with pytest.raises(SystemExit):
        # A keeper never started: the dead worker renews nothing.
        keeper = PartitionLeaseKeeper(repository, partition.id, dead.id, token, LEASE)
        loader(die)(PartitionRun(worker_run, dead, partition, keeper))
    admin.execute("DROP ROLE IF EXISTS pybatch_intruder")
    admin.execute("CREATE ROLE pybatch_intruder LOGIN")
    intruder_dsn = db_dsn.replace(f"user={admin.info.user}", "user=pybatch_intruder")
    try:
        with psycopg.connect(intruder_dsn, autocommit=True) as intruder:
            taken = intruder.execute(
                "SELECT pg_try_advisory_lock("
                "hashtextextended('pybatch.step_execution.liveness', %s))",
                (dead.id,),
            ).fetchone()
            assert taken == (True,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                intruder.execute("SELECT 1 FROM pybatch.step_partition FOR UPDATE")
            ran = join_in_thread(pg_config, loader())
    finally:
        admin.execute("DROP OWNED BY pybatch_intruder")
        admin.execute("DROP ROLE pybatch_intruder")
    assert ran == [2]  # p1, then p0 once recovered
    assert rows(admin) == (2 * ROWS, 2 * ROWS)
    ended = finish(repository, run, parent)
    assert ended.status is S.COMPLETED and ended.metadata.counts.written == 2 * ROWS
    workers = {int(w.id): w for w in worker_steps(repository, run, parent.id)}
    failure = workers[dead.id].metadata.failure
    assert workers[dead.id].status is S.FAILED
    assert failure is not None and failure.category is FailureCategory.STALE_RECOVERED
    assert [w.status for w in workers.values()].count(S.COMPLETED) == 2


# --------------------------------------------------------------------------- (b) live worker


#: The live worker's lease: every renewal may first find its pooled connections ended, and a
#: shared CI machine can stall a thread for a second; the pauses still outlast it.
LIVE_LEASE = ExecutionLease(datetime.timedelta(seconds=4))


@pytest.mark.usefixtures("orders")
def test_a_live_workers_killed_idle_connections_never_let_its_partition_be_recovered(
    repository: JobRepository,
    pg_config: ConnectionConfig,
    admin: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Between chunks: every idle pybatch session is terminated (idle_session_timeout too,
    from PostgreSQL 14), then another worker looks for lost workers after more than a lease."""
    major = admin.info.server_version // 10000
    if major >= 14:  # idle_session_timeout exists from PostgreSQL 14 on
        admin.execute(f'ALTER DATABASE "{admin.info.dbname}" SET idle_session_timeout = 1000')
    job = Job(repository, "fanout", PARAMS, lease=LIVE_LEASE.duration)
    run, parent = publish(repository, job, 1)
    recovered: list[int] = []
    killed: list[int] = []

    def pause(partition_run: PartitionRun, offset: int) -> None:
        found = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND application_name = 'pybatch' AND state = 'idle'"
        ).fetchall()
        killed.append(len(found))
        time.sleep(LIVE_LEASE.duration.total_seconds() * 1.5)
        with JobRepository.connect(pg_config) as other:
            recovered.append(recover_lost(other, parent.id))

    with JobRepository.connect(pg_config) as worker_repository:
        ran = join_partitioned_step(
            worker_repository, "fanout", PARAMS, "load", loader(pause), lease=LIVE_LEASE
        )
    renewals = [r.getMessage() for r in caplog.records if "renew" in r.getMessage()]
    assert recovered == [0] * (ROWS // CHUNK - 1), f"the live worker's renewals: {renewals}"
    assert ran == 1
    assert all(killed) and len(killed) == ROWS // CHUNK - 1
    assert rows(admin) == (ROWS, ROWS)
    ended = finish(repository, run, parent)
    assert ended.status is S.COMPLETED
    [worker] = worker_steps(repository, run, parent.id)
    assert worker.status is S.COMPLETED and worker.metadata.failure is None
    assert plan_state(admin, parent.id) == [("p0", "COMPLETED", worker.id, False, False)]


# --------------------------------------------------------------------------- (c) SIGKILL


def _doomed_worker(config: ConnectionConfig, committed: Any) -> None:
    """A forked worker: commits the first chunk of its partition, then hangs until killed."""

    def hang(partition_run: PartitionRun, offset: int) -> None:
        committed.set()
        while True:
            time.sleep(1)

    code = 1
    try:
        with JobRepository.connect(config) as own:
            join_partitioned_step(own, "fanout", PARAMS, "load", loader(hang), lease=LEASE)
        code = 0
    finally:
        os._exit(code)


@pytest.mark.usefixtures("orders")
def test_a_sigkilled_workers_partition_is_recovered_after_its_lease_and_finished_once(
    repository: JobRepository, pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    run, parent = publish(repository, Job(repository, "fanout", PARAMS, lease=LEASE.duration), 1)
    context = multiprocessing.get_context("fork")
    committed = context.Event()
    process = context.Process(target=_doomed_worker, args=(pg_config, committed), daemon=True)
    process.start()
    try:
        assert committed.wait(timeout=60), "the worker never committed its first chunk"
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.join(timeout=30)
    assert process.exitcode == -signal.SIGKILL
    [(_key, status, dead_id, owned, leased)] = plan_state(admin, parent.id)
    assert (status, owned, leased) == ("STARTED", True, True)
    assert rows(admin) == (CHUNK, CHUNK)
    ran = join_in_thread(pg_config, loader())
    assert ran == [1]
    assert rows(admin) == (ROWS, ROWS)  # the survivor resumed from the dead worker's checkpoint
    ended = finish(repository, run, parent)
    assert ended.status is S.COMPLETED and ended.metadata.counts.written == ROWS
    workers = {int(w.id): w for w in worker_steps(repository, run, parent.id)}
    dead = workers.pop(dead_id)
    assert dead.status is S.FAILED and dead.metadata.failure is not None
    assert dead.metadata.failure.category is FailureCategory.STALE_RECOVERED
    [survivor] = workers.values()
    assert survivor.status is S.COMPLETED
    [(_key, status, worker_id, owned, leased)] = plan_state(admin, parent.id)
    assert (status, worker_id, owned, leased) == ("COMPLETED", survivor.id, False, False)


# --------------------------------------------------------------------------- (d) stale worker


@pytest.mark.usefixtures("orders")
def test_a_stale_worker_gets_a_typed_error_and_touches_nothing(
    repository: JobRepository, pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    run, parent = publish(repository, Job(repository, "fanout", PARAMS, lease=LEASE.duration), 1)
    lost: list[PartitionOwnershipLost] = []
    stale_worker: list[int] = []
    recovered: list[int] = []
    ran_by_other: list[int] = []

    def stall(partition_run: PartitionRun, offset: int) -> None:
        if stale_worker:
            return
        stale_worker.append(partition_run.execution.id)
        # The process stalls (a long GC pause, a frozen VM) longer than its lease.
        keeper = partition_run._lease_keeper
        assert keeper is not None
        keeper.halt()
        wait_for_partition_lease_expiry(admin, partition_run.execution.id)
        # Meanwhile another worker recovers the partition and finishes it.
        with JobRepository.connect(pg_config) as other:
            recovered.append(recover_lost(other, parent.id))
            ran_by_other.append(
                join_partitioned_step(other, "fanout", PARAMS, "load", loader(), lease=LEASE)
            )

    stale_load = loader(stall)

    def stale(partition_run: PartitionRun) -> None:
        try:
            stale_load(partition_run)
        except PartitionOwnershipLost as error:
            lost.append(error)
            raise

    with JobRepository.connect(pg_config) as worker_repository:
        ran = join_partitioned_step(worker_repository, "fanout", PARAMS, "load", stale, lease=LEASE)
    assert ran == 1 and recovered == [1] and ran_by_other == [1]
    [error] = lost
    assert (error.partition_id, error.worker) == (
        plan_partition_id(admin, parent.id),
        stale_worker[0],
    )
    assert "no longer worked on" in str(error)
    assert rows(admin) == (ROWS, ROWS)  # the stale worker's second chunk rolled back
    workers = {int(w.id): w for w in worker_steps(repository, run, parent.id)}
    stale_step = workers.pop(stale_worker[0])
    assert stale_step.status is S.FAILED  # as the recovery left it
    assert stale_step.metadata.failure is not None
    assert stale_step.metadata.failure.category is FailureCategory.STALE_RECOVERED
    assert stale_step.metadata.counts.written == CHUNK
    [survivor] = workers.values()
    assert survivor.status is S.COMPLETED
    ended = finish(repository, run, parent)
    assert ended.status is S.COMPLETED and ended.metadata.counts.written == ROWS


def plan_partition_id(admin: psycopg.Connection[Any], parent_id: int) -> int:
    row = admin.execute(
        "SELECT id FROM pybatch.step_partition WHERE step_execution_id = %s", (parent_id,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_renewal_after_the_partition_ended_names_the_lost_ownership(
    repository: JobRepository,
) -> None:
    run, parent = publish(repository, Job(repository, "fanout", PARAMS, lease=LEASE.duration), 1)
    owner = OwnerToken.generate()
    with repository.begin() as uow:
        claimed = uow.partitions.claim(parent, owner, LEASE)
        uow.commit()
    assert claimed is not None
    partition, worker = claimed
    with repository.begin() as uow:
        uow.ownership.renew_partition_lease(partition.id, worker.id, owner, LEASE)
        with pytest.raises(PartitionOwnershipLost) as other_token:
            uow.ownership.renew_partition_lease(
                partition.id, worker.id, OwnerToken.generate(), LEASE
            )
        assert (other_token.value.partition_id, other_token.value.worker) == (
            partition.id,
            worker.id,
        )
        uow.commit()
    partitioned._end_worker(repository, partition, worker.id, S.COMPLETED)
    with repository.begin() as uow, pytest.raises(PartitionOwnershipLost):
        uow.ownership.renew_partition_lease(partition.id, worker.id, owner, LEASE)
    partitioned.aggregate_plan(repository, parent)
    with run:
        pass
