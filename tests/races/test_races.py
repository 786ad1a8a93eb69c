"""Races on real concurrent connections.

Threads are released together by a barrier and each opens its own unit of work; every
thread race repeats a few times. One race runs in separate processes, each with its own
JobRepository, to show the arbitration is in the database and not in a Python lock.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository, UnitOfWork
from pybatch.errors import DuplicateStep, ExecutionAlreadyActive, StaleVersion
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import Created, JobExecution, JobInstanceSelection, StepExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.race import (
    launch_in_process,
    portable,
    race_processes,
    race_units_of_work,
    run_job_in_process,
)
from tests.support.statements import create_step

pytestmark = pytest.mark.race

S = BatchStatus
ITERATIONS = 5
FAILURE = FailureSummary(FailureCategory.TRANSIENT_INFRASTRUCTURE, FailureId(1))
_runs = itertools.count(1)


def new_key(job: str = "race") -> JobInstanceKey:
    return JobInstanceKey(JobName(job), JobParameters.of({"run": next(_runs)}))


def scalar(admin: psycopg.Connection[Any], sql: str, *params: object) -> Any:
    row = admin.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def test_eight_concurrent_launches_of_one_key_give_one_execution(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L3."""
    racers = 8
    assert repository.config.pool_size < racers  # some racers wait for a connection
    for _ in range(ITERATIONS):
        key = new_key()

        def launch(
            uow: UnitOfWork, index: int, key: JobInstanceKey = key
        ) -> tuple[JobInstanceSelection, JobExecution]:
            selection = uow.instances.select_or_create(key)
            return selection, uow.executions.create(selection.instance.id)

        outcomes = race_units_of_work(repository, racers, launch)
        winners = [o.value for o in outcomes if o.ok and o.value is not None]
        losers = [o.error for o in outcomes if not o.ok]
        assert len(winners) == 1, [o.error for o in outcomes]
        [(selection, execution)] = winners
        assert isinstance(selection, Created)  # the creator's launch is the one that commits first
        assert len(losers) == racers - 1
        for error in losers:
            assert isinstance(error, ExecutionAlreadyActive), repr(error)
            assert (error.instance_id, error.execution_id, error.status) == (
                selection.instance.id,
                execution.id,
                "STARTING",
            )
        with repository.begin() as uow:
            found = uow.instances.find(key)
            assert found == selection.instance
            assert uow.executions.of_instance(found.id) == [execution]
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_instance") == ITERATIONS
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_execution") == ITERATIONS


def failed_instance(repository: JobRepository, clock: ManualClock) -> JobExecution:
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.failed(clock.advance(), FAILURE)
        )
        uow.commit()
    return execution


def test_two_concurrent_restarts_of_a_failed_instance_give_one_new_attempt(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario L1."""
    for _ in range(ITERATIONS):
        failed = failed_instance(repository, clock)
        instance_id = failed.job_instance_id

        def restart(uow: UnitOfWork, index: int, instance_id: int = instance_id) -> JobExecution:
            return uow.executions.create(instance_id)

        outcomes = race_units_of_work(repository, 2, restart)
        [winner] = [o.value for o in outcomes if o.ok]
        [loser] = [o.error for o in outcomes if not o.ok]
        assert winner is not None and winner.attempt == 2
        assert winner.restart_of_execution_id == failed.id
        assert isinstance(loser, ExecutionAlreadyActive), repr(loser)
        assert (loser.execution_id, loser.status) == (winner.id, "STARTING")
        with repository.begin() as uow:
            executions = uow.executions.of_instance(failed.job_instance_id)
        assert [(e.attempt, e.status) for e in executions] == [(1, S.FAILED), (2, S.STARTING)]


def started_pair(
    repository: JobRepository, clock: ManualClock
) -> tuple[JobExecution, StepExecution]:
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        at = clock.advance()
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(S.STARTED, at)
        )
        step = create_step(uow, execution.id, StepName("work"))
        step = uow.steps.transition(step.id, 0, LifecycleTransition.new(S.STARTED, at))
        uow.commit()
    return execution, step


def test_two_transitions_on_the_same_version_have_one_winner(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario L2."""
    targets = (
        LifecycleTransition.new(S.COMPLETED, clock.now().replace(year=2030)),
        LifecycleTransition.failed(clock.now().replace(year=2030), FAILURE),
    )
    for _ in range(ITERATIONS):
        execution, step = started_pair(repository, clock)
        # The step first: a finished execution ends its unfinished steps with it.
        for kind, record in (("step", step), ("job", execution)):
            expected = record.version

            def move(
                uow: UnitOfWork,
                index: int,
                kind: str = kind,
                record_id: int = record.id,
                expected: int = expected,
            ) -> Any:
                if kind == "job":
                    return uow.executions.transition(record_id, expected, targets[index])
                return uow.steps.transition(record_id, expected, targets[index])

            outcomes = race_units_of_work(repository, 2, move)
            [winner] = [o for o in outcomes if o.ok]
            [loser] = [o.error for o in outcomes if not o.ok]
            assert isinstance(loser, StaleVersion), repr(loser)
            assert (loser.expected, loser.actual) == (expected, expected + 1)
            with repository.begin() as uow:
                stored = (
                    uow.executions.get(record.id) if kind == "job" else uow.steps.get(record.id)
                )
            assert stored is not None
            assert stored.version == expected + 1
            assert stored.status is targets[winner.index].target
            assert stored == winner.value


def test_two_concurrent_steps_with_one_name_give_one_step(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario L3."""
    for _ in range(ITERATIONS):
        execution, _step = started_pair(repository, clock)

        def twin(uow: UnitOfWork, index: int, execution_id: int = execution.id) -> StepExecution:
            return create_step(uow, execution_id, StepName("twin"))

        outcomes = race_units_of_work(repository, 2, twin)
        [winner] = [o.value for o in outcomes if o.ok]
        [loser] = [o.error for o in outcomes if not o.ok]
        assert isinstance(loser, DuplicateStep), repr(loser)
        assert (loser.job_execution_id, loser.step_name) == (execution.id, "twin")
        with repository.begin() as uow:
            assert [s.step_name.value for s in uow.steps.of_execution(execution.id)] == [
                "work",
                "twin",
            ]
            assert uow.steps.of_execution(execution.id)[1] == winner


def test_four_processes_launching_one_key_give_one_execution(
    pg_config: ConnectionConfig, repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L3."""
    processes = 4
    results = race_processes(
        processes, launch_in_process, [portable(pg_config), "process_race", "2026-09-09"]
    )
    pairs = cast(list[tuple[str, object]], results)
    launched = [value for status, value in pairs if status == "launched"]
    refused = [value for status, value in pairs if status == "error"]
    assert len(launched) == 1, results
    assert refused == ["ExecutionAlreadyActive"] * (processes - 1), results
    key = JobInstanceKey(JobName("process_race"), JobParameters.of({"day": "2026-09-09"}))
    with repository.begin() as uow:
        instance = uow.instances.find(key)
        assert instance is not None
        assert [e.id for e in uow.executions.of_instance(instance.id)] == launched
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_execution") == 1


def test_processes_launching_one_job_through_the_etl_api_start_one_run(
    pg_config: ConnectionConfig, repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L3, as scripts launch: one winner; every loser sees its lease renewed."""
    processes = 4
    arguments = [portable(pg_config), "etl_process_race", "2026-09-10", 1.0]
    results = race_processes(processes, run_job_in_process, arguments)
    pairs = cast(list[tuple[str, object]], results)
    launched = [value for status, value in pairs if status == "launched"]
    refused = [value for status, value in pairs if status == "error"]
    assert len(launched) == 1, results
    assert refused == ["ExecutionAlreadyActive"] * (processes - 1), results
    rows = admin.execute(
        "SELECT e.id, e.attempt, e.status FROM pybatch.job_execution AS e"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
        " WHERE i.job_name = 'etl_process_race'"
    ).fetchall()
    assert rows == [(launched[0], 1, "COMPLETED")]
