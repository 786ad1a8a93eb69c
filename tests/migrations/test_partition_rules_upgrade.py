"""Upgrading to partition rules checked on write (migration 0020) under a live plan.

A partitioned step of the older package has one partition claimed and the rest unclaimed while
the migration replaces the 21 CHECKs of step_partition by one constraint trigger; the worker
then ends its partition, claims and ends the rest, and the step completes. Afterwards every
rule still refuses what its CHECK refused (SQLSTATE 23514, named as the CHECK was), on a write
and on a new row, and the table has no CHECK left to prepare at each write.
"""

from __future__ import annotations

from typing import Any

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

PARTITION_RULES = migration_named("step_partition_rules_on_write")

#: Each rule and a write of a COMPLETED partition (a worker, no owner, no lease) that breaks it
#: and no other rule.
BROKEN: dict[str, str] = {
    "step_partition_commit_count_nonnegative": "commit_count = -1",
    "step_partition_context_checksum_length": "context_checksum = '\\x00'",
    "step_partition_context_format_positive": "context_format = 0",
    "step_partition_context_payload_object": "context_payload = '[]'",
    "step_partition_context_schema_length": "context_schema = ''",
    "step_partition_context_schema_version_positive": "context_schema_version = 0",
    "step_partition_exit_code_length": "exit_code = repeat('x', 65)",
    "step_partition_filter_count_nonnegative": "filter_count = -1",
    "step_partition_id_positive": "id = -id",
    "step_partition_partition_key_length": "partition_key = repeat('k', 129)",
    "step_partition_partition_ordinal_range": "partition_ordinal = 1025",
    "step_partition_processed_count_nonnegative": "processed_count = -1",
    "step_partition_read_count_nonnegative": "read_count = -1",
    "step_partition_rollback_count_nonnegative": "rollback_count = -1",
    "step_partition_status_valid": "status = 'PAUSED'",
    "step_partition_version_nonnegative": "version = -1",
    "step_partition_worker_lease_has_owner": "worker_lease_expires_at = now()",
    "step_partition_worker_owner_token_length": "worker_owner_token = '\\x00'",
    "step_partition_worker_owner_when_started": f"worker_owner_token = '\\x{'00' * 16}'",
    "step_partition_worker_shape": "worker_step_execution_id = NULL",
    "step_partition_write_count_nonnegative": "write_count = -1",
}


def test_a_plan_live_across_the_upgrade_completes_and_every_rule_still_refuses(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    with older_package(config, PARTITION_RULES - 1, monkeypatch) as old:
        plan = start_plan(old, "1", ["a", "b", "c", "d"])
        migrate_to(config, PARTITION_RULES)
        worked = work_off(config, plan)
    assert worked == (["a", "b", "c", "d"], BatchStatus.COMPLETED, [])

    with psycopg.connect(blank_database, autocommit=True) as admin:
        first = admin.execute(
            "SELECT id, status, version FROM pybatch.step_partition WHERE partition_key = 'a'"
        ).fetchone()
        assert first is not None and first[1] == "COMPLETED"
        refused = {}
        for rule, assignment in BROKEN.items():
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                admin.execute(
                    f"UPDATE pybatch.step_partition SET {assignment} WHERE id = %s", (first[0],)
                )
            refused[rule] = caught.value.diag.constraint_name
        # A new row is checked too: a plan entry with an ordinal out of range.
        with pytest.raises(psycopg.errors.CheckViolation) as inserted:
            admin.execute(
                "INSERT INTO pybatch.step_partition (step_execution_id, partition_key,"
                " partition_ordinal, status, context_format, context_schema,"
                " context_schema_version, context_payload, context_checksum)"
                " SELECT step_execution_id, 'z', 0, 'STARTING', context_format, context_schema,"
                " context_schema_version, context_payload, context_checksum"
                " FROM pybatch.step_partition WHERE id = %s",
                (first[0],),
            )
        checks: list[Any] = admin.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = 'pybatch.step_partition'::regclass AND contype = 'c'"
        ).fetchall()
        unchanged = admin.execute(
            "SELECT id, status, version FROM pybatch.step_partition WHERE id = %s", (first[0],)
        ).fetchone()
    assert refused == {rule: rule for rule in BROKEN}
    assert inserted.value.diag.constraint_name == "step_partition_partition_ordinal_range"
    assert checks == []
    assert unchanged == first  # every refused write left the row as it was
