"""The ETL API (pybatch.etl, docs/etl-guide.md): launch, steps, chunks, restart, orphans.

What a script author relies on: a failed run restarts where its last chunk committed,
completed steps are skipped, counters carry over, nothing is written twice, a dead process
is recovered with an audited decision, and a live one is never taken over.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import CompletedInstance, ExecutionAlreadyActive, NotCommitted
from pybatch.etl import Job, JobRun, StepRun
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ExitCode, NodeId, StepName
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.conftest import plaintext_config
from tests.support.clock import ManualClock
from tests.support.race import portable

S = BatchStatus
DAY = {"business_date": "2026-11-30"}

Work = Callable[[StepRun], None]


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def business_ids(admin: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in admin.execute("SELECT id FROM public.orders ORDER BY id")]


def loader(
    total: int, size: int, *, fail_at: int | None = None, seen: list[dict[str, int]] | None = None
) -> Work:
    """A step that loads ids 1..total in chunks of `size`, resuming from its checkpoint.

    With `fail_at`, the chunk containing that id is written but raises before its commit.
    `seen` records what the step saw when it started (checkpoint and carried counters).
    """

    def work(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        if seen is not None:
            seen.append(
                {
                    "offset": offset,
                    "read": step.read_count,
                    "written": step.written_count,
                    "commits": step.commit_count,
                }
            )
        while offset < total:
            batch = list(range(offset + 1, min(offset + size, total) + 1))
            with step.chunk() as chunk:
                chunk.executemany(
                    "INSERT INTO public.orders (id, note) VALUES (%s, %s)",
                    [(item, step.name) for item in batch],
                )
                if fail_at in batch:
                    raise RuntimeError("bad row")
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})

    return work


def executions(repository: JobRepository, run: JobRun) -> list[JobExecution]:
    with repository.begin() as uow:
        return uow.executions.of_instance(run.instance.id)


def steps_of(repository: JobRepository, execution_id: int) -> dict[str, StepExecution]:
    with repository.begin() as uow:
        return {step.step_name.value: step for step in uow.steps.of_execution(execution_id)}


def decisions(admin: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with admin.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM pybatch.recovery_decision ORDER BY id").fetchall()


def advisory_locks(admin: psycopg.Connection[Any]) -> int:
    """Advisory locks held in the test database: a run holds none (the lease is row state)."""
    row = admin.execute(
        """
        SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND granted
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
        """
    ).fetchone()
    assert row is not None
    return int(row[0])


#: A short lease, so that tests of dead runs wait one second instead of thirty.
SHORT_LEASE = datetime.timedelta(seconds=1)


def lease_expires_at(admin: psycopg.Connection[Any], execution_id: int) -> Any:
    row = admin.execute(
        "SELECT lease_expires_at FROM pybatch.job_execution WHERE id = %s", (execution_id,)
    ).fetchone()
    assert row is not None
    return row[0]


def wait_for_lease_expiry(admin: psycopg.Connection[Any], execution_id: int) -> None:
    """A dead run's lease runs out on the database clock; wait until it has."""
    deadline = time.monotonic() + 20
    while True:
        row = admin.execute(
            "SELECT lease_expires_at <= clock_timestamp() FROM pybatch.job_execution WHERE id = %s",
            (execution_id,),
        ).fetchone()
        assert row is not None
        if row[0]:
            return
        assert time.monotonic() < deadline, "the dead run's lease never ran out"
        time.sleep(0.05)


def start_open_step(repository: JobRepository, run: JobRun, name: str) -> StepRun:
    """A step left STARTED, as `JobRun.step` leaves it while the work function runs."""
    with repository.begin() as uow:
        step = uow.flow.create_step(run.execution.id, StepName(name), NodeId(name))
        step = uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        uow.commit()
    return StepRun(run, step)


# --------------------------------------------------------------------------- first run


def test_first_run_completes_and_the_instance_never_runs_again(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY)
    seen: list[dict[str, int]] = []
    with job.launch() as run:
        assert (run.attempt, run.restarted) == (1, False)
        assert run.execution.status is S.STARTED
        # Liveness is a lease on the row, renewed by the run through its pool: no session
        # lock and no connection of its own, so it works behind a transaction-pooling proxy.
        assert advisory_locks(admin) == 0
        assert lease_expires_at(admin, run.execution.id) is not None
        outcome = run.step("load", loader(5, 2, seen=seen))
    assert seen == [{"offset": 0, "read": 0, "written": 0, "commits": 0}]
    assert not outcome.skipped
    assert outcome.step.status is S.COMPLETED
    assert outcome.step.metadata.exit_status == ExitCode("COMPLETED")
    assert business_ids(admin) == [1, 2, 3, 4, 5]

    [execution] = executions(repository, run)
    assert execution.status is S.COMPLETED
    assert execution.metadata.exit_status == ExitCode("COMPLETED")
    assert execution.metadata.failure is None
    assert run.execution == execution
    load = steps_of(repository, execution.id)["load"]
    counts = load.metadata.counts
    assert (counts.read, counts.processed, counts.written, counts.committed) == (5, 5, 5, 3)
    assert load.checkpoint.payload == {"offset": 5}
    assert advisory_locks(admin) == 0

    with pytest.raises(CompletedInstance):
        job.launch()
    assert len(executions(repository, run)) == 1
    assert advisory_locks(admin) == 0  # the refused launch took no lock


# --------------------------------------------------------------------------- failure and restart


def test_failed_step_fails_the_job_and_a_restart_resumes_from_the_checkpoint(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY)
    extract_calls: list[int] = []

    def extract(step: StepRun) -> None:
        extract_calls.append(step.execution.id)
        with step.chunk() as chunk:
            chunk.commit(read=1, written=0, checkpoint={"done": True})

    # Attempt 1: ids 1..6 commit in two chunks; the chunk with id 8 raises before its commit.
    with pytest.raises(RuntimeError, match="bad row"), job.launch() as first:
        first.step("extract", extract)
        first.step("load", loader(10, 3, fail_at=8))
    assert business_ids(admin) == [1, 2, 3, 4, 5, 6]
    [failed] = executions(repository, first)
    assert failed.status is S.FAILED
    assert failed.metadata.exit_status == ExitCode("FAILED")
    assert failed.metadata.failure == FailureSummary(
        FailureCategory.USER_COMPONENT, FailureId(failed.id)
    )
    assert failed.metadata.timestamps.ended_at is not None
    attempt_1 = steps_of(repository, failed.id)
    assert attempt_1["extract"].status is S.COMPLETED
    load_1 = attempt_1["load"]
    assert load_1.status is S.FAILED
    assert load_1.metadata.exit_status == ExitCode("FAILED")
    assert load_1.metadata.failure == FailureSummary(
        FailureCategory.USER_COMPONENT, FailureId(load_1.id)
    )
    assert (load_1.metadata.counts.read, load_1.metadata.counts.committed) == (6, 2)
    assert load_1.checkpoint.payload == {"offset": 6}
    assert advisory_locks(admin) == 0

    # Attempt 2: extract is skipped, load resumes at offset 6 with its counters carried over.
    seen: list[dict[str, int]] = []
    with job.launch() as second:
        assert (second.attempt, second.restarted) == (2, True)
        assert second.execution.restart_of_execution_id == failed.id
        skipped = second.step("extract", extract)
        resumed = second.step("load", loader(10, 3, seen=seen))
    assert skipped.skipped and skipped.step.id == attempt_1["extract"].id
    assert extract_calls == [failed.id]
    assert not resumed.skipped
    assert seen == [{"offset": 6, "read": 6, "written": 6, "commits": 2}]
    assert business_ids(admin) == list(range(1, 11))  # each id exactly once

    first_execution, completed = executions(repository, second)
    assert first_execution == failed
    assert (completed.attempt, completed.status) == (2, S.COMPLETED)
    assert completed.metadata.exit_status == ExitCode("COMPLETED")
    attempt_2 = steps_of(repository, completed.id)
    assert list(attempt_2) == ["load"]  # a skipped step leaves no row
    load_2 = attempt_2["load"]
    counts = load_2.metadata.counts
    assert (counts.read, counts.written, counts.committed) == (10, 10, 4)
    assert load_2.checkpoint.payload == {"offset": 10}
    with pytest.raises(CompletedInstance):
        job.launch()


def test_keyboard_interrupt_stops_the_run_and_it_can_restart(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY)

    def interrupted(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'kept')")
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (2, 'rolled back')")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), job.launch() as run:
        run.step("load", interrupted)
    [stopped] = executions(repository, run)
    assert stopped.status is S.STOPPED
    assert stopped.metadata.exit_status == ExitCode("STOPPED")
    assert stopped.metadata.failure is None
    step = steps_of(repository, stopped.id)["load"]
    assert step.status is S.STOPPED and step.metadata.exit_status == ExitCode("STOPPED")
    assert business_ids(admin) == [1]
    assert advisory_locks(admin) == 0

    seen: list[dict[str, int]] = []
    with job.launch() as again:
        assert again.attempt == 2
        again.step("load", loader(3, 5, seen=seen))
    assert seen == [{"offset": 1, "read": 1, "written": 1, "commits": 1}]
    assert business_ids(admin) == [1, 2, 3]
    assert executions(repository, again)[-1].status is S.COMPLETED


# --------------------------------------------------------------------------- connection


def test_a_step_holds_one_connection_for_its_chunks_and_gives_it_back(
    db_dsn: str, admin: psycopg.Connection[Any], orders: None
) -> None:
    """The chunks of a step run on one connection, leased once for the step: between chunks
    it is not in the pool (other work gets another connection), a chunk opened inside an
    open one gets its own, and it goes back before the step ends (with a pool of two, both
    steps and the job still end)."""
    config = plaintext_config(db_dsn, pool_size=2, acquire_timeout=timedelta(seconds=5))
    chunk_backends: list[int] = []
    other_backends: list[int] = []

    def work(step: StepRun) -> None:
        for first in (1, 3, 5):
            with step.chunk() as chunk:
                chunk_backends.append(chunk.connection.info.backend_pid)
                chunk.executemany(
                    "INSERT INTO public.orders VALUES (%s, 'held')", [(first,), (first + 1,)]
                )
                chunk.commit(read=2, written=2, checkpoint={"offset": first + 1})
            with step.run.repository.begin() as uow:
                other_backends.append(uow.connection.info.backend_pid)
        with step.chunk() as outer:
            chunk_backends.append(outer.connection.info.backend_pid)
            outer.execute("INSERT INTO public.orders VALUES (7, 'outer')")
            with step.chunk() as inner:
                other_backends.append(inner.connection.info.backend_pid)
                inner.rollback()
            outer.commit(read=1, written=1, checkpoint={"offset": 7})

    with JobRepository.connect(config) as repository:
        with Job(repository, "held_connection", DAY).launch() as run:
            first = run.step("load", work)
            second = run.step("check", lambda step: None)
        assert first.step.status is S.COMPLETED and second.step.status is S.COMPLETED
        assert first.step.metadata.counts.committed == 4
        assert first.step.metadata.counts.rolled_back == 1  # the inner chunk, rolled back
    assert len(chunk_backends) == 4 and len(set(chunk_backends)) == 1
    assert not set(other_backends) & set(chunk_backends)
    assert business_ids(admin) == [1, 2, 3, 4, 5, 6, 7]


def test_chunk_statements_report_what_they_did(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    """`copy` returns the rows it sent, from a list and from a generator alike; `execute`
    and `executemany` return the rows affected; all of it commits with the chunk."""
    reported: list[int] = []

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            reported.append(chunk.copy("COPY public.orders (id, note) FROM STDIN", [(1, "a")]))
            generated = ((n, "b") for n in (2, 3, 4))
            reported.append(chunk.copy("COPY public.orders (id, note) FROM STDIN", generated))
            reported.append(
                chunk.executemany("INSERT INTO public.orders VALUES (%s, 'c')", [(5,), (6,)])
            )
            reported.append(chunk.execute("UPDATE public.orders SET note = 'd' WHERE id > 4"))
            reported.append(chunk.execute("SELECT id FROM public.orders"))
            chunk.commit(read=6, written=6, checkpoint={"offset": 6})
        with step.chunk() as chunk:
            reported.append(chunk.copy("COPY public.orders (id, note) FROM STDIN", ()))
            chunk.commit(read=0, written=0, checkpoint={"offset": 6})

    with Job(repository, "counted", DAY).launch() as run:
        outcome = run.step("load", work)
    assert reported == [1, 3, 2, 2, 6, 0]
    assert outcome.step.metadata.counts.committed == 2
    assert business_ids(admin) == [1, 2, 3, 4, 5, 6]


# --------------------------------------------------------------------------- orphans


def test_orphaned_execution_is_recovered_on_the_next_launch(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    orphan_run = job.launch()
    orphan_run.step("extract", lambda step: None)
    open_step = start_open_step(repository, orphan_run, "load")
    with open_step.chunk() as chunk:
        chunk.execute("INSERT INTO public.orders VALUES (1, 'committed before the crash')")
        chunk.commit(read=1, written=1, checkpoint={"offset": 1})
    # The run stops renewing its lease (a dead process, or one cut off from the server)
    # with a chunk in flight.
    zombie_block = open_step.chunk()
    zombie = zombie_block.__enter__()
    zombie.execute("INSERT INTO public.orders VALUES (100, 'in flight')")
    [orphan] = executions(repository, orphan_run)
    orphan_run._stop_renewing()
    wait_for_lease_expiry(admin, orphan.id)

    clock.advance()
    seen: list[dict[str, int]] = []
    with job.launch() as run:
        assert (run.attempt, run.restarted) == (2, True)
        assert run.step("extract", lambda step: None).skipped
        run.step("load", loader(3, 5, seen=seen))
    assert seen == [{"offset": 1, "read": 1, "written": 1, "commits": 1}]
    # The old owner is fenced: its in-flight chunk and any new one cannot commit.
    with pytest.raises(NotCommitted):
        zombie.commit(read=1, written=1, checkpoint={"offset": 2})
    with pytest.raises(NotCommitted), open_step.chunk() as late:
        late.execute("INSERT INTO public.orders VALUES (9, 'written by the fenced owner')")
        late.commit(read=1, written=1, checkpoint={"offset": 9})
    assert business_ids(admin) == [1, 2, 3]

    [decision] = decisions(admin)
    assert decision["job_execution_id"] == orphan.id
    assert decision["reason_code"] == "OWNER_LOST"
    assert decision["prior_status"] == "STARTED"
    assert decision["resulting_status"] == "FAILED"
    assert decision["execution_version"] == orphan.version
    assert decision["decided_at"] == clock.now()
    assert len(bytes(decision["evidence_digest"])) == 32

    recovered, completed = executions(repository, run)
    assert recovered.id == orphan.id
    assert recovered.status is S.FAILED
    assert recovered.version == orphan.version + 1
    assert recovered.metadata.exit_status == orphan.metadata.exit_status  # exit unchanged
    assert recovered.metadata.failure is not None
    assert recovered.metadata.failure.category is FailureCategory.STALE_RECOVERED
    assert completed.status is S.COMPLETED
    orphan_steps = steps_of(repository, orphan.id)
    assert orphan_steps["extract"].status is S.COMPLETED
    assert orphan_steps["load"].status is S.FAILED
    assert orphan_steps["load"].metadata.failure is not None
    assert orphan_steps["load"].metadata.failure.category is FailureCategory.STALE_RECOVERED


def test_a_live_run_is_never_taken_over(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    job = Job(repository, "load_orders", DAY)
    with job.launch() as run:
        for attempt in range(2):
            with pytest.raises(ExecutionAlreadyActive) as active:
                Job(repository, "load_orders", DAY).launch()
            assert active.value.execution_id == run.execution.id, attempt
        assert decisions(admin) == []
        [execution] = executions(repository, run)
        assert (execution.status, execution.version) == (S.STARTED, run.execution.version)
        assert advisory_locks(admin) == 0  # the live run holds no session lock
    assert executions(repository, run)[0].status is S.COMPLETED
    assert decisions(admin) == []


def test_recover_orphans_false_never_recovers(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    orphan_run = job.launch()
    orphan_run._stop_renewing()
    wait_for_lease_expiry(admin, orphan_run.execution.id)  # the dead run's lease ran out
    cautious = Job(repository, "load_orders", DAY, recover_orphans=False)
    with pytest.raises(ExecutionAlreadyActive):
        cautious.launch()
    assert decisions(admin) == []
    [orphan] = executions(repository, orphan_run)
    assert (orphan.status, orphan.version) == (S.STARTED, orphan_run.execution.version)
    assert advisory_locks(admin) == 0
    # The default launcher does recover it.
    with job.launch() as run:
        assert run.attempt == 2
    assert len(decisions(admin)) == 1


# --------------------------------------------------------------------------- a killed process


def _crash_mid_step(config_fields: dict[str, Any], queue: Any) -> None:
    """Child process: launch, commit one chunk, report, then hang until killed."""
    with JobRepository.connect(ConnectionConfig(**config_fields)) as repository:
        run = Job(repository, "load_orders", DAY, lease=SHORT_LEASE).launch()

        def work(step: StepRun) -> None:
            with step.chunk() as chunk:
                chunk.execute("INSERT INTO public.orders VALUES (1, 'child')")
                chunk.commit(read=1, written=1, checkpoint={"offset": 1})
            queue.put((run.execution.id, step.execution.id))
            time.sleep(120)

        run.step("load", work)


def test_killed_process_is_recovered_on_the_next_launch(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any], orders: None
) -> None:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_crash_mid_step, args=(portable(pg_config), queue), daemon=True)
    child.start()
    try:
        execution_id, step_id = queue.get(timeout=30)
    finally:
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    wait_for_lease_expiry(admin, execution_id)  # at most one lease after the kill

    # Both processes use the system clock here, so recovery never runs behind the orphan.
    seen: list[dict[str, int]] = []
    with JobRepository.connect(pg_config) as repository:
        with Job(repository, "load_orders", DAY).launch() as run:
            assert run.attempt == 2
            run.step("load", loader(4, 2, seen=seen))
        [decision] = decisions(admin)
        assert (decision["job_execution_id"], decision["reason_code"]) == (
            execution_id,
            "OWNER_LOST",
        )
        assert (decision["prior_status"], decision["resulting_status"]) == ("STARTED", "FAILED")
        with repository.begin() as uow:
            orphan = uow.executions.get(execution_id)
            orphan_step = uow.steps.get(step_id)
        assert orphan is not None and orphan.status is S.FAILED
        assert orphan_step is not None and orphan_step.status is S.FAILED
    assert seen == [{"offset": 1, "read": 1, "written": 1, "commits": 1}]
    assert business_ids(admin) == [1, 2, 3, 4]
