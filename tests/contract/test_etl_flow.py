"""The ETL decision point: a job records where its flow goes after each
node, and a restart reuses the decisions already recorded instead of deciding again.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import FlowEndedInFailure, FlowStateCorrupt
from pybatch.etl import Job, JobRun, StepRun
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import FlowTarget, FlowTransitionKind, TerminalKind
from pybatch.values.names import DefinitionRevision, JobName, NodeId

K = FlowTransitionKind
MANIFEST = {
    "format": 2,
    "nodes": [
        {"id": "extract", "kind": "step"},
        {"id": "route", "kind": "decision"},
        {"id": "load", "kind": "step"},
        {"id": "skip", "kind": "step"},
    ],
    "transitions": [
        {"source": "extract", "pattern": "COMPLETED", "to": "route"},
        {"source": "route", "pattern": "FULL", "to": "load"},
        {"source": "route", "pattern": "EMPTY", "to": "skip"},
        {"source": "route", "pattern": "*", "end": "fail"},
        {"source": "load", "pattern": "*", "end": "complete"},
        {"source": "skip", "pattern": "*", "end": "stop"},
    ],
}
DEFINITION = DefinitionIdentity.from_manifest(
    JobName("flow_job"), DefinitionRevision("r1"), MANIFEST
)


def flow_job(repository: JobRepository, run: str) -> Job:
    return Job(repository, "flow_job", {"run": run}, definition=DEFINITION)


def test_flow_runs_to_its_terminal_state_recording_each_decision(
    repository: JobRepository,
) -> None:
    ran: list[str] = []

    def step(step_run: StepRun) -> None:
        ran.append(step_run.name)

    with flow_job(repository, "a").launch() as run:
        end = run.run_flow(
            "extract", {"extract": step, "load": step, "skip": step}, {"route": lambda r: "FULL"}
        )
    assert end is TerminalKind.COMPLETE and ran == ["extract", "load"]
    with repository.begin() as uow:
        decisions = uow.flow.decisions(run.execution.id)
    assert [(d.sequence, d.source_node_id.value, d.kind) for d in decisions] == [
        (1, "extract", K.STEP_EXIT),
        (2, "route", K.DECIDER),
        (3, "load", K.STEP_EXIT),
    ]
    assert decisions[1].target == FlowTarget.to_node("load")
    assert decisions[2].target == FlowTarget.end(TerminalKind.COMPLETE)
    assert run.execution.status.value == "COMPLETED"


def test_restart_reuses_recorded_decisions_and_does_not_decide_again(
    repository: JobRepository,
) -> None:
    decided: list[int] = []
    attempts = {"load": 0}

    def route(run: JobRun) -> str:
        decided.append(run.attempt)
        return "FULL"

    def load(step_run: StepRun) -> None:
        attempts["load"] += 1
        if attempts["load"] == 1:
            raise RuntimeError("target database down")

    steps = {"extract": lambda s: None, "load": load, "skip": lambda s: None}
    with pytest.raises(RuntimeError), flow_job(repository, "b").launch() as first:
        first.run_flow("extract", steps, {"route": route})
    with flow_job(repository, "b").launch() as second:
        assert second.run_flow("extract", steps, {"route": route}) is TerminalKind.COMPLETE
    assert decided == [1]  # the decider ran once; attempt 2 reused its decision
    with repository.begin() as uow:
        first_decisions = uow.flow.decisions(first.execution.id)
        again = uow.flow.decisions(second.execution.id)
    assert [(d.source_node_id.value, d.kind) for d in again] == [
        ("extract", K.COMPLETED_STEP_REUSE),
        ("route", K.DECIDER),
        ("load", K.STEP_EXIT),
    ]
    assert again[0].reused_decision_id == first_decisions[0].id
    assert again[1].reused_decision_id == first_decisions[1].id
    assert [d.target for d in again[:2]] == [d.target for d in first_decisions]


def test_fail_terminal_ends_the_run_failed(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    with pytest.raises(FlowEndedInFailure), flow_job(repository, "c").launch() as run:
        run.run_flow("extract", {"extract": lambda s: None}, {"route": lambda r: "ODD"})
    assert run.execution.status.value == "FAILED"
    with repository.begin() as uow:
        decisions = uow.flow.decisions(run.execution.id)
    assert decisions[-1].target == FlowTarget.end(TerminalKind.FAIL)


def test_legacy_definition_has_no_flow(repository: JobRepository) -> None:
    with pytest.raises(FlowStateCorrupt), Job(repository, "plain", {"r": 1}).launch() as run:
        run.next_after(run.step("extract", lambda s: None))


def test_decision_is_recorded_once_per_node_when_asked_twice(repository: JobRepository) -> None:
    with flow_job(repository, "d").launch() as run:
        outcome = run.step("extract", lambda s: None)
        assert run.next_after(outcome) == run.next_after(outcome) == FlowTarget.to_node("route")
        with repository.begin() as uow:
            assert len(uow.flow.decisions(run.execution.id)) == 1
        assert run.decide("route", lambda r: "EMPTY") == FlowTarget.to_node("skip")
        assert NodeId("route") in {d.source_node_id for d in uow_decisions(repository, run)}


def uow_decisions(repository: JobRepository, run: JobRun) -> list[Any]:
    with repository.begin() as uow:
        return list(uow.flow.decisions(run.execution.id))
