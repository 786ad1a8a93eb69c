"""Upgrading to job execution rules checked on write (migration 0021) under a live run.

A run of the older package keeps committing chunks while the migration replaces the 28 CHECKs
of job_execution by one constraint trigger; the run ends, a new run launches and completes,
and afterwards every rule still refuses what its CHECK refused (SQLSTATE 23514, named as the
CHECK was), on a write and on a new row, leaving the row as it was.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.etl import Job
from tests.conftest import plaintext_config
from tests.migrations.live_plan import migration_named, run_across_upgrade

JOB_RULES = migration_named("job_execution_rules_on_write")

_REASON = "failure_error_class = 'KeyError', failure_message = 'm'"
#: Each rule and a write of a COMPLETED execution (owner token and host kept, no lease, no
#: failure, no stop) that breaks it and no other rule. `id_positive` is checked on an INSERT.
BROKEN: dict[str, str] = {
    "job_execution_attempt_positive": "attempt = 0",
    "job_execution_context_format_positive": "context_format = 0",
    "job_execution_context_payload_object": "context_payload = '[]'",
    "job_execution_context_schema_length": "context_schema = ''",
    "job_execution_context_schema_version_positive": "context_schema_version = 0",
    "job_execution_end_state": "ended_at = NULL",
    "job_execution_exit_code_length": "exit_code = repeat('x', 65)",
    "job_execution_failed_has_failure": "status = 'FAILED'",
    "job_execution_failure_category_valid": "failure_category = 'MYSTERY', failure_id = 1",
    "job_execution_failure_error_class_length": "failure_error_class = '', failure_message = 'm'",
    "job_execution_failure_id_positive": "failure_category = 'USER_COMPONENT', failure_id = 0",
    "job_execution_failure_message_length": (
        "failure_error_class = 'KeyError', failure_message = repeat('m', 1001)"
    ),
    "job_execution_failure_names_length": f"{_REASON}, failure_table = repeat('t', 64)",
    "job_execution_failure_reason_whole": "failure_message = 'no class'",
    "job_execution_failure_shape": "failure_id = 7",
    "job_execution_failure_sqlstate_format": f"{_REASON}, failure_sqlstate = 'oops'",
    "job_execution_lease_has_owner": (
        "owner_token = NULL, owner_host = NULL, lease_expires_at = now()"
    ),
    "job_execution_owner_host_format": "owner_host = 'no port'",
    "job_execution_owner_host_has_owner": "owner_token = NULL, lease_expires_at = NULL",
    "job_execution_owner_token_length": "owner_token = '\\x00'",
    "job_execution_parameters_object": "parameters = '[]'",
    "job_execution_status_valid": "status = 'PAUSED'",
    "job_execution_stop_requested_by_length": ("stop_requested_at = now(), stop_requested_by = ''"),
    "job_execution_stop_shape": "stop_requested_at = now()",
    "job_execution_timestamp_order": "started_at = created_at - interval '1 second'",
    "job_execution_upgrade_shape": "upgrade_from_definition_id = definition_id",
    "job_execution_version_nonnegative": "version = -1",
}


def test_a_run_live_across_the_upgrade_completes_and_every_rule_still_refuses(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    applied = run_across_upgrade(config, JOB_RULES, monkeypatch)
    with JobRepository.connect(config) as repository, Job(repository, "next", {}).launch() as run:
        run.step("load", lambda step: None)
    assert applied == list(range(JOB_RULES, migrator.supported_schema_version() + 1))

    with psycopg.connect(blank_database, autocommit=True) as admin:
        runs: list[Any] = admin.execute(
            "SELECT id, status, version FROM pybatch.job_execution ORDER BY id"
        ).fetchall()
        assert [status for _, status, _ in runs] == ["COMPLETED", "COMPLETED"]
        newest = runs[-1]
        # upgrade_shape's write would first meet the foreign key to a registered upgrade.
        admin.execute("ALTER TABLE pybatch.job_execution DROP CONSTRAINT job_execution_upgrade_fk")
        refused = {}
        for rule, assignment in BROKEN.items():
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                admin.execute(
                    f"UPDATE pybatch.job_execution SET {assignment} WHERE id = %s", (newest[0],)
                )
            refused[rule] = caught.value.diag.constraint_name
        # A new row is checked too: a copy of the newest with a negative id.
        columns = admin.execute(
            "SELECT string_agg(attname, ', ' ORDER BY attnum) FROM pg_attribute"
            " WHERE attrelid = 'pybatch.job_execution'::regclass AND attnum > 0"
            " AND NOT attisdropped AND attname NOT IN ('id', 'attempt')"
        ).fetchone()
        assert columns is not None
        with pytest.raises(psycopg.errors.CheckViolation) as inserted:
            admin.execute(
                f"INSERT INTO pybatch.job_execution (id, attempt, {columns[0]})"
                f" OVERRIDING SYSTEM VALUE SELECT -5, 99, {columns[0]}"
                " FROM pybatch.job_execution WHERE id = %s",
                (newest[0],),
            )
        checks = admin.execute(
            "SELECT count(*) FROM pg_constraint"
            " WHERE conrelid = 'pybatch.job_execution'::regclass AND contype = 'c'"
        ).fetchone()
        after = admin.execute(
            "SELECT id, status, version FROM pybatch.job_execution WHERE id = %s", (newest[0],)
        ).fetchone()
    assert refused == {rule: rule for rule in BROKEN}
    assert inserted.value.diag.constraint_name == "job_execution_id_positive"
    assert checks == (0,)
    assert after == newest  # every refused write left the row as it was
