"""A small race runner: racers released together by a barrier, outcomes collected.

Threads: `race(n, work)` starts `n` threads that wait on one `threading.Barrier` and then
call `work(index)`; `race_units_of_work(repository, n, work)` has each racer open its own
unit of work, run `work(uow, index)` and commit. Every racer's return value or exception
is collected; nothing is swallowed silently, and a racer that hangs fails the test.

Processes: `race_processes(n, target, args)` starts `n` spawned processes that share a
barrier from the spawn context and report `target(*args)`'s return value (or the
exception's type name) through a queue. `target` must be a picklable module-level
function; `launch_in_process` (a unit of work) and `run_job_in_process` (the ETL API) are
the ones used by tests/races.

`Contender` runs one unit of work on its own thread; `start_blocked(admin)` returns once
it waits on a row lock (pg_stat_activity), which is the "let the first take its lock, start
the second" step of a race test. `terminate_backend(admin, pid)` ends a backend
and waits until it is gone (PostgreSQL 13 has no pg_terminate_backend timeout).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

import attrs
import psycopg

from pybatch import ConnectionConfig, JobRepository, UnitOfWork
from pybatch.etl import Job
from pybatch.values.names import JobName
from pybatch.values.parameters import JobInstanceKey, JobParameters

__all__ = [
    "portable",
    "Contender",
    "Outcome",
    "launch_in_process",
    "run_job_in_process",
    "race",
    "race_processes",
    "race_units_of_work",
    "terminate_backend",
    "wait_until_lock_wait",
]

T = TypeVar("T")

#: How long a racer or a helper may take before the test fails instead of hanging.
DEADLINE_SECONDS = 30.0


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What one racer did: its return value, or the exception it raised."""

    index: int
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the racer returned normally."""
        return self.error is None


def race(
    n: int, work: Callable[[int], T], *, timeout: float = DEADLINE_SECONDS
) -> list[Outcome[T]]:
    """Run `work(index)` on `n` threads released together; return outcomes by index."""
    barrier = threading.Barrier(n)
    outcomes: list[Outcome[T] | None] = [None] * n

    def runner(index: int) -> None:
        try:
            barrier.wait(timeout)
            value = work(index)
        except BaseException as error:
            outcomes[index] = Outcome(index, error=error)
        else:
            outcomes[index] = Outcome(index, value=value)

    threads = [
        threading.Thread(target=runner, args=(index,), name=f"racer-{index}", daemon=True)
        for index in range(n)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    if hung:
        raise AssertionError(f"racers did not finish within {timeout}s: {hung}")
    return [outcome for outcome in outcomes if outcome is not None]


def race_units_of_work(
    repository: JobRepository,
    n: int,
    work: Callable[[UnitOfWork, int], T],
    *,
    timeout: float = DEADLINE_SECONDS,
) -> list[Outcome[T]]:
    """Each racer opens its own unit of work, runs `work(uow, index)` and commits."""

    def one(index: int) -> T:
        with repository.begin() as uow:
            value = work(uow, index)
            uow.commit()
            return value

    return race(n, one, timeout=timeout)


def wait_until_lock_wait(
    admin: psycopg.Connection[Any], pid: int, *, timeout: float = DEADLINE_SECONDS
) -> None:
    """Block until backend `pid` waits on a heavyweight lock (pg_stat_activity)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.005)
    raise AssertionError(f"backend {pid} never waited on a lock")


def terminate_backend(
    admin: psycopg.Connection[Any], pid: int, *, timeout: float = DEADLINE_SECONDS
) -> None:
    """pg_terminate_backend(pid), then wait until the backend has really exited."""
    row = admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row == (True,), f"backend {pid} could not be terminated"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            is None
        ):
            return
        time.sleep(0.005)
    raise AssertionError(f"backend {pid} is still alive")


class Contender(Generic[T]):
    """A unit of work on its own thread: `work(uow)` then commit, started behind a lock."""

    def __init__(self, repository: JobRepository, work: Callable[[UnitOfWork], T]) -> None:
        self._repository = repository
        self._work = work
        self._ready = threading.Event()
        self._outcome: Outcome[T] | None = None
        self.pid: int | None = None
        self._thread = threading.Thread(target=self._run, name="contender", daemon=True)

    def _run(self) -> None:
        try:
            with self._repository.begin() as uow:
                self.pid = uow.connection.info.backend_pid
                self._ready.set()
                value = self._work(uow)
                uow.commit()
        except BaseException as error:
            self._outcome = Outcome(0, error=error)
        else:
            self._outcome = Outcome(0, value=value)
        finally:
            self._ready.set()

    def start_blocked(self, admin: psycopg.Connection[Any]) -> Contender[T]:
        """Start the thread and return once its backend waits on a lock."""
        self._thread.start()
        assert self._ready.wait(DEADLINE_SECONDS), "contender never opened its unit of work"
        assert self.pid is not None, f"contender failed early: {self._outcome}"
        wait_until_lock_wait(admin, self.pid)
        assert self._outcome is None, "contender finished instead of waiting"
        return self

    def outcome(self, timeout: float = DEADLINE_SECONDS) -> Outcome[T]:
        """Wait for the contender to finish and return what it did."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "contender did not finish"
        assert self._outcome is not None
        return self._outcome


# --------------------------------------------------------------------------- processes


def portable(config: ConnectionConfig) -> dict[str, Any]:
    """The configuration as keyword arguments a spawned process can receive.

    A ConnectionConfig refuses to pickle (its DSN is a Secret), so handing one to a child
    process is explicit: the child rebuilds it with `ConnectionConfig(**fields)`.
    """
    fields = attrs.asdict(config, recurse=False)
    fields["dsn"] = config.dsn.reveal()
    return fields


def launch_in_process(
    config_fields: dict[str, Any], barrier: Any, job_name: str, day: str
) -> tuple[str, int | str]:
    """Child process body: own repository, wait on the barrier, launch one key.

    Returns ("launched", execution id) or ("error", exception type name); errors are
    reported by name so nothing unpicklable crosses the process boundary.
    """
    key = JobInstanceKey(JobName(job_name), JobParameters.of({"day": day}))
    with JobRepository.connect(ConnectionConfig(**config_fields)) as repository:
        barrier.wait(DEADLINE_SECONDS)
        try:
            with repository.begin() as uow:
                instance = uow.instances.select_or_create(key).instance
                execution = uow.executions.create(instance.id)
                uow.commit()
        except Exception as error:
            return ("error", type(error).__name__)
        return ("launched", execution.id)


def run_job_in_process(
    config_fields: dict[str, Any], barrier: Any, job_name: str, day: str, lease_seconds: float
) -> tuple[str, int | str]:
    """Child process body: own repository, wait on the barrier, `Job(...).launch()` one key.

    The winner keeps its run open for three leases (its lease renewed meanwhile), then ends it
    COMPLETED. Returns ("launched", execution id) or ("error", exception type name).
    """
    lease = timedelta(seconds=lease_seconds)
    with JobRepository.connect(ConnectionConfig(**config_fields)) as repository:
        job = Job(repository, job_name, {"day": day}, lease=lease)
        barrier.wait(DEADLINE_SECONDS)
        try:
            run = job.launch()
        except Exception as error:
            return ("error", type(error).__name__)
        with run:
            time.sleep(3 * lease_seconds)
        return ("launched", run.execution.id)


def _process_main(
    queue: Any, index: int, target: Callable[..., object], args: Sequence[object]
) -> None:
    try:
        queue.put((index, "ok", target(*args)))
    except BaseException as error:
        queue.put((index, "crashed", f"{type(error).__name__}"))


def race_processes(
    n: int,
    target: Callable[..., object],
    args: Sequence[object],
    *,
    timeout: float = 60.0,
) -> list[object]:
    """Run `target(*args, barrier)`-style work in `n` spawned processes; return results.

    `args` is passed with the shared barrier inserted after the first argument, matching
    `launch_in_process(config, barrier, ...)`. A process that crashes or hangs fails.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(n)
    queue = context.Queue()
    call_args = [args[0], barrier, *args[1:]]
    processes = [
        context.Process(target=_process_main, args=(queue, index, target, call_args), daemon=True)
        for index in range(n)
    ]
    for process in processes:
        process.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"only {len(results)} of {n} processes reported")
            index, status, value = queue.get(timeout=remaining)
            if status != "ok":
                raise AssertionError(f"process {index} crashed: {value}")
            results[index] = value
    finally:
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
    return [results[index] for index in range(n)]
