"""Upgrading to a run's end on generic plans (migration 0022) under live jobs.

A run of the older package commits a chunk and dies with its step STARTED; another goes on
while the migration changes end_unfinished_steps, commits its next chunk and completes. The
upgraded package then recovers the dead run, which ends its step through end_unfinished_steps,
and resumes from the committed chunk. Before the migration the function planned its statements
for the execution at hand (the id folded into the plan, planned again at every call once the
plan cache preferred those plans); after it, every call runs the generic plan.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import _migrator as migrator
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import migration_named, recover_across_upgrade
from tests.migrations.test_lease_upgrade import install_up_to
from tests.support.plans import log_nested_plans

PLANS_ONCE = migration_named("end_unfinished_steps_plans_once")
_END = "SELECT pybatch.end_unfinished_steps(-1, 'FAILED', 'USER_COMPONENT', now())"


def end_plans(dsn: str) -> list[str]:
    """The plans auto_explain logs for the statements of a session's first run end."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        logged = log_nested_plans(conn)
        conn.execute(_END)
    return [plan for plan in logged if "pybatch.step_execution" in plan]


def test_a_dead_run_of_the_older_package_is_recovered_and_resumed_after_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_up_to(blank_database, PLANS_ONCE - 1)
    runs = recover_across_upgrade(plaintext_config(blank_database), PLANS_ONCE, monkeypatch)
    dead, live, again = runs.dead, runs.live, runs.again
    assert runs.applied == list(range(PLANS_ONCE, migrator.supported_schema_version() + 1))
    assert live.execution.status is BatchStatus.COMPLETED
    assert again.attempt == 2 and again.execution.status is BatchStatus.COMPLETED
    assert runs.resumed_from == [{"offset": 1}]
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
