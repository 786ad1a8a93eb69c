"""Flow decisions (E8-E18, E22).

What a flow relies on: a decision is recorded only when the job's own manifest leads from
the source node to the target on the observed outcome, positions are contiguous and each node
decides once per execution, and a restart finds the decision it may reuse.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any, Protocol

import attrs
import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import (
    ConcurrentModification,
    FlowStateCorrupt,
    JobExecutionNotFound,
    JobInstanceNotFound,
    ZeroStartLimit,
)
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import (
    FlowDecision,
    FlowDecisionRequest,
    FlowTarget,
    FlowTransitionKind,
    StartLimit,
    TerminalKind,
    decision_matches_manifest,
    exit_pattern_matches,
)
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import DefinitionRevision, ExitCode, JobName, NodeId, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.race import race_units_of_work

S = BatchStatus
K = FlowTransitionKind
INPUT = bytes(range(32))
OTHER_INPUT = bytes(range(1, 33))
MANIFEST = {
    "format": 2,
    "nodes": [
        {"id": "extract", "kind": "step"},
        {"id": "check", "kind": "decision"},
        {"id": "load", "kind": "partitioned_step"},
        {"id": "merge", "kind": "join"},
    ],
    "transitions": [
        {"source": "extract", "pattern": "COMPLETED", "to": "check"},
        {"source": "extract", "pattern": "*", "end": "fail"},
        {"source": "check", "pattern": "LOAD_?", "to": "load"},
        {"source": "check", "pattern": "*", "end": "complete"},
        {"source": "load", "pattern": "*", "end": "complete"},
        {"source": "merge", "pattern": "*", "end": "stop"},
    ],
}
DEFINITION = DefinitionIdentity.from_manifest(JobName("flows"), DefinitionRevision("r1"), MANIFEST)
_keys = itertools.count(1)


def new_key() -> JobInstanceKey:
    return JobInstanceKey(JobName("flows"), JobParameters.of({"run": next(_keys)}))


def launch(
    repository: JobRepository,
    clock: ManualClock,
    instance_id: int | None = None,
    definition: DefinitionIdentity = DEFINITION,
) -> JobExecution:
    with repository.begin() as uow:
        if instance_id is None:
            instance_id = uow.instances.select_or_create(new_key()).instance.id
        execution = uow.executions.create(instance_id, definition)
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        uow.commit()
    return execution


def fail(repository: JobRepository, clock: ManualClock, execution: JobExecution) -> None:
    failure = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(1))
    with repository.begin() as uow:
        for step in uow.steps.of_execution(execution.id):
            if step.status.is_active:
                uow.steps.transition(
                    step.id, step.version, LifecycleTransition.failed(clock.advance(), failure)
                )
        current = uow.executions.get(execution.id)
        assert current is not None
        uow.executions.transition(
            current.id, current.version, LifecycleTransition.failed(clock.advance(), failure)
        )
        uow.commit()


def step(repository: JobRepository, execution: JobExecution, node: str) -> StepExecution:
    with repository.begin() as uow:
        created = uow.flow.create_step(
            execution.id, StepName(node), NodeId(node), StartLimit.unrestricted()
        )
        uow.commit()
    return created


class HasId(Protocol):
    @property
    def id(self) -> int: ...


def request(
    execution: HasId,
    *,
    sequence: int = 1,
    node: str = "extract",
    source_step: int | None = None,
    kind: FlowTransitionKind = K.STEP_EXIT,
    outcome: str = "COMPLETED",
    target: FlowTarget | None = None,
    fingerprint: bytes | None = None,
    input_digest: bytes = INPUT,
    reused: int | None = None,
    at: datetime | None = None,
) -> FlowDecisionRequest:
    return FlowDecisionRequest(
        job_execution_id=execution.id,
        sequence=sequence,
        source_node_id=NodeId(node),
        source_step_execution_id=source_step,
        kind=kind,
        observed_outcome=ExitCode(outcome),
        target=target or FlowTarget.to_node("check"),
        plan_fingerprint=fingerprint or DEFINITION.digest,
        input_digest=input_digest,
        reused_decision_id=reused,
        decided_at=at or ManualClock().now(),
    )


def append(repository: JobRepository, req: FlowDecisionRequest) -> FlowDecision:
    with repository.begin() as uow:
        decision = uow.flow.append_decision(req)
        uow.commit()
    return decision


def decision_rows(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT COUNT(*) FROM pybatch.flow_decision").fetchone()
    assert row is not None
    return int(row[0])


def decisions(repository: JobRepository, execution: HasId) -> list[FlowDecision]:
    """The committed decisions of `execution`, read in a fresh unit of work."""
    with repository.begin() as uow:
        return uow.flow.decisions(execution.id)


# --------------------------------------------------------------------------- values


def test_exit_patterns_match_any_run_and_exactly_one_character() -> None:
    assert exit_pattern_matches("*", "")
    assert exit_pattern_matches("LOAD_?", "LOAD_A")
    assert not exit_pattern_matches("LOAD_?", "LOAD_AB")
    assert exit_pattern_matches("C*D", "COMPLETED")
    assert not exit_pattern_matches("C.D", "CXD")  # regex characters are literal


def test_start_limit_unrestricted_is_the_u32_maximum() -> None:
    assert StartLimit.unrestricted().value == 4_294_967_295
    assert StartLimit(1).value == 1
    with pytest.raises(ZeroStartLimit):
        StartLimit(0)
    with pytest.raises(ValueError):
        StartLimit(4_294_967_296)


def test_flow_target_is_exactly_one_of_node_or_terminal() -> None:
    with pytest.raises(ValueError):
        FlowTarget()
    with pytest.raises(ValueError):
        FlowTarget(NodeId("a"), TerminalKind.FAIL)


def test_first_matching_transition_decides() -> None:
    execution_stub = JobExecutionStub()
    fail_target = request(
        execution_stub, outcome="FAILED", target=FlowTarget.end(TerminalKind.FAIL)
    )
    assert decision_matches_manifest(MANIFEST, fail_target)
    # COMPLETED matches the first transition ("check"), never the catch-all behind it.
    wrong = request(execution_stub, target=FlowTarget.end(TerminalKind.FAIL))
    assert not decision_matches_manifest(MANIFEST, wrong)
    assert not decision_matches_manifest({**MANIFEST, "format": 1}, request(execution_stub))


class JobExecutionStub:
    id = 1


# --------------------------------------------------------------------------- E8-E18, E22


def test_a_decision_the_manifest_allows_is_recorded_as_sent_with_an_id(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E8."""
    execution = launch(repository, clock)
    source = step(repository, execution, "extract")
    sent = request(execution, source_step=source.id, at=clock.now())
    decision = append(repository, sent)
    assert decision.id > 0 and decision.sequence == 1
    assert decision.target == FlowTarget.to_node("check")
    # Every field of the request is recorded as sent.
    assert decision == FlowDecision(id=decision.id, **attrs.asdict(sent, recurse=False))
    with repository.begin() as uow:
        assert uow.flow.decisions(execution.id) == [decision]


def test_fingerprint_other_than_the_manifest_digest_is_corrupt(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario E9."""
    execution = launch(repository, clock)
    source = step(repository, execution, "extract")
    with pytest.raises(FlowStateCorrupt):
        append(repository, request(execution, source_step=source.id, fingerprint=bytes(32)))
    assert decision_rows(admin) == 0


def test_a_legacy_definition_never_records_a_decision(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E10."""
    legacy = DefinitionIdentity.LEGACY
    execution = launch(repository, clock, definition=legacy)
    source = step(repository, execution, "extract")
    with pytest.raises(FlowStateCorrupt):
        append(repository, request(execution, source_step=source.id, fingerprint=legacy.digest))
    # Not even a decision whose fingerprint is the legacy digest itself is recorded.
    assert decisions(repository, execution) == []


def test_target_other_than_the_manifest_selected_is_corrupt(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E11."""
    execution = launch(repository, clock)
    source = step(repository, execution, "extract")
    # "load" is not a target of extract; the catch-all "end fail" is a transition of extract,
    # but COMPLETED selects the first matching one ("check"), so it is refused too.
    for target in (FlowTarget.to_node("load"), FlowTarget.end(TerminalKind.FAIL)):
        with pytest.raises(FlowStateCorrupt):
            append(repository, request(execution, source_step=source.id, target=target))
    assert decisions(repository, execution) == []


def test_decision_positions_must_be_contiguous(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E12."""
    execution = launch(repository, clock)
    extract = step(repository, execution, "extract")
    with pytest.raises(ConcurrentModification):
        append(repository, request(execution, sequence=2, source_step=extract.id))
    assert decisions(repository, execution) == []
    first = append(repository, request(execution, source_step=extract.id))
    with pytest.raises(ConcurrentModification):  # repeating position 1 for another node
        append(
            repository,
            request(
                execution,
                node="check",
                kind=K.DECIDER,
                outcome="DONE",
                target=FlowTarget.end(TerminalKind.COMPLETE),
            ),
        )
    with pytest.raises(ConcurrentModification):  # skipping position 2
        append(
            repository,
            request(
                execution,
                sequence=3,
                node="check",
                kind=K.DECIDER,
                outcome="DONE",
                target=FlowTarget.end(TerminalKind.COMPLETE),
            ),
        )
    assert decisions(repository, execution) == [first]


def test_racing_appends_at_one_position_have_one_winner(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E12."""
    execution = launch(repository, clock)
    extract = step(repository, execution, "extract")
    requests = [
        request(execution, source_step=extract.id),
        request(
            execution,
            node="check",
            kind=K.DECIDER,
            outcome="DONE",
            target=FlowTarget.end(TerminalKind.COMPLETE),
        ),
    ]
    outcomes = race_units_of_work(
        repository, 2, lambda uow, i: uow.flow.append_decision(requests[i])
    )
    assert sum(o.ok for o in outcomes) == 1
    assert [type(o.error) for o in outcomes if not o.ok] == [ConcurrentModification]
    with repository.begin() as uow:
        assert [d.sequence for d in uow.flow.decisions(execution.id)] == [1]


def test_a_node_decides_once_per_execution(repository: JobRepository, clock: ManualClock) -> None:
    """Scenario E13."""
    execution = launch(repository, clock)
    extract = step(repository, execution, "extract")
    first = append(repository, request(execution, source_step=extract.id))
    with pytest.raises(ConcurrentModification):
        append(repository, request(execution, sequence=2, source_step=extract.id))
    # The same node with another outcome is refused as well: one decision per node.
    with pytest.raises(ConcurrentModification):
        append(
            repository,
            request(
                execution,
                sequence=2,
                source_step=extract.id,
                outcome="FAILED",
                target=FlowTarget.end(TerminalKind.FAIL),
            ),
        )
    assert decisions(repository, execution) == [first]


def test_source_step_from_another_instance_or_node_is_corrupt(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E14."""
    execution = launch(repository, clock)
    other = launch(repository, clock)
    foreign = step(repository, other, "extract")
    wrong_node = step(repository, execution, "load")
    for source in (foreign.id, wrong_node.id):
        with pytest.raises(FlowStateCorrupt):
            append(repository, request(execution, source_step=source))
    assert decisions(repository, execution) == []
    assert decisions(repository, other) == []


def test_step_exit_needs_a_source_step_a_decider_does_not(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E15."""
    execution = launch(repository, clock)
    with pytest.raises(FlowStateCorrupt):
        append(repository, request(execution))
    assert decisions(repository, execution) == []
    decided = append(
        repository,
        request(
            execution,
            node="check",
            kind=K.DECIDER,
            outcome="LOAD_1",
            target=FlowTarget.to_node("load"),
        ),
    )
    assert decided.source_step_execution_id is None and decided.kind is K.DECIDER
    assert decisions(repository, execution) == [decided]


def test_a_reused_decision_must_match_the_original_exactly(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E16."""
    first = launch(repository, clock)
    extract = step(repository, first, "extract")
    original = append(repository, request(first, source_step=extract.id))
    fail(repository, clock, first)
    second = launch(repository, clock, instance_id=first.job_instance_id)
    with pytest.raises(FlowStateCorrupt):
        append(
            repository,
            request(
                second,
                source_step=extract.id,
                kind=K.COMPLETED_STEP_REUSE,
                input_digest=OTHER_INPUT,
                reused=original.id,
            ),
        )
    # Another outcome (with the target the manifest selects for it), another fingerprint:
    # each is a different decision than the one named for reuse.
    with pytest.raises(FlowStateCorrupt):
        append(
            repository,
            request(
                second,
                source_step=extract.id,
                kind=K.COMPLETED_STEP_REUSE,
                outcome="FAILED",
                target=FlowTarget.end(TerminalKind.FAIL),
                reused=original.id,
            ),
        )
    with pytest.raises(FlowStateCorrupt):
        append(
            repository,
            request(
                second,
                source_step=extract.id,
                kind=K.COMPLETED_STEP_REUSE,
                fingerprint=bytes(32),
                reused=original.id,
            ),
        )
    # Another node: a "check" decision cannot reuse the decision "extract" made.
    with pytest.raises(FlowStateCorrupt):
        append(
            repository,
            request(
                second,
                node="check",
                source_step=step(repository, second, "check").id,
                kind=K.COMPLETED_STEP_REUSE,
                outcome="DONE",
                target=FlowTarget.end(TerminalKind.COMPLETE),
                reused=original.id,
            ),
        )
    foreign = launch(repository, clock)
    with pytest.raises(FlowStateCorrupt):  # the reused decision is in another instance
        append(
            repository,
            request(
                foreign,
                source_step=step(repository, foreign, "extract").id,
                kind=K.COMPLETED_STEP_REUSE,
                reused=original.id,
            ),
        )
    assert decisions(repository, second) == []
    assert decisions(repository, foreign) == []
    reused = append(
        repository,
        request(second, source_step=extract.id, kind=K.COMPLETED_STEP_REUSE, reused=original.id),
    )
    assert reused.reused_decision_id == original.id
    assert decisions(repository, second) == [reused]


def test_the_reusable_decision_found_is_the_latest_across_attempts(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E17."""
    first = launch(repository, clock)
    extract = step(repository, first, "extract")
    older = append(repository, request(first, source_step=extract.id))
    fail(repository, clock, first)
    second = launch(repository, clock, instance_id=first.job_instance_id)
    newer = append(repository, request(second, source_step=extract.id))
    instance_id, node = first.job_instance_id, NodeId("extract")
    with repository.begin() as uow:
        found = uow.flow.find_reusable_decision(
            instance_id, node, DEFINITION.digest, INPUT, K.STEP_EXIT
        )
        assert found == newer and found != older
        assert (
            uow.flow.find_reusable_decision(
                instance_id, node, DEFINITION.digest, OTHER_INPUT, K.STEP_EXIT
            )
            is None
        )
        assert (
            uow.flow.find_reusable_decision(instance_id, node, DEFINITION.digest, INPUT, K.DECIDER)
            is None
        )
        with pytest.raises(JobInstanceNotFound) as missing:
            uow.flow.find_reusable_decision(
                instance_id + 1000, node, DEFINITION.digest, INPUT, K.STEP_EXIT
            )
        assert missing.value.id == instance_id + 1000


def test_flow_decisions_are_listed_in_sequence_order(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E18."""
    execution = launch(repository, clock)
    extract = step(repository, execution, "extract")
    one = append(repository, request(execution, source_step=extract.id))
    two = append(
        repository,
        request(
            execution,
            sequence=2,
            node="check",
            kind=K.DECIDER,
            outcome="LOAD_X",
            target=FlowTarget.to_node("load"),
        ),
    )
    three = append(
        repository,
        request(
            execution,
            sequence=3,
            node="merge",
            kind=K.SPLIT_AGGREGATE,
            outcome="ANY",
            target=FlowTarget.end(TerminalKind.STOP),
        ),
    )
    with repository.begin() as uow:
        assert uow.flow.decisions(execution.id) == [one, two, three]
        with pytest.raises(JobExecutionNotFound) as missing:
            uow.flow.decisions(execution.id + 1000)
        assert missing.value.id == execution.id + 1000
        with pytest.raises(JobExecutionNotFound) as unknown:
            uow.flow.append_decision(request(JobExecutionStubFar()))
        assert unknown.value.id == JobExecutionStubFar.id


class JobExecutionStubFar:
    id = 10_000


def test_nested_job_exit_never_matches_yet_is_storable(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario E22."""
    execution = launch(repository, clock)
    extract = step(repository, execution, "extract")
    with pytest.raises(FlowStateCorrupt):
        append(repository, request(execution, source_step=extract.id, kind=K.NESTED_JOB_EXIT))
    assert decision_rows(admin) == 0
    admin.execute(
        "INSERT INTO pybatch.flow_decision (job_execution_id, sequence, source_node_id,"
        " observed_outcome, target_node_id, transition_kind, plan_fingerprint, input_digest,"
        " decided_at) VALUES (%s, 1, 'extract', 'COMPLETED', 'check', 'NESTED_JOB_EXIT', %s,"
        " %s, now())",
        (execution.id, DEFINITION.digest, INPUT),
    )
    with repository.begin() as uow:
        assert [d.kind for d in uow.flow.decisions(execution.id)] == [K.NESTED_JOB_EXIT]


def test_unknown_kind_in_a_stored_decision_fails_closed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    execution = launch(repository, clock)
    extract = step(repository, execution, "extract")
    append(repository, request(execution, source_step=extract.id))
    admin.execute("ALTER TABLE pybatch.flow_decision DROP CONSTRAINT flow_decision_target_shape")
    admin.execute("UPDATE pybatch.flow_decision SET terminal_kind = 'FAIL'")
    with repository.begin() as uow, pytest.raises(FlowStateCorrupt):
        uow.flow.decisions(execution.id)
