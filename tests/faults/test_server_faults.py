"""Faults injected into a real server while pybatch works: every one ends in a typed error,
and the rerun resumes exactly (no row lost or duplicated, counters equal to rows).

The module has its own PostgreSQL (it is restarted with `pg_ctl restart -m immediate`),
started from the env's PG_BINDIR like the session's, so it runs on every matrix env.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql import factories

from pybatch import JobRepository, etl
from pybatch import _partitioned as partitioned
from pybatch.errors import (
    ChunkCommitOutcomeUnknown,
    Infrastructure,
    NotCommitted,
    PyBatchError,
    StepsUnfinished,
    Unavailable,
)
from pybatch.etl import ETL_STATE_SCHEMA, Job, PartitionRun
from pybatch.values.flow import StartLimit
from pybatch.values.status import BatchStatus
from tests.conftest import dsn_for
from tests.crash.test_etl_crash import ROOT, Worker
from tests.faults import claim_worker
from tests.faults.harness import (
    FaultServer,
    Hook,
    digest,
    loader,
    run_once,
    source,
    step_counts,
)

pytestmark = pytest.mark.slow

fault_proc = factories.postgresql_proc(port=None, postgres_options="-c fsync=off")

TOTAL, SIZE = 120, 10
ROWS = source(TOTAL)


@pytest.fixture(scope="module")
def server(fault_proc: Any) -> FaultServer:
    return FaultServer(fault_proc, "pybatch_faults")


@pytest.fixture
def fresh(server: FaultServer) -> Iterator[FaultServer]:
    server.reset()
    yield server
    server.switch("slow_commit", on=False)


def no_fault(index: int, point: str, chunk: Any) -> None:
    return None


def assert_exact(server: FaultServer, job: str, rows: list[tuple[int, str]] = ROWS) -> None:
    count, table_sha = server.table_digest()
    assert (count, table_sha) == (len(rows), digest(rows))
    read, written, offset = step_counts(server, job)
    assert (read, written, offset) == (len(rows), len(rows), len(rows))


def finish(server: FaultServer, job: str) -> None:
    error = run_once(server.config(), job, ROWS, SIZE, no_fault)
    assert error is None, repr(error)
    assert_exact(server, job)


def test_restart_immediate_in_the_middle_of_a_chunk(fresh: FaultServer) -> None:
    def hook(index: int, point: str, chunk: Any) -> None:
        if (index, point) == (3, "written"):
            fresh.restart_immediate()

    error = run_once(fresh.config(), "restart_mid_chunk", ROWS, SIZE, hook)
    assert isinstance(error, NotCommitted | Infrastructure | Unavailable), repr(error)
    assert fresh.table_digest()[0] == 30  # chunks 0..2 only
    finish(fresh, "restart_mid_chunk")


def _two_steps(server: FaultServer, job: str, hook: Hook) -> BaseException | None:
    """A step with nothing to write ("first"), then the loader ("load"); the error it ends with."""
    return run_once(server.config(), job, ROWS, SIZE, hook, steps_before=("first",))


def _steps_of_first_attempt(server: FaultServer, job: str) -> dict[str, str]:
    with server.admin() as conn:
        rows = conn.execute(
            "SELECT s.step_name, s.status FROM pybatch.step_execution AS s"
            " JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id"
            " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
            " WHERE i.job_name = %s AND e.attempt = 1",
            (job,),
        ).fetchall()
    return dict(rows)


@contextmanager
def _wal_writer_stopped(server: FaultServer) -> Iterator[Callable[[], None]]:
    """Stop the WAL writer (SIGSTOP); yield `crash()`, which kills it (SIGKILL).

    While it is stopped, a commit that does not wait for its flush stays in the server's WAL
    buffers until a later commit that waits writes them. Killing it makes the postmaster end
    every session and recover from the WAL on disk, as after a crash: what only the buffers
    held is lost. Without a crash, the WAL writer goes on (SIGCONT).
    """
    with server.admin() as conn:
        pid = _wal_writer_pid(conn)
    assert pid is not None, "the server runs no WAL writer"
    os.kill(pid, signal.SIGSTOP)
    crashed = False

    def crash() -> None:
        nonlocal crashed
        crashed = True
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # the server answers again once crash recovery has started a new writer
            try:
                with server.admin() as conn:
                    if _wal_writer_pid(conn) not in (None, pid):
                        return
            except psycopg.OperationalError:
                pass
            assert time.monotonic() < deadline, "the server did not recover from the crash"
            time.sleep(0.05)

    try:
        yield crash
    finally:
        if not crashed:
            os.kill(pid, signal.SIGCONT)


def _wal_writer_pid(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_catalog.pg_stat_activity WHERE backend_type = 'walwriter'"
    ).fetchone()
    return None if row is None else int(row[0])


def test_a_crash_may_lose_step_starts_and_ends_that_no_waiting_commit_followed(
    fresh: FaultServer,
) -> None:
    with _wal_writer_stopped(fresh) as crash:

        def hook(index: int, point: str, chunk: Any) -> None:
            if (index, point) == (0, "written"):  # "load" started; nothing of it committed
                crash()

        error = _two_steps(fresh, "start_lost", hook)
    assert isinstance(error, NotCommitted | Infrastructure | Unavailable), repr(error)
    # The start and end of "first" and the start of "load" did not wait for their flush, and
    # no commit after them carried them to disk; the launch did wait.
    assert _steps_of_first_attempt(fresh, "start_lost") == {}
    assert _attempts(fresh, "start_lost") == 1
    assert fresh.table_digest()[0] == 0

    assert _two_steps(fresh, "start_lost", no_fault) is None
    assert_exact(fresh, "start_lost")


def test_step_starts_and_ends_are_durable_once_a_later_chunk_commits(fresh: FaultServer) -> None:
    with _wal_writer_stopped(fresh) as crash:

        def hook(index: int, point: str, chunk: Any) -> None:
            if (index, point) == (1, "written"):  # chunk 0's commit waited, and wrote the rest
                crash()

        error = _two_steps(fresh, "start_kept", hook)
    assert isinstance(error, NotCommitted | Infrastructure | Unavailable), repr(error)
    steps = _steps_of_first_attempt(fresh, "start_kept")
    assert steps["first"] == "COMPLETED" and "load" in steps
    assert fresh.table_digest() == (SIZE, digest(ROWS[:SIZE]))

    assert _two_steps(fresh, "start_kept", no_fault) is None
    assert_exact(fresh, "start_kept")


def test_a_run_whose_last_step_end_was_lost_ends_failed_and_its_restart_resumes_exactly(
    fresh: FaultServer,
) -> None:
    with _wal_writer_stopped(fresh) as crash, pytest.raises(StepsUnfinished) as unfinished:
        with (
            JobRepository.connect(fresh.config()) as repository,
            Job(repository, "end_lost", {"run": "faults"}).launch() as run,
        ):
            run.step("load", loader(ROWS, SIZE, no_fault))
            # Every chunk waited for its flush; the step's end did not, and the crash loses it.
            crash()
    assert unfinished.value.status == "STARTED"
    # The run could not complete with a step that has no end: it ended FAILED, the step with it.
    assert _steps_of_first_attempt(fresh, "end_lost") == {"load": "FAILED"}
    assert _execution_statuses(fresh, "end_lost") == ["FAILED"]
    assert fresh.table_digest() == (len(ROWS), digest(ROWS))

    resumed: list[object] = []
    with (
        JobRepository.connect(fresh.config()) as repository,
        Job(repository, "end_lost", {"run": "faults"}).launch() as again,
    ):
        again.step("load", lambda step: resumed.append(step.checkpoint))
    assert resumed == [{"offset": len(ROWS)}]  # nothing loaded twice
    assert _execution_statuses(fresh, "end_lost") == ["FAILED", "COMPLETED"]
    assert fresh.table_digest() == (len(ROWS), digest(ROWS))


#: Four partitions of ROWS, each loaded in chunks of SIZE rows from its checkpoint on.
PARTITIONS = {f"p{n + 1}": {"lo": n * TOTAL // 4, "hi": (n + 1) * TOTAL // 4} for n in range(4)}


def test_a_crash_may_lose_a_partitions_end_and_the_next_claim_and_every_row_loads_once(
    fresh: FaultServer,
) -> None:
    def load(partition: PartitionRun) -> None:
        offset, end = (int(partition.partition_context[k]) for k in ("lo", "hi"))
        offset = int(partition.checkpoint.get("offset", offset))
        if partition.key == "p3" and not crashed:
            # p2's chunks waited, and carried p1's end; p2's end and this claim did not wait.
            crashed.append(offset)
            crash()
        while offset < end:
            batch = ROWS[offset : min(offset + SIZE, end)]
            with partition.chunk() as chunk:  # p3's first: refused, its claim is gone
                chunk.executemany("INSERT INTO public.orders (id, note) VALUES (%s, %s)", batch)
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})

    crashed: list[int] = []
    with _wal_writer_stopped(fresh) as crash:
        with (
            JobRepository.connect(fresh.config()) as repository,
            Job(repository, "partitions_lost", {}, lease=timedelta(seconds=1)).launch() as run,
        ):
            run.partitioned_step("load", PARTITIONS, load, workers=0)

    assert crashed == [PARTITIONS["p3"]["lo"]]
    assert run.execution.status.value == "COMPLETED"
    assert fresh.table_digest() == (len(ROWS), digest(ROWS))
    with fresh.admin() as conn:
        workers = conn.execute(
            "SELECT split_part(s.step_name, '#', 2), s.status, s.failure_category"
            " FROM pybatch.step_execution AS s WHERE s.step_name LIKE 'load#%' ORDER BY s.id"
        ).fetchall()
    # p2's end was lost: its claim outlived the crash with no owner, was recovered when its
    # lease ran out, and its next worker resumed after its last chunk. p3's claim was lost
    # with its worker step: its first chunk was refused, and p3 was claimed again.
    assert workers == [
        ("1.1", "COMPLETED", None),
        ("2.1", "FAILED", "STALE_RECOVERED"),
        ("3.1", "COMPLETED", None),
        ("4.1", "COMPLETED", None),
        ("2.3", "COMPLETED", None),
    ], workers


def test_a_worker_whose_claim_a_crash_lost_commits_nothing_of_that_partition(
    fresh: FaultServer, tmp_path: Path
) -> None:
    pause = tmp_path / "pause"
    pause.touch()
    fields = {k: v for k, v in fresh.fields.items() if v is not None}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CLAIM_"))}
    # The run's lease is long: its renewals, commits that wait, must not carry the lost claim.
    with (
        JobRepository.connect(fresh.config()) as repository,
        Job(repository, "claim_lost", {}, lease=timedelta(seconds=60)).launch() as run,
    ):
        entries = partitioned.plan_entries(claim_worker.PLAN, ETL_STATE_SCHEMA)
        _, parent = partitioned.start_partitioned_step(
            repository, run.instance.id, run.execution.id, "load", entries, StartLimit(10)
        )
        env |= {
            "PYBATCH_DSN": dsn_for(**fields),
            "PYBATCH_TLS": "plaintext",
            "CLAIM_PARENT_ID": str(parent.id),
            "CLAIM_PAUSE_KEY": "b",
            "CLAIM_PAUSE_FILE": str(pause),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        with _wal_writer_stopped(fresh) as crash:
            worker = Worker(env, tmp_path / "worker.log", "tests.faults.claim_worker")
            try:
                # The worker claimed a, loaded it (each chunk waited), then ended a and claimed
                # b in one commit that did not wait; the crash loses that commit.
                assert worker.next_line()[1] == ["paused", "b"], _tail(worker)
                crash()
            except BaseException:
                worker.kill()
                raise
        assert _partition_statuses(fresh, parent.id) == {"a": "STARTED", "b": "STARTING"}

        # This process claims b and loads it, then recovers a once the worker's lease on it ran
        # out, and resumes a after its last chunk; the worker still believes it holds b.
        runner = etl._runners(run.instance, run.execution, claim_worker.load)(repository)
        partitioned.work_on_plan(
            repository, parent, runner, poll_seconds=0.05, lease=claim_worker.LEASE
        )
        pause.unlink()
        said = []
        while (words := worker.next_line()[1]) is not None:
            said.append(words)
        assert worker.wait() == 0, _tail(worker)
        assert said[0][0] == "refused" and said[-1][0] == "done", said
        ended, unfinished = partitioned.aggregate_plan(repository, parent)
        assert ended.status is BatchStatus.COMPLETED and not unfinished

    assert run.execution.status is BatchStatus.COMPLETED
    everything = claim_worker.source("a") + claim_worker.source("b")
    assert fresh.table_digest() == (len(everything), digest(everything))


def _tail(worker: Worker) -> str:
    return Path(worker._log.name).read_text()[-3000:]


def _partition_statuses(server: FaultServer, parent_id: int) -> dict[str, str]:
    with server.admin() as conn:
        rows = conn.execute(
            "SELECT partition_key, status FROM pybatch.step_partition WHERE step_execution_id = %s",
            (parent_id,),
        ).fetchall()
    return dict(rows)


def _attempts(server: FaultServer, job: str) -> int:
    return len(_execution_statuses(server, job))


def _execution_statuses(server: FaultServer, job: str) -> list[str]:
    with server.admin() as conn:
        rows = conn.execute(
            "SELECT e.status FROM pybatch.job_execution AS e"
            " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
            " WHERE i.job_name = %s ORDER BY e.attempt",
            (job,),
        ).fetchall()
    return [status for (status,) in rows]


def _in_flight_commit(server: FaultServer, fault: str) -> Any:
    def hook(index: int, point: str, chunk: Any) -> None:
        if (index, point) != (5, "written"):
            return
        server.switch("slow_commit", on=True)

        def strike() -> None:
            pid = server.sleeping_commit_pid()
            if fault == "restart":
                server.restart_immediate()
            else:
                server.terminate(pid)

        threading.Thread(target=strike, daemon=True).start()

    return hook


@pytest.mark.parametrize("fault", ["restart", "terminate"])
def test_a_fault_while_commit_is_in_flight_is_outcome_unknown_and_settled_by_the_rerun(
    fresh: FaultServer, fault: str
) -> None:
    job = f"commit_{fault}"
    error = run_once(fresh.config(), job, ROWS, SIZE, _in_flight_commit(fresh, fault))
    assert isinstance(error, ChunkCommitOutcomeUnknown), repr(error)
    fresh.switch("slow_commit", on=False)
    finish(fresh, job)


@pytest.mark.parametrize("target", ["disk_full", "disk_full_progress"])
def test_injected_disk_full_is_typed_and_writes_nothing(fresh: FaultServer, target: str) -> None:
    job = f"injected_{target}"

    def hook(index: int, point: str, chunk: Any) -> None:
        if (index, point) == (2, "committed"):
            fresh.switch(target, on=True)

    error = run_once(fresh.config(), job, ROWS, SIZE, hook)
    expected = Infrastructure if target == "disk_full" else NotCommitted | Unavailable
    assert isinstance(error, expected), repr(error)
    assert fresh.table_digest() == (30, digest(ROWS[:30]))
    fresh.switch(target, on=False)
    finish(fresh, job)


def test_a_read_only_standby_refuses_the_launch_and_writes_nothing(fresh: FaultServer) -> None:
    # pybatch's writes get a standby's 25006 (read_only_sql_transaction), injected: pybatch
    # begins READ WRITE explicitly, which a database default cannot override.
    fresh.switch("read_only", on=True)
    try:
        error = run_once(fresh.config(), "read_only", ROWS, SIZE, no_fault)
    finally:
        fresh.switch("read_only", on=False)
    assert isinstance(error, Unavailable) and error.sqlstate == "25006", repr(error)
    with fresh.admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pybatch.job_instance WHERE job_name = 'read_only'"
        ).fetchone()
    assert row == (0,)
    assert fresh.table_digest()[0] == 0
    finish(fresh, "read_only")


def test_lock_timeout_in_pybatchs_own_statement_is_not_committed(fresh: FaultServer) -> None:
    config = fresh.config(lock_timeout=timedelta(milliseconds=200))
    holder = fresh.admin()
    holder.autocommit = False

    def hook(index: int, point: str, chunk: Any) -> None:
        if (index, point) == (4, "written"):  # someone holds the step row
            holder.execute("SELECT 1 FROM pybatch.step_execution FOR UPDATE")

    try:
        error = run_once(config, "own_lock_timeout", ROWS, SIZE, hook)
        # The chunk is NotCommitted; recording the step's failure times out on the same lock,
        # which the run reports as Unavailable with the lock timeout's SQLSTATE.
        assert isinstance(error, NotCommitted) or (
            isinstance(error, Unavailable) and error.sqlstate == "55P03"
        ), repr(error)
        assert fresh.table_digest()[0] == 40
    finally:
        holder.rollback()
        holder.close()
    finish(fresh, "own_lock_timeout")


def test_statement_timeout_in_pybatchs_own_statement_is_not_committed(fresh: FaultServer) -> None:
    config = fresh.config(
        statement_timeout=timedelta(milliseconds=300), lock_timeout=timedelta(milliseconds=300)
    )

    def hook(index: int, point: str, chunk: Any) -> None:
        if (index, point) == (4, "written"):
            fresh.switch("slow_progress", on=True)

    try:
        error = run_once(config, "own_statement_timeout", ROWS, SIZE, hook)
    finally:
        fresh.switch("slow_progress", on=False)
    assert isinstance(error, NotCommitted | Unavailable), repr(error)
    assert fresh.table_digest()[0] == 40
    finish(fresh, "own_statement_timeout")


# --------------------------------------------------------------------------- chaos

CHAOS_SEED = 20261130
CHAOS_FAULTS = 54
FAULT_KINDS = [
    "terminate_mid_chunk",
    "terminate_in_commit",
    "disk_full",
    "disk_full_progress",
    "restart_mid_chunk",
]


def test_chaos_many_faults_and_the_table_still_equals_the_source(fresh: FaultServer) -> None:
    """The loader runs again and again while one random fault hits each attempt."""
    rng = random.Random(CHAOS_SEED)
    total, size = 600, 5
    rows = source(total)
    job = "chaos"
    fired: list[str] = []
    kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(CHAOS_FAULTS)]
    # immediate restarts cost a second or two each: keep six of them
    kinds = [k for k in kinds if k != "restart_mid_chunk"][: CHAOS_FAULTS - 6] + [
        "restart_mid_chunk"
    ] * 6
    rng.shuffle(kinds)
    for attempt, kind in enumerate(kinds):
        fire_after = rng.randrange(0, 3)  # chunks this attempt commits before the fault
        state = {"done": 0}

        def hook(
            index: int,
            point: str,
            chunk: Any,
            kind: str = kind,
            state: dict[str, int] = state,
            fire_after: int = fire_after,
        ) -> None:
            if point == "committed":
                state["done"] += 1
                if state["done"] == fire_after + 1 and kind in ("disk_full", "disk_full_progress"):
                    fresh.switch(kind, on=True)
                return
            if state["done"] != fire_after:
                return
            if kind == "terminate_mid_chunk":
                fresh.terminate(chunk.connection.info.backend_pid)
            elif kind == "restart_mid_chunk":
                fresh.restart_immediate()
            elif kind == "terminate_in_commit":
                fresh.switch("slow_commit", on=True)
                threading.Thread(
                    target=lambda: fresh.terminate(fresh.sleeping_commit_pid()), daemon=True
                ).start()

        error = run_once(fresh.config(), job, rows, size, hook)
        for switch in ("slow_commit", "disk_full", "disk_full_progress"):
            fresh.switch(switch, on=False)
        if error is None:
            break  # the load finished before this fault could land
        assert isinstance(error, PyBatchError), f"attempt {attempt} ({kind}): {error!r}"
        fired.append(kind)
        count, _ = fresh.table_digest()
        read, written, offset = step_counts(fresh, job)
        assert count == offset == read == written, (attempt, kind, count, offset, read)
    assert len(fired) >= 50, f"only {len(fired)} faults landed (seed {CHAOS_SEED})"
    error = run_once(fresh.config(), job, rows, size, no_fault)
    assert error is None, repr(error)
    assert_exact(fresh, job, rows)
