"""Upgrading to a claim that reads only its own plan (migration 0019) under a live plan.

A partitioned step of the older package has one partition claimed and the rest unclaimed, and
an abandoned plan of an earlier run keeps partitions no worker will take, while the migration
replaces the worker index (NULLs included) by one of assigned partitions only; the worker then
ends its partition, claims the rest of its own plan in order, and the step completes.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import _partitioned as partitioned
from pybatch.etl import ETL_STATE_SCHEMA, Job
from pybatch.values.flow import StartLimit
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import (
    migrate_to,
    migration_named,
    older_package,
    start_plan,
    work_off,
)

CLAIM_READS_ITS_PLAN = migration_named("partition_claim_reads_its_plan")


def test_a_plan_live_across_the_upgrade_claims_only_its_own_partitions_and_completes(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    with older_package(config, CLAIM_READS_ITS_PLAN - 1, monkeypatch) as old:
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
        plan = start_plan(old, "1", ["a", "b", "c", "d"])
        migrate_to(config, CLAIM_READS_ITS_PLAN)
        worked = work_off(config, plan)
    assert worked == (["a", "b", "c", "d"], BatchStatus.COMPLETED, [])

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
