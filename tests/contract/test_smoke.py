from __future__ import annotations

from datetime import timedelta

from pybatch import JobRepository
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import Created, Existing
from pybatch.values.status import BatchStatus
from tests.support.clock import ManualClock
from tests.support.statements import create_step


def test_launch_step_complete(repository: JobRepository, clock: ManualClock) -> None:
    key = JobInstanceKey(JobName("load_orders"), JobParameters.of({"day": "2026-11-30"}))
    with repository.begin() as uow:
        selection = uow.instances.select_or_create(key)
        assert isinstance(selection, Created)
        execution = uow.executions.create(selection.instance.id)
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(BatchStatus.STARTED, clock.advance())
        )
        step = create_step(uow, execution.id, StepName("extract"))
        step = uow.steps.transition(
            step.id, 0, LifecycleTransition.new(BatchStatus.STARTED, clock.advance())
        )
        uow.commit()
    with repository.begin() as uow:
        assert isinstance(uow.instances.select_or_create(key), Existing)
        [stored] = uow.executions.of_instance(selection.instance.id)
        assert stored.status is BatchStatus.STARTED and stored.version == 1
        [stored_step] = uow.steps.of_execution(execution.id)
        assert stored_step == step
        clock.advance(timedelta(seconds=5))
