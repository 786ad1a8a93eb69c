"""Crash-test worker: a fault-tolerant load (`StepRun.load`) that can stop mid-isolation.

Run from the repository root as ``python -m tests.crash.skip_worker`` with PYTHONPATH set;
the parent (tests/crash/test_fault_tolerant_crash.py) SIGKILLs it while a chunk is being
bisected and starts it again until the job is done.

Environment:
    PYBATCH_DSN, PYBATCH_TLS  the job repository (ConnectionConfig.from_env)
    CRASH_RUN                 the run id: the job's identifying parameter
    CRASH_PAUSE_CALL          the write call of this attempt, counted among the calls that
                              write part of a chunk (isolating its rejected rows), that waits
                              to be killed after writing (0: none)
    CRASH_WRITE               "copy" (rejected rows found from the line the server names) or
                              "executemany" (found by bisection)

Protocol on stdout, one flushed line each:
    launched <attempt>        the attempt is STARTED
    begin <position>          the step resumes from this committed position
    ready <position> <size>   an isolating write of <size> items from <position> on is in
                              its chunk's transaction, not committed; waits to be killed
    done                      the job completed
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

from pybatch import ConnectionConfig, JobRepository
from pybatch.etl import Chunk, Job, StepRun
from tests.crash.worker import launch

JOB_NAME = "crash_skip_load"
STEP_NAME = "load"
ROWS = 3_000
CHUNK = 200
TABLE = "crash_skip_target"
# No unique key on purpose: a row applied twice must show up as a count mismatch.
CREATE_TABLE = (
    f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, amount INTEGER NOT NULL"
    f" CONSTRAINT {TABLE}_amount_positive CHECK (amount > 0))"
)
COPY_ROWS = f"COPY {TABLE} (id, amount) FROM STDIN"
INSERT_ROW = f"INSERT INTO {TABLE} (id, amount) VALUES (%s, %s)"

Row = tuple[int, int]


def is_bad(position: int) -> bool:
    """About one row in 60 breaks the CHECK, at positions fixed by a hash."""
    return hashlib.sha256(str(position).encode()).digest()[0] < 4


def source_row(position: int) -> Row:
    return position + 1, -1 if is_bad(position) else position + 1


def bad_positions(below: int = ROWS) -> list[int]:
    return [position for position in range(below) if is_bad(position)]


def say(*words: object) -> None:
    print(*words, flush=True)


def main() -> int:
    pause = int(os.environ.get("CRASH_PAUSE_CALL", "0"))
    many = os.environ.get("CRASH_WRITE") == "executemany"
    calls = 0

    def read(position: int) -> Iterator[Row]:
        say("begin", position)
        return (source_row(p) for p in range(position, ROWS))

    def write(chunk: Chunk, items: list[Row]) -> None:
        nonlocal calls
        if many:
            chunk.executemany(INSERT_ROW, items)
        else:
            chunk.copy(COPY_ROWS, items)
        if len(items) < CHUNK:  # part of a chunk: its rejected rows are being isolated
            calls += 1
            if calls == pause:
                say("ready", items[0][0] - 1, len(items))
                while True:  # until the parent's SIGKILL
                    time.sleep(60)

    def load(step: StepRun) -> None:
        step.load(read, write, chunk_size=CHUNK, skip_limit=ROWS, key=lambda row: f"id {row[0]}")

    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        job = Job(
            repository, JOB_NAME, {"run": os.environ["CRASH_RUN"]}, lease=timedelta(seconds=1)
        )
        run = launch(job)
        with run:
            say("launched", run.attempt)
            run.step(STEP_NAME, load)
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
