"""Upgrading to a run's end that completes only after its steps (migration 0024), under live jobs.

A run of the older package that died after a chunk, and one that goes on while the migration
replaces end_job_execution: the live one completes through the new function, and the upgraded
package recovers the dead one and resumes it from its chunk. A run launched before the upgrade
that asks to complete after it with a step left open is refused, and ends FAILED with it.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.errors import StepsUnfinished
from pybatch.etl import Job
from pybatch.values.names import NodeId, StepName
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import migration_named, recover_across_upgrade
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to

COMPLETES_AFTER_STEPS = migration_named("job_completes_after_its_steps")


def test_runs_of_the_older_package_complete_and_resume_across_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_up_to(blank_database, COMPLETES_AFTER_STEPS - 1)
    runs = recover_across_upgrade(
        plaintext_config(blank_database), COMPLETES_AFTER_STEPS, monkeypatch
    )
    assert runs.applied == list(
        range(COMPLETES_AFTER_STEPS, migrator.supported_schema_version() + 1)
    )
    assert runs.live.execution.status is BatchStatus.COMPLETED
    assert runs.again.attempt == 2 and runs.again.execution.status is BatchStatus.COMPLETED
    assert runs.resumed_from == [{"offset": 1}]


def test_a_run_launched_before_the_upgrade_cannot_complete_after_it_with_a_step_open(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, COMPLETES_AFTER_STEPS - 1)
    with (
        older_package(monkeypatch, COMPLETES_AFTER_STEPS - 1),
        JobRepository.connect(config) as old,
    ):
        with pytest.raises(StepsUnfinished), Job(old, "open", {}).launch() as run:
            with old.begin() as uow:
                uow.flow.create_step(run.execution.id, StepName("open"), NodeId("open"))
                uow.commit()
            assert migrator.migrate(config)[-1].version == migrator.supported_schema_version()
    with psycopg.connect(blank_database) as conn:
        ended = conn.execute(
            "SELECT e.status, s.status, s.failure_category FROM pybatch.job_execution AS e"
            " JOIN pybatch.step_execution AS s ON s.job_execution_id = e.id WHERE e.id = %s",
            (run.execution.id,),
        ).fetchall()
    assert ended == [("FAILED", "FAILED", "CANCELLED")]
