"""Upgrading to a run's end whose step checks run generic plans (migration 0026) under live jobs.

A run of the older package commits a chunk and dies with its step STARTED; another goes on
while the migration changes end_job_execution and the finished-execution check, commits its
next chunk and completes. The upgraded package then recovers the dead run and resumes it from
the committed chunk. Before the migration, a run's end planned its read of unfinished steps and
the deferred check of its finished execution for the execution at hand (again at every end once
the plan cache preferred those plans); after it, both run their generic plans from the first
end of a session.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.etl import Job
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import migration_named, older_package, recover_across_upgrade
from tests.migrations.test_lease_upgrade import install_up_to
from tests.support.plans import log_nested_plans

CHECKS_PLAN_ONCE = migration_named("run_end_checks_plan_once")
#: A run's end as pybatch sends it (queries/executions.sql end_job_execution), reasons NULL.
_END = (
    "SELECT o.outcome FROM pybatch.end_job_execution("
    "%s, %s, 'COMPLETED', NULL, NULL, NULL, NULL, NULL, NULL, pg_catalog.now()) AS o"
)


def first_end_plans(dsn: str, repository: JobRepository, job_name: str) -> tuple[int, list[str]]:
    """A one-step run ended by a new session that logs its plans: the run's id, the plans that
    read its steps (the unfinished-step read, then the finished-execution check at COMMIT)."""
    with repository:
        run = Job(repository, job_name, {}).launch()
        run.step("load", lambda step: None)
        run._stop_renewing()  # ended below, by hand
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT e.owner_token FROM pybatch.job_execution AS e WHERE e.id = %s",
            (run.execution.id,),
        ).fetchone()
        assert row is not None
        logged = log_nested_plans(conn)
        ended = conn.execute(_END, (run.execution.id, row[0])).fetchone()
        status = conn.execute(
            "SELECT e.status FROM pybatch.job_execution AS e WHERE e.id = %s",
            (run.execution.id,),
        ).fetchone()
    assert ended == ("ended",) and status == ("COMPLETED",)
    return run.execution.id, [plan for plan in logged if "pybatch.step_execution" in plan]


def test_a_dead_run_of_the_older_package_is_recovered_and_resumed_after_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_up_to(blank_database, CHECKS_PLAN_ONCE - 1)
    runs = recover_across_upgrade(plaintext_config(blank_database), CHECKS_PLAN_ONCE, monkeypatch)
    assert runs.applied == list(range(CHECKS_PLAN_ONCE, migrator.supported_schema_version() + 1))
    assert runs.live.execution.status is BatchStatus.COMPLETED
    assert runs.again.attempt == 2 and runs.again.execution.status is BatchStatus.COMPLETED
    assert runs.resumed_from == [{"offset": 1}]
    with psycopg.connect(blank_database) as conn:
        dead = conn.execute(
            "SELECT e.status, e.failure_category FROM pybatch.job_execution AS e WHERE e.id = %s",
            (runs.dead.execution.id,),
        ).fetchone()
    # The relaunch recovered the dead attempt through the upgraded run end.
    assert dead == ("FAILED", "STALE_RECOVERED")


def test_a_run_end_checks_its_steps_on_plans_for_any_execution_after_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    old = older_package(config, CHECKS_PLAN_ONCE - 1, monkeypatch)
    before_id, before = first_end_plans(blank_database, old, "before")
    migrator.migrate(config)
    after_id, after = first_end_plans(blank_database, JobRepository.connect(config), "after")
    # The unfinished-step read and the finished-execution check (end_unfinished_steps's
    # statements, generic since migration 0022, are logged too and read no literal id).
    before_literal = [plan for plan in before if f"'{before_id}'::bigint" in plan]
    assert len(before_literal) == 2
    assert len(after) == len(before)
    assert not any(f"'{after_id}'::bigint" in plan for plan in after)
