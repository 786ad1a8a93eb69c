"""Chaos-test processes: three jobs that load deterministic sources, and a partition joiner.

Run from the repository root as ``python -m tests.chaos.worker ROLE`` (PYTHONPATH = the
repository root). The parent (tests/chaos/test_chaos.py) SIGKILLs, SIGSTOPs and SIGCONTs
these processes, terminates their backends and restarts the server, and starts a process
again whenever its job has no live one left.

Roles:
    partitions  job `chaos_partitions`: one partitioned step, LOCAL_WORKERS forked workers
    join        joins the running attempt of `chaos_partitions` (join_partitioned_step) again
                and again until the parent kills it
    copy        job `chaos_copy`: one checkpointed step that loads with COPY
    many        job `chaos_many`: one checkpointed step that loads with executemany

Environment:
    PYBATCH_DSN, PYBATCH_TLS  the job repository (ConnectionConfig.from_env)
    CHAOS_RUN                 the run id: every job's identifying parameter
    CHAOS_SLOW_FILE           while this file exists, each chunk sleeps SLOW_CHUNK_S after its
                              rows are written (the faults land mid-chunk, mid-step); the
                              parent removes it when the fault phase is over

Each process is started ahead of need and waits, imported, for a `go` line on stdin (so the
parent's relaunch starts at once); it exits without doing anything on end of input.

Exit codes: 0 the job completed (by this process or earlier), 1 any other error (the
parent starts another process), 3 the job stayed active under another owner for too long.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import CompletedInstance, ExecutionAlreadyActive, PyBatchError
from pybatch.etl import Chunk, Job, PartitionRun, StepRun, join_partitioned_step

#: Short leases: a dead or paused owner is recovered about two seconds after its last renewal.
LEASE = timedelta(seconds=2)
STEP_NAME = "load"
CHUNK = 25
SLOW_CHUNK_S = 0.25
#: Forked workers of the partitioned step's launcher (two more processes join it).
LOCAL_WORKERS = 2
PARTITIONS = 12
ROWS_PER_PARTITION = 1_000
LOADER_ROWS = 3_000
#: How long a launch keeps retrying while another process still owns the run.
ACTIVE_RETRY_S = 30.0


class Spec:
    """One job: its name, its table and how many source rows it loads."""

    def __init__(self, job: str, table: str, rows: int) -> None:
        self.job = job
        self.table = table
        self.rows = rows

    @property
    def create_table(self) -> str:
        # No unique key on purpose: a chunk applied twice shows as rows != distinct ids.
        return f"CREATE TABLE {self.table} (id BIGINT NOT NULL, label TEXT NOT NULL)"

    @property
    def select_rows(self) -> str:
        return f"SELECT id, label FROM {self.table} ORDER BY id, label"

    @property
    def counts(self) -> str:
        return f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {self.table}"

    def source(self) -> Iterable[tuple[int, str]]:
        return (source_row(row_id) for row_id in range(1, self.rows + 1))


PARTITIONED = Spec("chaos_partitions", "chaos_partition_rows", PARTITIONS * ROWS_PER_PARTITION)
COPY = Spec("chaos_copy", "chaos_copy_rows", LOADER_ROWS)
MANY = Spec("chaos_many", "chaos_many_rows", LOADER_ROWS)
SPECS = (PARTITIONED, COPY, MANY)


def source_row(row_id: int) -> tuple[int, str]:
    return row_id, hashlib.sha256(str(row_id).encode()).hexdigest()[:16]


def rows_sha256(rows: Iterable[tuple[Any, ...]]) -> str:
    """sha256 over one `id|label` line per row, in the order given."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(("|".join(str(value) for value in row) + "\n").encode())
    return digest.hexdigest()


def say(*words: object) -> None:
    """One flushed line on stdout, stamped like the log lines (the log is shared)."""
    print(f"{datetime.now():%Y-%m-%d %H:%M:%S,%f}"[:-3], os.getpid(), *words, flush=True)


def parameters() -> dict[str, str]:
    return {"run": os.environ["CHAOS_RUN"]}


def slow() -> None:
    flag = os.environ.get("CHAOS_SLOW_FILE", "")
    if flag and os.path.exists(flag):
        time.sleep(SLOW_CHUNK_S)


def load_rows(
    step: StepRun, first: int, count: int, write: Callable[[Chunk, list[tuple[int, str]]], None]
) -> None:
    """Load source rows first..first+count-1 in chunks, from the step's checkpoint on."""
    offset = int(step.checkpoint.get("offset", 0))
    while offset < count:
        end = min(offset + CHUNK, count)
        rows = [source_row(first + i) for i in range(offset, end)]
        with step.chunk() as chunk:
            write(chunk, rows)
            slow()
            chunk.commit(read=len(rows), written=len(rows), checkpoint={"offset": end})
        offset = end


def copy_rows(table: str) -> Callable[[Chunk, list[tuple[int, str]]], None]:
    def write(chunk: Chunk, rows: list[tuple[int, str]]) -> None:
        chunk.copy(f"COPY {table} (id, label) FROM STDIN", rows)

    return write


def insert_rows(table: str) -> Callable[[Chunk, list[tuple[int, str]]], None]:
    def write(chunk: Chunk, rows: list[tuple[int, str]]) -> None:
        chunk.executemany(f"INSERT INTO {table} (id, label) VALUES (%s, %s)", rows)

    return write


def load_partition(partition: PartitionRun) -> None:
    first = int(partition.partition_context["first"])
    load_rows(partition, first, ROWS_PER_PARTITION, copy_rows(PARTITIONED.table))


def plan() -> dict[str, dict[str, int]]:
    return {f"part-{i:03d}": {"first": i * ROWS_PER_PARTITION + 1} for i in range(PARTITIONS)}


def run_job(spec: Spec) -> int:
    """Launch (or restart) the job and run it to the end; retry while another owner is live."""
    deadline = time.monotonic() + ACTIVE_RETRY_S
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        job = Job(repository, spec.job, parameters(), lease=LEASE)
        waiting = False
        while True:
            try:
                run = job.launch()
            except CompletedInstance:
                say("complete")
                return 0
            except ExecutionAlreadyActive:
                # A paused or just-killed owner: its lease has not run out yet.
                if not waiting:
                    say("waiting for the live owner's lease")
                    waiting = True
                if time.monotonic() > deadline:
                    return 3
                time.sleep(0.2)
                continue
            break
        with run:
            say("launched", run.attempt, os.getpid())
            if spec is PARTITIONED:
                run.partitioned_step(STEP_NAME, plan(), load_partition, workers=LOCAL_WORKERS)
            else:
                write = copy_rows(spec.table) if spec is COPY else insert_rows(spec.table)
                run.step(STEP_NAME, lambda step: load_rows(step, 1, spec.rows, write))
    say("done")
    return 0


def join() -> int:
    """Work on whatever attempt of the partitioned job is running, until killed."""
    while True:
        try:
            with JobRepository.connect(ConnectionConfig.from_env()) as repository:
                while True:
                    ran = join_partitioned_step(
                        repository,
                        PARTITIONED.job,
                        parameters(),
                        STEP_NAME,
                        load_partition,
                        wait_seconds=2.0,
                        lease=LEASE,
                    )
                    say("joined", ran)
                    time.sleep(0.2)
        except PyBatchError as error:  # no plan yet, a restarted server, a lost partition
            say("join failed", type(error).__name__)
            time.sleep(0.3)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(message)s")
    role = sys.argv[1]
    if sys.stdin.readline().strip() != "go":  # a spare the parent never needed
        return 0
    if role == "join":
        return join()
    spec = {"partitions": PARTITIONED, "copy": COPY, "many": MANY}[role]
    try:
        return run_job(spec)
    except PyBatchError as error:
        traceback.print_exc()
        say("failed", type(error).__name__)
        return 1


if __name__ == "__main__":
    sys.exit(main())
