"""Crash-test worker: a chunked ETL load (pybatch.etl) that can stop at a named point.

Run from the repository root as ``python -m tests.crash.worker`` with PYTHONPATH set; the
parent (tests/crash/test_etl_crash.py) SIGKILLs it and starts it again until the job is done.

Environment:
    PYBATCH_DSN, PYBATCH_TLS  the job repository (ConnectionConfig.from_env)
    CRASH_RUN                 the run id: the job's identifying parameter
    CRASH_PAUSE               none, after_write, commit_race, in_commit or after_commit
    CRASH_PAUSE_CHUNK         which chunk of this attempt (1-based) stops at the pause point

Pause points, in the order a chunk passes them:
    after_write   the chunk's rows are written, nothing is committed; waits to be killed
    commit_race   announced just before `chunk.commit()`, which then runs at once: the parent
                  kills after a random jitter of microseconds, racing the progress UPDATE
                  and the COMMIT
    in_commit     inside `chunk.commit()`: the COMMIT is sent but its acknowledgement is
                  never read, so the kill lands with the COMMIT in flight (the server
                  commits, the worker never learns it); waits to be killed
    after_commit  `chunk.commit()` returned; waits to be killed

Protocol on stdout, one flushed line each:
    launched <attempt>            the attempt is STARTED
    begin <offset>                the step resumes from this committed offset
    ready <point> <from> <to>     at the pause point of the chunk that moves from -> to
    done                          the job completed
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import ExecutionAlreadyActive
from pybatch.etl import Job, JobRun, StepRun

JOB_NAME = "crash_load"
STEP_NAME = "load"
ROWS = 12_000  # long enough that no kill of a test lands after the last chunk
CHUNK = 25
TABLE = "crash_target"
PAUSES = ("none", "after_write", "commit_race", "in_commit", "after_commit")

# No unique key on purpose: a chunk applied twice must show up as a count and hash mismatch.
CREATE_TABLE = (
    f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, label TEXT NOT NULL,"
    " amount NUMERIC(10, 2) NOT NULL)"
)
INSERT_ROW = f"INSERT INTO {TABLE} (id, label, amount) VALUES (%s, %s, %s)"
COPY_ROWS = f"COPY {TABLE} (id, label, amount) FROM STDIN"
SELECT_ROWS = f"SELECT id, label, CAST(amount AS TEXT) FROM {TABLE} ORDER BY id, label, amount"


def source_row(row_id: int) -> tuple[int, str, str]:
    """Row `row_id` (1-based) of the deterministic source."""
    cents = (row_id * 7919) % 1_000_000
    label = f"row {row_id} {hashlib.sha256(str(row_id).encode()).hexdigest()[:12]}"
    return row_id, label, f"{cents // 100}.{cents % 100:02d}"


def rows_sha256(rows: Iterator[tuple[Any, ...]] | list[tuple[Any, ...]]) -> str:
    """sha256 over one `id|label|amount` line per row, in the order given."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(("|".join(str(value) for value in row) + "\n").encode())
    return digest.hexdigest()


def source_sha256(count: int) -> str:
    """The fingerprint of the first `count` source rows, as the table's rows hash."""
    return rows_sha256(source_row(row_id) for row_id in range(1, count + 1))


def parameters(run: str) -> dict[str, str]:
    return {"run": run}


def say(*words: object) -> None:
    print(*words, flush=True)


def hang() -> None:
    while True:  # until the parent's SIGKILL
        time.sleep(60)


class Pause:
    """Where this attempt stops, and the hook that stops inside COMMIT."""

    def __init__(self, point: str, chunk: int) -> None:
        if point not in PAUSES:
            raise SystemExit(f"CRASH_PAUSE must be one of {PAUSES}")
        self.point = point
        self.chunk = chunk
        self.armed: psycopg.Connection[Any] | None = None
        self.span = (0, 0)
        if point == "in_commit":
            original = psycopg.Connection.commit

            def commit(conn: psycopg.Connection[Any]) -> None:
                if conn is self.armed:
                    self._commit_in_flight(conn)
                original(conn)

            psycopg.Connection.commit = commit  # type: ignore[method-assign,assignment]

    def _commit_in_flight(self, conn: psycopg.Connection[Any]) -> None:
        pgconn = conn.pgconn
        pgconn.send_query(b"COMMIT")
        while pgconn.flush():  # the connection is non-blocking: push the whole message out
            time.sleep(0.0001)
        say("ready", "in_commit", *self.span)
        hang()

    def at(self, point: str, number: int, span: tuple[int, int]) -> None:
        if point == self.point and number == self.chunk:
            say("ready", point, *span)
            if point != "commit_race":
                hang()


def load(step: StepRun, pause: Pause) -> None:
    offset = int(step.checkpoint.get("offset", 0))
    say("begin", offset)
    number = 0
    while offset < ROWS:
        number += 1
        end = min(offset + CHUNK, ROWS)
        rows = [source_row(row_id) for row_id in range(offset + 1, end + 1)]
        with step.chunk() as chunk:
            if (offset // CHUNK) % 2 == 0:
                chunk.executemany(INSERT_ROW, rows)
            else:
                chunk.copy(COPY_ROWS, rows)
            pause.at("after_write", number, (offset, end))
            pause.at("commit_race", number, (offset, end))
            if pause.point == "in_commit" and number == pause.chunk:
                pause.armed, pause.span = chunk.connection, (offset, end)
            chunk.commit(read=len(rows), written=len(rows), checkpoint={"offset": end})
        pause.at("after_commit", number, (offset, end))
        offset = end


#: A short lease, so a restart after SIGKILL waits about a second.
LEASE = timedelta(seconds=1)


def launch(job: Job) -> JobRun:
    """Launch; a killed attempt's lease (one second) outlives it for a moment."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return job.launch()
        except ExecutionAlreadyActive:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def main() -> int:
    pause = Pause(
        os.environ.get("CRASH_PAUSE", "none"), int(os.environ.get("CRASH_PAUSE_CHUNK", "1"))
    )
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        job = Job(repository, JOB_NAME, parameters(os.environ["CRASH_RUN"]), lease=LEASE)
        run = launch(job)
        with run:
            say("launched", run.attempt)
            run.step(STEP_NAME, lambda step: load(step, pause))
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
