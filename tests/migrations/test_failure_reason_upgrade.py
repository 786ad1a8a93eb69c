"""Upgrading to failure reasons (migration 0009) under a live job.

A run of the older package keeps going while the migration adds the columns: its next chunk
commits and its step fails as before, recording no reason (that package does not know the
columns). The upgraded package then restarts it from that chunk's checkpoint, and its failure
is recorded with its reason; rows written before the upgrade have none and still read.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch._explorer import JobExplorer
from pybatch.etl import Job, StepRun
from tests.conftest import plaintext_config
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to

#: The migration that adds the failure reason columns.
REASONS = 9


def test_a_job_live_across_the_upgrade_records_why_its_step_failed(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, REASONS - 1)
    applied: list[int] = []

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        applied.extend(m.version for m in migrator.migrate(config))  # while the run is live
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 2})
        raise KeyError("order 42")

    with older_package(monkeypatch, REASONS - 1), JobRepository.connect(config) as old:
        done = Job(old, "before_upgrade", {}).launch()
        with done:
            done.step("load", lambda step: None)
        with pytest.raises(KeyError), Job(old, "live", {}).launch() as live:
            live.step("load", work)
    resumed_from: list[object] = []

    def fail_again(step: StepRun) -> None:
        resumed_from.append(step.checkpoint)
        raise KeyError("order 42")

    with JobRepository.connect(config) as repository:
        with pytest.raises(KeyError), Job(repository, "live", {}).launch() as restarted:
            restarted.step("load", fail_again)
        explorer = JobExplorer(repository)
        before = explorer.failure_reasons(live.execution.id)
        reasons = explorer.failure_reasons(restarted.execution.id)
        untouched = explorer.failure_reasons(done.execution.id)
    # 0010 validates what 0009 added; later migrations follow it
    assert applied == list(range(REASONS, migrator.supported_schema_version() + 1))
    assert live.execution.status.value == "FAILED"
    assert resumed_from == [{"offset": 2}]  # the chunk committed after the upgrade is kept
    assert before == {} and untouched == {}
    assert sorted(str(r) for r in reasons.values()) == ["KeyError: 'order 42'"] * 2
    assert None in reasons  # the execution's own reason, and its step's
    with psycopg.connect(blank_database) as conn:
        invalid = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conname LIKE '%failure_%' "
            "AND NOT convalidated"
        ).fetchone()
    assert invalid == (0,)
