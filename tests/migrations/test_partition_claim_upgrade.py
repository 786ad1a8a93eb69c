"""Upgrading to cheaper partition claims (the open-step check reads one step; an index of
the claimable partitions) under a live partitioned step.

A partitioned step of the older package holds a claimed partition while the migration
replaces the check; its worker then ends that partition, claims and ends the rest, and the
job completes. The check still refuses what it refused: a step left open under a finished
execution, and an execution finished with a step still open.
"""

from __future__ import annotations

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import StepsUnfinished
from pybatch.etl import Job
from pybatch.values.names import NodeId, StepName
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import (
    migrate_to,
    migration_named,
    older_package,
    start_plan,
    work_off,
)

CLAIMS_READ_ONE_ROW = migration_named("claims_read_one_row")


def test_a_partitioned_step_live_across_the_upgrade_completes_and_the_check_still_refuses(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    with older_package(config, CLAIMS_READ_ONE_ROW - 1, monkeypatch) as old:
        plan = start_plan(old, "1", ["a", "b", "c"])
        migrate_to(config, CLAIMS_READ_ONE_ROW)
        worked = work_off(config, plan)
    assert worked == (["a", "b", "c"], BatchStatus.COMPLETED, [])
    parent = plan.parent

    with psycopg.connect(blank_database) as admin:
        # A step reopened under the completed execution is refused at COMMIT.
        admin.execute(
            "UPDATE pybatch.step_execution SET status = 'STARTED', ended_at = NULL WHERE id = %s",
            (parent.id,),
        )
        with pytest.raises(psycopg.errors.CheckViolation) as reopened:
            admin.commit()
        assert (
            reopened.value.diag.constraint_name == "step_execution_open_under_unfinished_execution"
        )
        # An execution finished with a step still open is refused at COMMIT; the run itself
        # cannot complete with it either, and ends FAILED (migration 0024).
        with (
            JobRepository.connect(config) as repository,
            pytest.raises(StepsUnfinished),
            Job(repository, "other", {}).launch() as other,
        ):
            with repository.begin() as uow:
                uow.flow.create_step(other.execution.id, StepName("open"), NodeId("open"))
                uow.commit()
            admin.execute(
                "UPDATE pybatch.job_execution SET status = 'FAILED', ended_at = updated_at,"
                " failure_category = 'USER_COMPONENT', failure_id = 1 WHERE id = %s",
                (other.execution.id,),
            )
            with pytest.raises(psycopg.errors.CheckViolation) as finished:
                admin.commit()
            assert finished.value.diag.constraint_name == "job_execution_finished_has_no_open_step"
