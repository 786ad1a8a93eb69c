"""Upgrading to one-statement transitions (migration 0014) under live jobs.

A run of the older package, launched and owned through its multi-statement operations, goes
on while the migration creates the functions: its next chunk commits and it ends COMPLETED as
the older package ended runs. Another run of the older package dies after a committed chunk;
the upgraded package launches its instance in one statement, waits for the dead run's lease,
recovers it (OWNER_LOST) and resumes its step from that chunk's checkpoint.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import _migrator as migrator
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import recover_across_upgrade
from tests.migrations.older_package import TRANSITIONS
from tests.migrations.test_lease_upgrade import install_up_to


def test_runs_of_the_older_package_finish_or_resume_across_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_up_to(blank_database, TRANSITIONS - 1)
    runs = recover_across_upgrade(plaintext_config(blank_database), TRANSITIONS, monkeypatch)
    dead, live, again = runs.dead, runs.live, runs.again
    assert runs.applied == list(range(TRANSITIONS, migrator.supported_schema_version() + 1))
    assert live.execution.status is BatchStatus.COMPLETED
    assert again.attempt == 2 and again.execution.status is BatchStatus.COMPLETED
    assert runs.resumed_from == [{"offset": 1}]
    with psycopg.connect(blank_database) as conn:
        decisions = conn.execute(
            "SELECT job_execution_id, reason_code FROM pybatch.recovery_decision"
        ).fetchall()
        live_step = conn.execute(
            "SELECT s.status, s.read_count FROM pybatch.step_execution AS s"
            " WHERE s.job_execution_id = %s",
            (live.execution.id,),
        ).fetchall()
    assert decisions == [(dead.execution.id, "OWNER_LOST")]
    assert live_step == [("COMPLETED", 2)]
