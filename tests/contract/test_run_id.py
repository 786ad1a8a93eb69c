"""Running a finished business date again on purpose: `Job(run_id=N)` (docs/etl-guide.md).

A COMPLETED instance never runs again, and the refusal names `run_id`; a new run id is a new
instance of the same key (identifying parameter `run.id`), run from scratch, with the earlier
runs left as they were.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import CompletedInstance, DuplicateParameter, RunIdInvalid
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import DAY, executions, steps_of


def counting(runs: list[int]) -> Any:
    def work(step: StepRun) -> None:
        runs.append(step.run.instance.id)
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"done": True})

    return work


def test_a_completed_business_date_runs_again_only_with_a_new_run_id(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    runs: list[int] = []
    with Job(repository, "load_orders", DAY).launch() as first:
        first.step("load", counting(runs))
    with pytest.raises(CompletedInstance, match=r"run_id=N"):
        Job(repository, "load_orders", DAY).launch()

    with Job(repository, "load_orders", DAY, run_id=2).launch() as second:
        second.step("load", counting(runs))  # a new instance: the step runs from scratch
    assert second.instance.id != first.instance.id
    assert second.attempt == 1
    assert steps_of(repository, second.execution.id)["load"].metadata.counts.written == 1
    with pytest.raises(CompletedInstance, match=r"run_id=N"):
        Job(repository, "load_orders", DAY, run_id=2).launch()
    assert runs == [first.instance.id, second.instance.id]
    assert [e.status for e in executions(repository, first)] == [BatchStatus.COMPLETED]
    row = admin.execute(
        "SELECT count(*) FROM pybatch.job_instance WHERE job_name = 'load_orders'"
    ).fetchone()
    assert row == (2,)


@pytest.mark.parametrize("bad", [0, -1, True, 2**63, "2"])
def test_a_run_id_that_is_not_a_positive_whole_number_is_refused(
    repository: JobRepository, bad: Any
) -> None:
    with pytest.raises(RunIdInvalid, match="run_id"):
        Job(repository, "load_orders", DAY, run_id=bad)


def test_a_run_id_next_to_a_run_id_parameter_is_refused(repository: JobRepository) -> None:
    with pytest.raises(DuplicateParameter):
        Job(repository, "load_orders", {**DAY, "run.id": 1}, run_id=2)
