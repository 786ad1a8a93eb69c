"""Upgrading to partition ends that write no index entry (migration 0018) under a live plan.

A partitioned step of the older package has one partition claimed and the rest unclaimed
while the migration swaps the claimable index (STARTING partitions) for the unassigned one
(partitions without a worker); the worker then ends its partition, claims the rest in plan
order through the new index, and the step completes.
"""

from __future__ import annotations

import psycopg
import pytest

import pybatch._job_repository as repository_module
from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch import _partitioned as partitioned
from pybatch.etl import ETL_STATE_SCHEMA, Job
from pybatch.values.flow import StartLimit
from pybatch.values.ownership import ExecutionLease
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.test_lease_upgrade import install_up_to

S = BatchStatus
#: The migration that swaps the index (looked up by name: its number follows the others').
PARTITION_END_IS_HOT = next(
    m.version for m in migrator.shipped_migrations() if m.name == "partition_end_is_hot"
)


def test_a_plan_live_across_the_upgrade_is_claimed_in_order_and_completes(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, PARTITION_END_IS_HOT - 1)
    with monkeypatch.context() as old_package:
        old_package.setattr(
            repository_module, "supported_schema_version", lambda: PARTITION_END_IS_HOT - 1
        )
        old = JobRepository.connect(config)
    with old:
        run = Job(old, "fanout", {"day": "1"}).launch()
        entries = partitioned.plan_entries(["a", "b", "c", "d"], ETL_STATE_SCHEMA)
        _, parent = partitioned.start_partitioned_step(
            old, run.instance.id, run.execution.id, "load", entries, StartLimit.unrestricted()
        )
        lease = ExecutionLease()
        claimed = old.run_in_unit_of_work(lambda uow: partitioned._claim_in(uow, parent, lease))
        assert claimed is not None
        assert migrator.migrate(config)[0].version == PARTITION_END_IS_HOT
        with JobRepository.connect(config) as repository:
            ended: list[str] = []
            while claimed is not None:
                partition, worker, _ = claimed
                ended.append(partition.key.value)
                claimed = partitioned._end_worker(
                    repository,
                    partition,
                    worker.id,
                    S.COMPLETED,
                    (parent, lease),
                )
            aggregated, unfinished = partitioned.aggregate_plan(repository, parent)
        with run:
            pass
    assert (ended, aggregated.status, unfinished) == (["a", "b", "c", "d"], S.COMPLETED, [])

    with psycopg.connect(blank_database) as admin:
        indexes: dict[str, str] = dict(
            admin.execute(
                "SELECT indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = 'pybatch' AND tablename = 'step_partition'"
            ).fetchall()
        )
        options = admin.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'pybatch.step_partition'::regclass"
        ).fetchone()
    # No index of step_partition reads status: a partition end can be a heap-only update.
    assert "step_partition_claimable" not in indexes
    assert indexes["step_partition_unassigned"].endswith(
        "(step_execution_id, partition_ordinal) WHERE (worker_step_execution_id IS NULL)"
    )
    assert not [name for name, definition in indexes.items() if "status" in definition]
    assert options == (["fillfactor=80"],)
