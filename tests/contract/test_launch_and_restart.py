"""Instances and executions, launch and restart (C1-C12)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch.errors import (
    AbandonedInstance,
    CompletedInstance,
    ExecutionAlreadyActive,
    JobExecutionNotFound,
    JobInstanceNotFound,
)
from pybatch.values.counts import ExecutionCounts
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import DefinitionRevision, ExitCode, JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import Created, Existing, JobExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock

S = BatchStatus
FAILURE = FailureSummary(FailureCategory.TRANSIENT_INFRASTRUCTURE, FailureId(9))
PATHS: dict[BatchStatus, tuple[BatchStatus, ...]] = {
    S.STARTING: (),
    S.STARTED: (S.STARTED,),
    S.STOPPING: (S.STOPPING,),
    S.STOPPED: (S.STARTED, S.STOPPED),
    S.FAILED: (S.FAILED,),
    S.COMPLETED: (S.STARTED, S.COMPLETED),
    S.ABANDONED: (S.FAILED, S.ABANDONED),
    S.UNKNOWN: (S.UNKNOWN,),
}
_runs = itertools.count(1)


def new_key(job: str = "ledger") -> JobInstanceKey:
    return JobInstanceKey(JobName(job), JobParameters.of({"run": next(_runs), "region": "eu"}))


def drive(uow: UnitOfWork, clock: ManualClock, execution: JobExecution, status: S) -> JobExecution:
    for target in PATHS[status]:
        at = clock.advance()
        t = (
            LifecycleTransition.failed(at, FAILURE)
            if target is S.FAILED
            else LifecycleTransition.new(target, at)
        )
        execution = uow.executions.transition(execution.id, execution.version, t)
    assert execution.status is status
    return execution


def launched(
    repository: JobRepository, clock: ManualClock, status: S, key: JobInstanceKey | None = None
) -> JobExecution:
    """A committed first attempt of a new instance, driven to `status`."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key or new_key()).instance
        execution = drive(uow, clock, uow.executions.create(instance.id), status)
        uow.commit()
    return execution


def definition_rows(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM pybatch.job_definition").fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------- C1, C2


def test_select_or_create_twice_in_one_unit_of_work_creates_then_finds_the_instance(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C1."""
    key = new_key()
    with repository.begin() as uow:
        first = uow.instances.select_or_create(key)
        clock.advance()
        second = uow.instances.select_or_create(key)
        uow.commit()
    assert isinstance(first, Created)
    assert isinstance(second, Existing)
    assert second.instance == first.instance
    assert first.instance.key == key
    assert first.instance.created_at == clock.now() - timedelta(seconds=1)


def test_committed_instance_is_existing_and_findable(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C2."""
    key = new_key()
    with repository.begin() as uow:
        created = uow.instances.select_or_create(key).instance
        uow.commit()
    with repository.begin() as uow:
        selection = uow.instances.select_or_create(key)
        assert isinstance(selection, Existing)
        assert selection.instance == created
        assert uow.instances.find(key) == created
        assert uow.instances.get(created.id) == created
        assert uow.instances.find(new_key()) is None
        assert uow.instances.find(JobInstanceKey(JobName("other_job"), key.parameters)) is None
        assert uow.instances.get(created.id + 1000) is None


# --------------------------------------------------------------------------- C3, C4


def test_launch_of_an_unknown_instance_is_not_found_and_writes_nothing(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario C3."""
    definitions = definition_rows(admin)
    with repository.begin() as uow:
        with pytest.raises(JobInstanceNotFound) as missing:
            uow.executions.create(424242)
        assert missing.value.id == 424242
        with pytest.raises(JobInstanceNotFound) as missing_too:
            uow.executions.create(424243, DefinitionIdentity.LEGACY)
        assert missing_too.value.id == 424243
        uow.commit()
    row = admin.execute("SELECT count(*) FROM pybatch.job_execution").fetchone()
    assert row == (0,)
    assert definition_rows(admin) == definitions


def test_first_attempt_starts_clean(repository: JobRepository, clock: ManualClock) -> None:
    """Scenario C4."""
    clock.set(datetime(2026, 3, 4, 5, 6, 7, 654321, tzinfo=UTC))
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        execution = uow.executions.create(instance.id)
        uow.commit()
    with repository.begin() as uow:
        [stored] = uow.executions.of_instance(instance.id)
    for record in (execution, stored):
        assert record.job_instance_id == instance.id
        assert record.attempt == 1
        assert record.status is S.STARTING
        assert record.metadata.exit_status == ExitCode("UNKNOWN")
        assert record.version == 0
        assert record.created_at == datetime(2026, 3, 4, 5, 6, 7, 654321, tzinfo=UTC)
        assert record.updated_at == record.created_at
        assert record.metadata.timestamps.started_at is None
        assert record.metadata.timestamps.ended_at is None
        assert record.metadata.counts == ExecutionCounts()
        assert record.metadata.failure is None
        assert record.restart_of_execution_id is None
        assert record.upgrade_from_definition_id is None
    assert stored == execution


# --------------------------------------------------------------------------- C5 - C8


def test_launch_while_unresolved_is_refused(repository: JobRepository, clock: ManualClock) -> None:
    """Scenario C5."""
    for status in (S.STARTING, S.STARTED, S.STOPPING, S.UNKNOWN):
        latest = launched(repository, clock, status)
        with repository.begin() as uow:
            with pytest.raises(ExecutionAlreadyActive) as active:
                uow.executions.create(latest.job_instance_id)
            assert (active.value.instance_id, active.value.execution_id, active.value.status) == (
                latest.job_instance_id,
                latest.id,
                status.value,
            )
            uow.commit()
        with repository.begin() as uow:
            assert uow.executions.of_instance(latest.job_instance_id) == [latest]


def test_restart_after_failed_or_stopped_creates_the_next_attempt(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C6."""
    for status in (S.FAILED, S.STOPPED):
        first = launched(repository, clock, status)
        clock.advance()
        with repository.begin() as uow:
            second = uow.executions.create(first.job_instance_id)
            uow.commit()
        assert second.id != first.id
        assert second.attempt == 2
        assert second.status is S.STARTING and second.version == 0
        assert second.restart_of_execution_id == first.id
        assert second.created_at == clock.now()
        assert second.metadata.failure is None
        assert second.metadata.exit_status == ExitCode("UNKNOWN")
        with repository.begin() as uow:
            executions = uow.executions.of_instance(first.job_instance_id)
        assert [e.id for e in executions] == [first.id, second.id]
        assert executions[0] == first


def test_restart_after_completed_or_abandoned_is_refused(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C7."""
    completed = launched(repository, clock, S.COMPLETED)
    abandoned = launched(repository, clock, S.ABANDONED)
    with repository.begin() as uow:
        with pytest.raises(CompletedInstance) as done:
            uow.executions.create(completed.job_instance_id)
        assert done.value.id == completed.job_instance_id
        with pytest.raises(AbandonedInstance) as gone:
            uow.executions.create(abandoned.job_instance_id)
        assert gone.value.id == abandoned.job_instance_id
        uow.commit()
    with repository.begin() as uow:
        assert uow.executions.of_instance(completed.job_instance_id) == [completed]
        assert uow.executions.of_instance(abandoned.job_instance_id) == [abandoned]


def test_restart_leaves_the_prior_attempt_untouched(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C8."""
    first = launched(repository, clock, S.STARTED)
    with repository.begin() as uow:
        uow.steps.create(first.id, StepName("load"))
        failed = LifecycleTransition.failed(clock.advance(), FAILURE)
        first = uow.executions.transition(first.id, first.version, failed)  # and its step
        steps = uow.steps.of_execution(first.id)
        uow.commit()
    assert [step.status for step in steps] == [S.FAILED]
    clock.advance(timedelta(hours=3))
    with repository.begin() as uow:
        uow.executions.create(first.job_instance_id)
        uow.commit()
    with repository.begin() as uow:
        assert uow.executions.get(first.id) == first
        assert uow.steps.of_execution(first.id) == steps


# --------------------------------------------------------------------------- C9 - C11


def test_job_executions_are_listed_in_attempt_order(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C9."""
    first = launched(repository, clock, S.FAILED)
    attempts = [first]
    for final in (S.STOPPED, S.FAILED, S.STARTED):
        with repository.begin() as uow:
            attempts.append(drive(uow, clock, uow.executions.create(first.job_instance_id), final))
            uow.commit()
    with repository.begin() as uow:
        listed = uow.executions.of_instance(first.job_instance_id)
        assert listed == attempts
        assert [e.attempt for e in listed] == [1, 2, 3, 4]
        assert [e.restart_of_execution_id for e in listed] == [None, *[e.id for e in attempts[:3]]]
        with pytest.raises(JobInstanceNotFound) as missing:
            uow.executions.of_instance(first.job_instance_id + 1000)
        assert missing.value.id == first.job_instance_id + 1000


def test_step_executions_are_listed_in_creation_order(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario C10."""
    execution = launched(repository, clock, S.STARTED)
    names = ["zeta", "alpha", "mid", "beta"]  # creation order differs from name order
    with repository.begin() as uow:
        created = []
        for name in names:
            clock.advance()
            created.append(uow.steps.create(execution.id, StepName(name)))
        uow.commit()
    with repository.begin() as uow:
        listed = uow.steps.of_execution(execution.id)
        assert listed == created
        assert [s.step_name.value for s in listed] == names
        assert uow.steps.of_execution(launched_empty(uow)) == []
        with pytest.raises(JobExecutionNotFound) as missing:
            uow.steps.of_execution(execution.id + 1000)
        assert missing.value.id == execution.id + 1000


def launched_empty(uow: UnitOfWork) -> int:
    return uow.executions.create(uow.instances.select_or_create(new_key()).instance.id).id


def test_reads_of_unknown_ids_return_none(repository: JobRepository, clock: ManualClock) -> None:
    """Scenario C11."""
    execution = launched(repository, clock, S.STARTED)
    with repository.begin() as uow:
        step = uow.steps.create(execution.id, StepName("only"))
        assert uow.executions.get(execution.id + 1000) is None
        assert uow.steps.get(step.id + 1000) is None
        assert uow.executions.get(execution.id) == execution
        assert uow.steps.get(step.id) == step


# --------------------------------------------------------------------------- C12


def definition(revision: str, steps: list[str]) -> DefinitionIdentity:
    return DefinitionIdentity.from_manifest(
        None, DefinitionRevision(revision), {"format": 1, "steps": steps}
    )


def test_completed_instance_with_drifting_definition_reports_completed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario C12."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        first = uow.executions.create(instance.id, definition("r1", ["a"]))
        drive(uow, clock, first, S.COMPLETED)
        uow.commit()
    rows = definition_rows(admin)
    drifting = definition("r1", ["a", "b"])  # same revision, different manifest digest
    also_new = definition("r9", ["z"])  # a revision that would otherwise be registered
    with repository.begin() as uow:
        for candidate in (drifting, also_new):
            with pytest.raises(CompletedInstance) as done:
                uow.executions.create(instance.id, candidate)
            assert done.value.id == instance.id
        uow.commit()
    assert definition_rows(admin) == rows
