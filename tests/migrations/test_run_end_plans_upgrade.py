"""Upgrading to a run's end on generic plans (migration 0022) under live jobs.

A run of the older package commits a chunk and dies with its step STARTED; another goes on
while the migration changes end_unfinished_steps, commits its next chunk and completes. The
upgraded package then recovers the dead run, which ends its step through end_unfinished_steps,
and resumes from the committed chunk. Before the migration the function planned its statements
for the execution at hand (the id folded into the plan, planned again at every call once the
plan cache preferred those plans); after it, every call runs the generic plan.
"""

from __future__ import annotations

import datetime

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import die_after_a_chunk, migration_named
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to

PLANS_ONCE = migration_named("end_unfinished_steps_plans_once")
_END = "SELECT pybatch.end_unfinished_steps(-1, 'FAILED', 'USER_COMPONENT', now())"


def end_plans(dsn: str) -> list[str]:
    """The plans auto_explain logs for the statements of a session's first run end."""
    logged: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET client_min_messages = log")
        conn.add_notice_handler(lambda diagnostic: logged.append(diagnostic.message_primary or ""))
        conn.execute(_END)
    return [plan for plan in logged if "pybatch.step_execution" in plan]


def test_a_dead_run_of_the_older_package_is_recovered_and_resumed_after_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, PLANS_ONCE - 1)
    applied: list[int] = []

    def upgrade_midway(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        applied.extend(m.version for m in migrator.migrate(config))  # while the run is live
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 2})

    with older_package(monkeypatch, PLANS_ONCE - 1), JobRepository.connect(config) as old:
        dead = die_after_a_chunk(old, "dead")
        with Job(old, "live", {}).launch() as live:
            live.step("load", upgrade_midway)
    assert applied == list(range(PLANS_ONCE, migrator.supported_schema_version() + 1))
    assert live.execution.status is BatchStatus.COMPLETED

    resumed_from: list[object] = []
    with JobRepository.connect(config) as repository:
        with Job(repository, "dead", {}, lease=datetime.timedelta(seconds=1)).launch() as again:
            again.step("load", lambda step: resumed_from.append(step.checkpoint))
    assert again.attempt == 2 and again.execution.status is BatchStatus.COMPLETED
    assert resumed_from == [{"offset": 1}]
    with psycopg.connect(blank_database) as conn:
        ended = conn.execute(
            "SELECT s.status, s.failure_category, s.read_count FROM pybatch.step_execution AS s"
            " WHERE s.job_execution_id = %s",
            (dead.execution.id,),
        ).fetchall()
    # The recovery ended the dead run's STARTED step through end_unfinished_steps.
    assert ended == [("FAILED", "STALE_RECOVERED", 1)]


def test_a_run_end_plans_its_statements_for_any_execution_after_the_upgrade(
    blank_database: str,
) -> None:
    install_up_to(blank_database, PLANS_ONCE - 1)
    before = end_plans(blank_database)
    migrator.migrate(plaintext_config(blank_database))
    after = end_plans(blank_database)
    # Both statements (the steps' lock, then their end with the partitions' release) are logged.
    assert len(before) == len(after) == 2
    assert all("job_execution_id = '-1'::bigint" in plan for plan in before)
    assert all("job_execution_id = $1" in plan for plan in after)
    assert not any("'-1'" in plan for plan in after)
