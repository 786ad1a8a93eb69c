"""A run completes only when none of its steps is unfinished (migration 0024).

A step's end commits without waiting for its flush, so a server crash or a failover can lose
it while the run goes on; the run's end must then not record COMPLETED over a step that has no
end. The refusal changes nothing; the ETL API then ends the run FAILED, and a restart resumes.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import StepsUnfinished
from pybatch.etl import Job
from pybatch.values.names import NodeId, StepName
from pybatch.values.status import BatchStatus


def _open_step(repository: JobRepository, execution_id: int) -> int:
    """A step of the execution that was created and never ended, as after a lost end."""
    with repository.begin() as uow:
        step = uow.flow.create_step(execution_id, StepName("open"), NodeId("open"))
        uow.commit()
    return step.id


def _rows(admin: psycopg.Connection[Any], execution_id: int) -> list[Any]:
    """The execution's row and its steps' rows, whole."""
    return admin.execute(
        "SELECT to_jsonb(e), (SELECT jsonb_agg(to_jsonb(s) ORDER BY s.id)"
        " FROM pybatch.step_execution AS s WHERE s.job_execution_id = e.id)"
        " FROM pybatch.job_execution AS e WHERE e.id = %s",
        (execution_id,),
    ).fetchall()


def test_completing_a_run_with_an_unfinished_step_is_refused_and_changes_nothing(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    run = Job(repository, "guarded", {}).launch()
    assert run.owner is not None
    step_id = _open_step(repository, run.execution.id)
    before = _rows(admin, run.execution.id)

    with repository.begin() as uow, pytest.raises(StepsUnfinished) as refused:
        uow.executions.end(run.execution.id, run.owner, BatchStatus.COMPLETED)
    assert (refused.value.id, refused.value.step_execution_id) == (run.execution.id, step_id)
    assert refused.value.status == "STARTING"
    assert str(refused.value) == (
        f"job execution {run.execution.id} cannot complete while its step execution {step_id}"
        " is STARTING"
    )
    assert _rows(admin, run.execution.id) == before

    # Ending it FAILED (or STOPPED) still ends its unfinished steps with it.
    with repository.begin() as uow:
        ended = uow.executions.end(run.execution.id, run.owner, BatchStatus.FAILED)
        uow.commit()
    assert ended.status is BatchStatus.FAILED
    assert admin.execute(
        "SELECT status, failure_category FROM pybatch.step_execution WHERE id = %s", (step_id,)
    ).fetchall() == [("FAILED", "CANCELLED")]


def test_a_run_left_with_an_unfinished_step_ends_failed_raises_and_restarts(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    with pytest.raises(StepsUnfinished), Job(repository, "left_open", {}).launch() as run:
        step_id = _open_step(repository, run.execution.id)

    assert run.execution.status is BatchStatus.FAILED
    assert admin.execute(
        "SELECT e.status, e.failure_error_class, s.status FROM pybatch.job_execution AS e"
        " JOIN pybatch.step_execution AS s ON s.job_execution_id = e.id WHERE s.id = %s",
        (step_id,),
    ).fetchall() == [("FAILED", "pybatch.errors.StepsUnfinished", "FAILED")]

    with Job(repository, "left_open", {}).launch() as again:
        outcome = again.step("open", lambda step: None)
    assert again.attempt == 2 and again.execution.status is BatchStatus.COMPLETED
    assert outcome.step.status is BatchStatus.COMPLETED
