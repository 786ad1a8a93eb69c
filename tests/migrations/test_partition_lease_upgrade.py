"""Upgrading to partition worker leases under a running partitioned step.

Before the migration that adds `step_partition.worker_lease_expires_at`, a claimed
partition had no lease. pybatch decides a worker's liveness by the lease alone, so after the
upgrade a STARTED partition without one has no live worker, whatever advisory lock a process
of an older package still holds: it is recovered, the next worker resumes it from its
checkpoint, and the job completes with every row once.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch import _partitioned as partitioned
from pybatch.etl import ETL_STATE_SCHEMA, Job, PartitionRun, join_partitioned_step
from pybatch.values.flow import StartLimit
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import NodeId, StepName
from pybatch.values.ownership import ExecutionLease
from pybatch.values.status import BatchStatus, FailureCategory
from tests.conftest import plaintext_config
from tests.contract.test_partition_leases import recover_lost
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to

S = BatchStatus
ROWS = 10
CHUNK = 5
PARAMS = {"run": "upgrade"}
#: The last schema version without worker leases (migration 0005 adds them).
BEFORE = 4
LEASE = ExecutionLease()


def load(partition: PartitionRun) -> None:
    first = int(partition.partition_context["first"])
    offset = int(partition.checkpoint.get("offset", 0))
    while offset < ROWS:
        with partition.chunk() as chunk:
            chunk.executemany(
                "INSERT INTO public.orders (id, part) VALUES (%s, %s)",
                [(first + i, partition.key) for i in range(offset, offset + CHUNK)],
            )
            offset += CHUNK
            chunk.commit(read=CHUNK, written=CHUNK, checkpoint={"offset": offset})


def legacy_claim(repository: JobRepository, dsn: str, parent_id: int, key: str) -> int:
    """What an older pybatch's claim left: a STARTED worker step assigned to the partition.

    The worker committed one chunk (rows and checkpoint); returns the worker step's id.
    """
    with repository.begin() as uow:
        parent = uow.steps.get(parent_id)
        assert parent is not None
        worker = uow.flow.create_step(
            parent.job_execution_id, StepName(f"load#{key}.1"), NodeId(f"load#{key}.1")
        )
        worker = uow.steps.transition(
            worker.id, worker.version, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        uow.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pybatch.step_partition SET worker_step_execution_id = %s, status = 'STARTED',"
            " version = version + 1 WHERE step_execution_id = %s AND partition_key = %s",
            (worker.id, parent_id, key),
        )
    first = 1 if key == "p0" else ROWS + 1
    with psycopg.connect(dsn) as conn:  # what the older worker's chunk committed (no fence)
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO public.orders (id, part) VALUES (%s, %s)",
                [(first + i, key) for i in range(CHUNK)],
            )
        conn.execute(
            "UPDATE pybatch.step_execution SET read_count = %s, processed_count = %s,"
            " write_count = %s, commit_count = 1, checkpoint_schema = %s,"
            " checkpoint_schema_version = 1, checkpoint_payload = %s, version = version + 1"
            " WHERE id = %s AND status = 'STARTED'",
            (CHUNK, CHUNK, CHUNK, ETL_STATE_SCHEMA.value, Jsonb({"offset": CHUNK}), worker.id),
        )
    return worker.id


def test_after_the_partition_lease_upgrade_unleased_partitions_are_recovered_and_completed(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, BEFORE)
    with psycopg.connect(blank_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.orders (id bigint NOT NULL, part text NOT NULL)")
    with older_package(monkeypatch, BEFORE):
        old = JobRepository.connect(config)
        run = Job(old, "fanout", PARAMS).launch()
        plan = {"p0": {"first": 1}, "p1": {"first": ROWS + 1}, "p2": {"first": 2 * ROWS + 1}}
        _skipped, parent = partitioned.start_partitioned_step(
            old,
            run.instance.id,
            run.execution.id,
            "load",
            partitioned.plan_entries(plan, ETL_STATE_SCHEMA),
            StartLimit.unrestricted(),
        )
        alive = legacy_claim(old, blank_database, parent.id, "p0")
        dead = legacy_claim(old, blank_database, parent.id, "p1")
    try:
        # A process of the older package still holds the advisory lock it judged p0's
        # worker by; p1's is gone.
        with psycopg.connect(blank_database, autocommit=True) as legacy_worker:
            legacy_worker.execute(
                "SELECT pg_advisory_lock(hashtextextended('pybatch.step_execution.liveness', %s))",
                (alive,),
            )
            applied = migrator.migrate(config)
            assert [m.version for m in applied] == list(
                range(BEFORE + 1, migrator.supported_schema_version() + 1)
            )
            with psycopg.connect(blank_database) as conn:
                leases = conn.execute(
                    "SELECT partition_key, status, worker_owner_token, worker_lease_expires_at"
                    " FROM pybatch.step_partition ORDER BY partition_key"
                ).fetchall()
            assert leases == [
                ("p0", "STARTED", None, None),
                ("p1", "STARTED", None, None),
                ("p2", "STARTING", None, None),
            ]
            with JobRepository.connect(config) as repository:
                # No lease, no live worker: the lock decides nothing.
                assert recover_lost(repository, parent.id) == 2
                with repository.begin() as uow:
                    states = {p.key.value: p.status for p in uow.partitions.plan(parent.id)}
                assert states == {"p0": S.FAILED, "p1": S.FAILED, "p2": S.STARTING}
        # A new worker resumes both recovered partitions from their checkpoints and runs
        # the third.
        with JobRepository.connect(config) as repository:
            ran = join_partitioned_step(repository, "fanout", PARAMS, "load", load, lease=LEASE)
            assert ran == 3
            ended, unfinished = partitioned.aggregate_plan(repository, parent)
            assert unfinished == [] and ended.status is S.COMPLETED
            assert ended.metadata.counts.written == 3 * ROWS
            with run:
                pass
            with repository.begin() as uow:
                execution = uow.executions.get(run.execution.id)
                assert execution is not None and execution.status is S.COMPLETED
                for worker_id in (alive, dead):
                    worker = uow.steps.get(worker_id)
                    assert worker is not None and worker.metadata.failure is not None
                    assert worker.metadata.failure.category is FailureCategory.STALE_RECOVERED
    finally:
        old.close()
    with psycopg.connect(blank_database) as conn:
        counted = conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM public.orders").fetchone()
    assert counted == (3 * ROWS, 3 * ROWS)
