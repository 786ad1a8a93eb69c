"""Zombie-writer job: a partitioned step worked on by the launching process and joined workers.

Run from the repository root as ``python -m tests.crash.zombie_job launch|join`` with
PYTHONPATH set; tests/crash/test_zombie_writers.py ends the launcher's execution in every way
an ownership can end while a joined worker sits in the middle of a chunk, then lets that worker
try to commit.

Environment:
    PYBATCH_DSN, PYBATCH_TLS  the job repository (ConnectionConfig.from_env)
    ZOMBIE_RUN                the run id: the job's identifying parameter
    ZOMBIE_LEASE_S            the job's lease and each worker's lease on its partition
    ZOMBIE_CHUNK_SLEEP_S      how long each chunk waits before it commits (paces the load)
    ZOMBIE_PAUSE_FILE         (join) while this file exists, the worker's first chunk waits
                              between its COPY and its commit; it prints ``paused`` once
    ZOMBIE_LOCAL_WORKERS      (launch) forked local workers; 0 (default): the launcher works on
                              the plan itself

SIGUSR1 makes the launcher raise an error, as a failing launcher would (with local workers, it
is then supervising them: with none, the error would only fail the partition it works on);
SIGINT interrupts it (Ctrl-C).

Protocol on stdout, one flushed line each:
    launched <attempt> <execution id>   (launch) the attempt is STARTED
    paused <partition key> <first id>   (join) the chunk waits before its commit
    refused <error class>               (join) a chunk commit was refused
    done <status>                       the launcher's step ended, or the worker returned
"""

from __future__ import annotations

import datetime
import hashlib
import os
import signal
import sys
import time
from types import FrameType

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import PyBatchError
from pybatch.etl import Job, PartitionRun, join_partitioned_step
from tests.crash.partition_job import rows_sha256

JOB_NAME = "zombie_partitions"
STEP_NAME = "load"
PARTITIONS = 24
ROWS_PER_PARTITION = 60
CHUNK = 20
TABLE = "zombie_target"

# No unique key on purpose: a chunk applied twice shows up as a count and hash mismatch.
CREATE_TABLE = f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, part TEXT NOT NULL, label TEXT NOT NULL)"
COPY_ROWS = f"COPY {TABLE} (id, part, label) FROM STDIN"
SELECT_ROWS = f"SELECT id, part, label FROM {TABLE} ORDER BY id, part, label"


def key(index: int) -> str:
    return f"part-{index:03d}"


def plan() -> dict[str, dict[str, int]]:
    return {key(i): {"first": i * ROWS_PER_PARTITION + 1} for i in range(PARTITIONS)}


def source_row(row_id: int) -> tuple[int, str, str]:
    index = (row_id - 1) // ROWS_PER_PARTITION
    return row_id, key(index), hashlib.sha256(str(row_id).encode()).hexdigest()[:16]


def source_sha256() -> str:
    return rows_sha256(source_row(i) for i in range(1, PARTITIONS * ROWS_PER_PARTITION + 1))


_paused_once = False


def load(partition: PartitionRun) -> None:
    """COPY the partition's rows in chunks, resuming from the partition's checkpoint."""
    global _paused_once
    pause_file = os.environ.get("ZOMBIE_PAUSE_FILE", "")
    pace = float(os.environ.get("ZOMBIE_CHUNK_SLEEP_S", "0"))
    first = int(partition.partition_context["first"])
    offset = int(partition.checkpoint.get("offset", 0))
    while offset < ROWS_PER_PARTITION:
        end = min(offset + CHUNK, ROWS_PER_PARTITION)
        rows = [source_row(first + i) for i in range(offset, end)]
        with partition.chunk() as chunk:
            chunk.copy(COPY_ROWS, rows)
            if pause_file and not _paused_once and os.path.exists(pause_file):
                _paused_once = True
                print("paused", partition.key, rows[0][0], flush=True)
                while os.path.exists(pause_file):
                    time.sleep(0.01)
            time.sleep(pace)
            offset = end
            try:
                chunk.commit(read=len(rows), written=len(rows), checkpoint={"offset": offset})
            except PyBatchError as error:
                print("refused", type(error).__name__, flush=True)
                raise


def _fail(signum: int, frame: FrameType | None) -> None:
    raise RuntimeError("the launcher failed on purpose")


def launch(repository: JobRepository, lease: datetime.timedelta) -> int:
    signal.signal(signal.SIGUSR1, _fail)
    job = Job(repository, JOB_NAME, {"run": os.environ["ZOMBIE_RUN"]}, lease=lease)
    with job.launch() as run:
        print("launched", run.attempt, run.execution.id, flush=True)
        workers = int(os.environ.get("ZOMBIE_LOCAL_WORKERS", "0"))
        outcome = run.partitioned_step(STEP_NAME, plan(), load, workers=workers)
        print("done", outcome.step.status.value, flush=True)
    return 0


def join(repository: JobRepository, lease: datetime.timedelta) -> int:
    ran = join_partitioned_step(
        repository,
        JOB_NAME,
        {"run": os.environ["ZOMBIE_RUN"]},
        STEP_NAME,
        load,
        wait_seconds=30,
        poll_seconds=0.05,
        lease=lease,
    )
    print("done", ran, flush=True)
    return 0


def main() -> int:
    lease = datetime.timedelta(seconds=float(os.environ.get("ZOMBIE_LEASE_S", "2")))
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        if sys.argv[1:] == ["launch"]:
            return launch(repository, lease)
        return join(repository, lease)


if __name__ == "__main__":
    sys.exit(main())
