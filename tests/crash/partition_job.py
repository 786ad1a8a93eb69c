"""Crash-test job: one partitioned step, 200 partitions, 8 local worker processes.

Run as ``python -m tests.crash.partition_job`` (PYTHONPATH = repository root); the parent
(tests/crash/test_partition_crash.py) SIGKILLs its worker processes, or the whole job, and
checks that every source row lands exactly once.

Environment:
    PYBATCH_DSN, PYBATCH_TLS  the job repository (ConnectionConfig.from_env)
    CRASH_RUN                 the run id: the job's identifying parameter
    CRASH_SLOW_FILE           while this file exists, each chunk sleeps (the kills land
                              mid-partition); the test removes it when it has killed enough
    CRASH_WORKERS             local worker processes (default 8)
    CRASH_LEASE_S             the job's lease, also each worker's lease on its partition: a
                              killed worker's partition is recovered once it runs out
                              (default 3 seconds)

Protocol on stdout, one flushed line each:
    launched <attempt> <pid>  the attempt is STARTED (workers are forked children of <pid>)
    done <status>             the partitioned step ended
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sys
import time
from collections.abc import Iterable

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import PartitionsFailed
from pybatch.etl import Job, PartitionRun

JOB_NAME = "crash_partitions"
STEP_NAME = "load"
PARTITIONS = 200
ROWS_PER_PARTITION = 120
CHUNK = 30
TABLE = "crash_partition_target"

# No unique key on purpose: a chunk applied twice must show up as a count and hash mismatch.
CREATE_TABLE = f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, part TEXT NOT NULL, label TEXT NOT NULL)"
COPY_ROWS = f"COPY {TABLE} (id, part, label) FROM STDIN"
SELECT_ROWS = f"SELECT id, part, label FROM {TABLE} ORDER BY id, part, label"


def key(index: int) -> str:
    return f"part-{index:04d}"


def plan() -> dict[str, dict[str, int]]:
    return {key(i): {"first": i * ROWS_PER_PARTITION + 1} for i in range(PARTITIONS)}


def source_row(row_id: int) -> tuple[int, str, str]:
    index = (row_id - 1) // ROWS_PER_PARTITION
    return row_id, key(index), hashlib.sha256(str(row_id).encode()).hexdigest()[:16]


def rows_sha256(rows: Iterable[tuple[object, ...]]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(("|".join(str(value) for value in row) + "\n").encode())
    return digest.hexdigest()


def source_sha256() -> str:
    return rows_sha256(source_row(i) for i in range(1, PARTITIONS * ROWS_PER_PARTITION + 1))


def load(partition: PartitionRun) -> None:
    """COPY the partition's rows in chunks, resuming from the partition's checkpoint."""
    slow = os.environ.get("CRASH_SLOW_FILE", "")
    first = int(partition.partition_context["first"])
    offset = int(partition.checkpoint.get("offset", 0))
    while offset < ROWS_PER_PARTITION:
        end = min(offset + CHUNK, ROWS_PER_PARTITION)
        rows = [source_row(first + i) for i in range(offset, end)]
        with partition.chunk() as chunk:
            chunk.copy(COPY_ROWS, rows)
            if slow and os.path.exists(slow):
                time.sleep(0.1)
            offset = end
            chunk.commit(read=len(rows), written=len(rows), checkpoint={"offset": offset})


def main() -> int:
    config = ConnectionConfig.from_env()
    workers = int(os.environ.get("CRASH_WORKERS", "8"))
    lease = datetime.timedelta(seconds=float(os.environ.get("CRASH_LEASE_S", "3")))
    with JobRepository.connect(config) as repository:
        job = Job(repository, JOB_NAME, {"run": os.environ["CRASH_RUN"]}, lease=lease)
        with job.launch() as run:
            print("launched", run.attempt, os.getpid(), flush=True)
            try:
                outcome = run.partitioned_step(STEP_NAME, plan(), load, workers=workers)
            except PartitionsFailed as failed:
                print("done", failed.status, flush=True)
                raise
            print("done", outcome.step.status.value, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
