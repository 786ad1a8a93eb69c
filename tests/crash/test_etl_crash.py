"""Crash proof of the ETL API: a chunked load in a child process survives 26 SIGKILLs.

A child process (tests/crash/worker.py) loads a deterministic 4,000-row source into a
table in chunks of 25 through `pybatch.etl` (executemany for even chunks, COPY for odd
ones) and is SIGKILLed at 26 instants: after the chunk's rows are written but before
COMMIT, racing the progress UPDATE and the COMMIT (microsecond jitter), with the COMMIT in
flight (sent, acknowledgement never read), after COMMIT, and at random wall-clock instants
(during start-up, launch and recovery, or anywhere in the load). After each kill, the
durable state must be exactly what was committed: the checkpoint never goes backwards,
the table holds precisely the source rows before the checkpoint (count and sha256), and
the step's read/write/commit counters match it. Then the job restarts (recording an
audited OWNER_LOST recovery of the dead attempt) and resumes; the last run completes with
the table equal to the source and the counters equal to the rows.

The kill plan comes from a fixed seed (PYBATCH_CRASH_SEED overrides it); every failure
message names the seed and the kill, so a failure can be replayed.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch.etl import Job
from pybatch.values.names import NodeId
from pybatch.values.status import BatchStatus
from tests.crash import worker as w

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("PYBATCH_CRASH_SEED", "20261130"))
#: How many kills of each kind; 26 in all.
PLAN = {
    "after_write": 5,
    "commit_race": 5,
    "in_commit": 5,
    "after_commit": 4,
    "random": 4,
    "wallclock": 3,
}
PAUSED = {"after_write", "commit_race", "in_commit", "after_commit"}
LINE_TIMEOUT_S = 60.0


class Worker:
    """One worker process; its stdout lines arrive through a queue so reads can time out."""

    def __init__(self, env: dict[str, str], log: Path, module: str = "tests.crash.worker") -> None:
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.started = time.perf_counter()
        self.lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put((time.perf_counter(), line.strip()))
        self.lines.put((time.perf_counter(), None))

    def next_line(self, timeout: float = LINE_TIMEOUT_S) -> tuple[float, list[str] | None]:
        at, line = self.lines.get(timeout=timeout)
        return at, None if line is None else line.split()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    def wait(self) -> int:
        code = self.process.wait(timeout=LINE_TIMEOUT_S)
        self._log.close()
        return code


@attrs.frozen
class Durable:
    """What the database holds for the job after a worker died."""

    offset: int
    read: int
    written: int
    committed: int
    table_count: int
    table_sha256: str


def busy_wait(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def wait_for_worker_sessions_to_end(admin: psycopg.Connection[Any]) -> None:
    """The killed worker's sessions may still be finishing (an in-flight COMMIT): wait."""
    deadline = time.monotonic() + 30
    while True:
        row = admin.execute(
            "SELECT COUNT(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'pybatch'"
        ).fetchone()
        assert row is not None
        if row[0] == 0:
            return
        assert time.monotonic() < deadline, f"worker sessions outlived it (seed {SEED})"
        time.sleep(0.005)


@contextmanager
def observer(config: ConnectionConfig) -> Iterator[JobRepository]:
    with JobRepository.connect(config) as repository:
        yield repository


def durable_state(
    config: ConnectionConfig,
    admin: psycopg.Connection[Any],
    run: str,
    *,
    settle: Callable[[psycopg.Connection[Any]], None] = wait_for_worker_sessions_to_end,
) -> Durable:
    settle(admin)
    with observer(config) as repository, repository.begin() as uow:
        instance = uow.instances.find(Job(repository, w.JOB_NAME, w.parameters(run)).key)
        latest = (
            uow.flow.latest_step(instance.id, NodeId(w.STEP_NAME)) if instance is not None else None
        )
        step = latest.step_execution if latest is not None else None
    rows = admin.execute(w.SELECT_ROWS).fetchall()
    counts = step.metadata.counts if step is not None else None
    return Durable(
        offset=int(step.checkpoint.payload.get("offset", 0)) if step is not None else 0,
        read=counts.read if counts else 0,
        written=counts.written if counts else 0,
        committed=counts.committed if counts else 0,
        table_count=len(rows),
        table_sha256=w.rows_sha256(rows),
    )


def check_consistent(state: Durable, context: str) -> None:
    """The table holds exactly the source rows before the checkpoint; counters agree."""
    assert state.table_count == state.offset, f"{context}: table rows != checkpoint: {state}"
    assert state.table_sha256 == w.source_sha256(state.offset), f"{context}: rows differ: {state}"
    assert state.read == state.written == state.offset, f"{context}: counters: {state}"
    assert state.committed * w.CHUNK >= state.offset > (state.committed - 1) * w.CHUNK, (
        f"{context}: commit count: {state}"
    )


def test_sigkilled_chunked_load_resumes_exactly(
    db_dsn: str, pg_config: ConnectionConfig, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    run = f"crash-{SEED}"
    admin.execute(w.CREATE_TABLE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CRASH_"))}
    env.update(
        PYBATCH_DSN=db_dsn,
        PYBATCH_TLS="plaintext",
        CRASH_RUN=run,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    plan = [mode for mode, times in PLAN.items() for _ in range(times)]
    rng.shuffle(plan)
    start_up = 0.6  # seconds from spawn to the step's first chunk; measured as we go
    previous = Durable(0, 0, 0, 0, 0, w.source_sha256(0))
    workers: list[Worker] = []
    history: list[str] = []
    try:
        for number, mode in enumerate(plan, start=1):
            pause_chunk = rng.randint(1, 3)
            context = f"seed {SEED}, kill {number}/{len(plan)} ({mode}, chunk {pause_chunk})"
            pause = mode if mode in PAUSED else "none"
            worker = Worker(
                env | {"CRASH_PAUSE": pause, "CRASH_PAUSE_CHUNK": str(pause_chunk)},
                tmp_path / f"worker-{number}.log",
            )
            workers.append(worker)
            begin: int | None = None
            span: tuple[int, int] | None = None
            if mode == "wallclock":  # start-up, launch, recovery, step start or a first chunk
                deadline = worker.started + rng.uniform(0, start_up + 0.01)
                late = rng.uniform(0, 0.01)
                while (left := deadline - time.perf_counter()) > 0:
                    try:
                        at, words = worker.next_line(timeout=left)
                    except queue.Empty:
                        break
                    assert words is not None, f"{context}: the worker ended before the kill"
                    if words[0] == "begin":  # the kill lands at most `late` into the load
                        begin = int(words[1])
                        deadline = min(deadline, at + late)
            else:
                while True:
                    at, words = worker.next_line()
                    assert words is not None, f"{context}: the worker ended before the kill"
                    if words[0] == "begin":
                        begin = int(words[1])
                        start_up = at - worker.started
                        if mode == "random":
                            time.sleep(rng.uniform(0, 0.02))
                            break
                    elif words[0] == "ready":
                        assert words[1] == mode, f"{context}: paused at {words}"
                        span = (int(words[2]), int(words[3]))
                        if mode == "commit_race":
                            busy_wait(rng.uniform(0, 0.001))
                        break
            worker.kill()
            code = worker.wait()
            assert code == -signal.SIGKILL, f"{context}: the worker ended with {code} first"
            state = durable_state(pg_config, admin, run)
            history.append(f"{context}: began at {begin}, paused in {span}, durable {state}")
            check_consistent(state, context)
            assert state.offset >= previous.offset, f"{context}: checkpoint went back: {state}"
            if begin is not None:  # the attempt resumed from the last durable checkpoint
                assert begin == previous.offset, f"{context}: began at {begin}: {previous}"
            if span is not None:
                before, after = span
                if mode == "after_write":  # written, not committed: none of it is durable
                    assert state.offset == before, f"{context}: {state}, span {span}"
                elif mode in ("in_commit", "after_commit"):  # the server committed the chunk
                    assert state.offset == after, f"{context}: {state}, span {span}"
                else:  # the kill raced the commit (and maybe later chunks)
                    assert state.offset >= before, f"{context}: {state}, span {span}"
            previous = state
            assert state.offset < w.ROWS, f"{context}: the load finished before all kills"

        final = Worker(env | {"CRASH_PAUSE": "none"}, tmp_path / "worker-final.log")
        workers.append(final)
        said: list[list[str]] = []
        while (words := final.next_line()[1]) is not None:
            said.append(words)
        assert final.wait() == 0, f"seed {SEED}: the last run failed: {said}"
        assert said[-1] == ["done"] and ["begin", str(previous.offset)] in said, said
    except BaseException:
        print(f"crash test seed {SEED} (rerun with PYBATCH_CRASH_SEED={SEED})")
        print("\n".join(history))
        for worker in workers:
            print(f"--- {worker._log.name}\n{Path(worker._log.name).read_text()[-3000:]}")
        raise
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.kill()
                worker.process.wait()

    print("\n".join(history))
    state = durable_state(pg_config, admin, run)
    assert state.table_count == w.ROWS and state.table_sha256 == w.source_sha256(w.ROWS), state
    assert state.read == state.written == w.ROWS, state
    assert state.committed == w.ROWS // w.CHUNK, state
    with observer(pg_config) as repository, repository.begin() as uow:
        instance = uow.instances.find(Job(repository, w.JOB_NAME, w.parameters(run)).key)
        assert instance is not None
        executions = uow.executions.of_instance(instance.id)
    assert executions[-1].status is BatchStatus.COMPLETED
    assert all(e.status is BatchStatus.FAILED for e in executions[:-1])
    # every attempt but the last was found orphaned by its successor: one audited decision each
    decisions = admin.execute(
        "SELECT d.reason_code FROM pybatch.recovery_decision AS d"
        " JOIN pybatch.job_execution AS e ON e.id = d.job_execution_id"
        " WHERE e.job_instance_id = %s ORDER BY e.attempt",
        (instance.id,),
    ).fetchall()
    assert [code for (code,) in decisions] == ["OWNER_LOST"] * (len(executions) - 1)
    assert len(plan) >= 20 and len(executions) >= len(plan) - PLAN["wallclock"]
