"""Upgrading to a claim that reads only its own plan (migration 0019) under a live plan.

A partitioned step of the older package has one partition claimed and the rest unclaimed, and
an abandoned plan of an earlier run keeps partitions no worker will take, while the migration
replaces the worker index (NULLs included) by one of assigned partitions only; the worker then
ends its partition, claims the rest of its own plan in order, and the step completes.
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
CLAIM_READS_ITS_PLAN = next(
    m.version for m in migrator.shipped_migrations() if m.name == "partition_claim_reads_its_plan"
)


def test_a_plan_live_across_the_upgrade_claims_only_its_own_partitions_and_completes(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, CLAIM_READS_ITS_PLAN - 1)
    with monkeypatch.context() as old_package:
        old_package.setattr(
            repository_module, "supported_schema_version", lambda: CLAIM_READS_ITS_PLAN - 1
        )
        old = JobRepository.connect(config)
    with old:
        # An earlier job's plan, never worked off: its partitions stay without a worker.
        abandoned = Job(old, "fanout", {"day": "0"}).launch()
        partitioned.start_partitioned_step(
            old,
            abandoned.instance.id,
            abandoned.execution.id,
            "load",
            partitioned.plan_entries([f"x{n}" for n in range(50)], ETL_STATE_SCHEMA),
            StartLimit.unrestricted(),
        )
        run = Job(old, "fanout", {"day": "1"}).launch()
        entries = partitioned.plan_entries(["a", "b", "c", "d"], ETL_STATE_SCHEMA)
        _, parent = partitioned.start_partitioned_step(
            old, run.instance.id, run.execution.id, "load", entries, StartLimit.unrestricted()
        )
        lease = ExecutionLease()
        claimed = old.run_in_unit_of_work(lambda uow: partitioned._claim_in(uow, parent, lease))
        assert claimed is not None
        assert migrator.migrate(config)[0].version == CLAIM_READS_ITS_PLAN
        with JobRepository.connect(config) as repository:
            ended: list[str] = []
            while claimed is not None:
                partition, worker, _ = claimed
                ended.append(partition.key.value)
                claimed = partitioned._end_worker(
                    repository, partition, worker.id, S.COMPLETED, (parent, lease)
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
        untouched = admin.execute(
            "SELECT count(*) FROM pybatch.step_partition AS p"
            " INNER JOIN pybatch.step_execution AS s ON p.step_execution_id = s.id"
            " WHERE s.job_execution_id = %s AND p.worker_step_execution_id IS NULL",
            (abandoned.execution.id,),
        ).fetchone()
    # "No worker" has one index, by plan and ordinal; the worker index holds assigned rows only.
    assert "step_partition_worker" not in indexes
    assert indexes["step_partition_assigned_worker"].endswith(
        "(worker_step_execution_id) WHERE (worker_step_execution_id IS NOT NULL)"
    )
    assert [name for name, definition in indexes.items() if "IS NULL" in definition] == [
        "step_partition_unassigned"
    ]
    assert untouched == (50,)
