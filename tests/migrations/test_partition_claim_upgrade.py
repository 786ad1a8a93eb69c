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

import pybatch._job_repository as repository_module
from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch import _partitioned as partitioned
from pybatch.etl import ETL_STATE_SCHEMA, Job
from pybatch.values.flow import StartLimit
from pybatch.values.names import NodeId, StepName
from pybatch.values.ownership import ExecutionLease
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.test_lease_upgrade import install_up_to

S = BatchStatus
#: The migration that replaces the check (looked up by name: its number follows the others').
CLAIMS_READ_ONE_ROW = next(
    m.version for m in migrator.shipped_migrations() if m.name == "claims_read_one_row"
)


def test_a_partitioned_step_live_across_the_upgrade_completes_and_the_check_still_refuses(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, CLAIMS_READ_ONE_ROW - 1)
    with monkeypatch.context() as old_package:
        old_package.setattr(
            repository_module, "supported_schema_version", lambda: CLAIMS_READ_ONE_ROW - 1
        )
        old = JobRepository.connect(config)
    with old:
        run = Job(old, "fanout", {"day": "1"}).launch()
        entries = partitioned.plan_entries(["a", "b", "c"], ETL_STATE_SCHEMA)
        _, parent = partitioned.start_partitioned_step(
            old, run.instance.id, run.execution.id, "load", entries, StartLimit.unrestricted()
        )
        lease = ExecutionLease()
        claimed = old.run_in_unit_of_work(lambda uow: partitioned._claim_in(uow, parent, lease))
        assert claimed is not None
        assert migrator.migrate(config)[0].version == CLAIMS_READ_ONE_ROW
        with JobRepository.connect(config) as repository:
            ended: list[str] = []
            while claimed is not None:
                partition, worker, _ = claimed
                ended.append(partition.key.value)
                claimed = partitioned._end_worker(
                    repository,
                    partition,
                    worker.id,
                    S.COMPLETED,
                    (parent, lease),
                )
            aggregated, unfinished = partitioned.aggregate_plan(repository, parent)
        with run:
            pass
    assert (ended, aggregated.status, unfinished) == (["a", "b", "c"], S.COMPLETED, [])

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
        # An execution finished with a step still open is refused at COMMIT.
        with (
            JobRepository.connect(config) as repository,
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
