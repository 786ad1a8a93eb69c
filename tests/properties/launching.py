"""Committed executions for the property tests that write through the repository.

Each example uses a job name no other example uses, so examples never meet in the database.
"""

from __future__ import annotations

import itertools

from pybatch import JobRepository
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.owners import claim_test_owner

#: The failure recorded when a path ends FAILED.
FAILURE = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(1))
_runs = itertools.count(1)


def unique_key(prefix: str) -> JobInstanceKey:
    """A key of a job name no other example uses."""
    return JobInstanceKey(JobName(f"{prefix}.{next(_runs)}"), JobParameters.of({"run": 1}))


def launch(
    repository: JobRepository,
    clock: ManualClock,
    key: JobInstanceKey,
    path: tuple[BatchStatus, ...] = (BatchStatus.STARTED,),
    *,
    definition: DefinitionIdentity | None = None,
) -> JobExecution:
    """A committed execution of `key` moved along `path` from STARTING (FAILED with FAILURE)."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id, definition or DefinitionIdentity.LEGACY)
        execution = claim_test_owner(uow, execution, clock.advance())
        for target in path:
            transition = (
                LifecycleTransition.failed(clock.advance(), FAILURE)
                if target is BatchStatus.FAILED
                else LifecycleTransition.new(target, clock.advance())
            )
            execution = uow.executions.transition(execution.id, execution.version, transition)
        uow.commit()
    return execution
