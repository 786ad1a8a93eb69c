"""Upgrading to partition ends that write no index entry (migration 0018) under a live plan.

A partitioned step of the older package has one partition claimed and the rest unclaimed
while the migration swaps the claimable index (STARTING partitions) for the unassigned one
(partitions without a worker); the worker then ends its partition, claims the rest in plan
order through the new index, and the step completes.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import (
    migrate_to,
    migration_named,
    older_package,
    start_plan,
    work_off,
)

PARTITION_END_IS_HOT = migration_named("partition_end_is_hot")


def test_a_plan_live_across_the_upgrade_is_claimed_in_order_and_completes(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    with older_package(config, PARTITION_END_IS_HOT - 1, monkeypatch) as old:
        plan = start_plan(old, "1", ["a", "b", "c", "d"])
        migrate_to(config, PARTITION_END_IS_HOT)
        worked = work_off(config, plan)
    assert worked == (["a", "b", "c", "d"], BatchStatus.COMPLETED, [])

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
