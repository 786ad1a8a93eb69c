"""A partition worker that stops before the first chunk of one partition, for the lost-claim test.

Run from the repository root as ``python -m tests.faults.claim_worker`` with PYTHONPATH set;
tests/faults/test_server_faults.py crashes the server while this worker waits, so that the
claim it made (with the end of its previous partition) is lost, then lets it try its chunk.

Environment:
    PYBATCH_DSN, PYBATCH_TLS  the job repository (ConnectionConfig.from_env)
    CLAIM_PARENT_ID           the partitioned step (STARTED, its plan published)
    CLAIM_PAUSE_KEY           the partition whose work waits before its first chunk
    CLAIM_PAUSE_FILE          it waits while this file exists

Protocol on stdout, one flushed line each:
    paused <key>              the partition is claimed, nothing of it written
    refused <error class>     its chunk was refused
    done <partitions>         the worker found nothing left to claim
"""

from __future__ import annotations

import datetime
import os
import sys
import time

from pybatch import ConnectionConfig, JobRepository, etl
from pybatch import _partitioned as partitioned
from pybatch.errors import PyBatchError
from pybatch.etl import PartitionRun
from pybatch.values.ownership import ExecutionLease

#: Each partition's rows of public.orders: `first` .. `first + ROWS - 1`, in chunks of CHUNK.
ROWS, CHUNK = 20, 10
PLAN = {"a": {"first": 1}, "b": {"first": 1 + ROWS}}
INSERT = "INSERT INTO public.orders (id, note) VALUES (%s, %s)"
#: Renewed every 2 s: no renewal (a commit that waits) falls between the claim and the crash.
LEASE = ExecutionLease(datetime.timedelta(seconds=6))


def source(key: str) -> list[tuple[int, str]]:
    first = int(PLAN[key]["first"])
    return [(first + i, f"{key}-{i}") for i in range(ROWS)]


def load(partition: PartitionRun) -> None:
    """Insert the partition's rows from its checkpoint on, a chunk at a time."""
    rows = source(partition.key)
    offset = int(partition.checkpoint.get("offset", 0))
    if partition.key == os.environ.get("CLAIM_PAUSE_KEY"):
        print("paused", partition.key, flush=True)
        while os.path.exists(os.environ["CLAIM_PAUSE_FILE"]):
            time.sleep(0.01)
    while offset < ROWS:
        batch = rows[offset : offset + CHUNK]
        try:
            with partition.chunk() as chunk:
                chunk.executemany(INSERT, batch)
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})
        except PyBatchError as error:
            print("refused", type(error).__name__, flush=True)
            raise


def main() -> int:
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        with repository.begin(read_only=True) as uow:
            parent = uow.steps.get(int(os.environ["CLAIM_PARENT_ID"]))
            assert parent is not None
            execution = uow.executions.get(parent.job_execution_id)
            assert execution is not None
            instance = uow.instances.get(execution.job_instance_id)
            assert instance is not None
        runner = etl._runners(instance, execution, load)(repository)
        ran = partitioned.work_on_plan(repository, parent, runner, poll_seconds=0.05, lease=LEASE)
    print("done", ran, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
