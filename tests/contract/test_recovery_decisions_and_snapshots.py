"""The recovery_decision read (G8), the decision's repr (G10), the recovery
snapshot (G11), and domain errors through a repository call being RepositoryErrors.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from pybatch import JobRepository
from pybatch.errors import (
    DomainError,
    JobExecutionNotFound,
    RepositoryDomainError,
    RepositoryError,
    StateSchemaVersionNotStorable,
)
from pybatch.etl import Job
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import NodeId, StateSchemaId, StepName
from pybatch.values.ownership import OwnerToken
from pybatch.values.partitions import PartitionPlanEntry
from pybatch.values.recovery import OwnerObservation, RecoveryMarkers
from pybatch.values.state import ExecutionContext
from tests.contract.test_flow_decisions import DEFINITION, new_key
from tests.contract.test_flow_decisions import request as decision_request
from tests.contract.test_recovery_of_orphaned_executions import S, execution_in, mark_failed
from tests.support.clock import ManualClock
from tests.support.owners import claim
from tests.support.statements import create_step

PARTITION_SCHEMA = StateSchemaId("tests.snapshot.partition.v1")


def test_the_recorded_recovery_decision_reads_back_with_its_evidence_redacted(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario G8, G10."""
    prior = execution_in(repository, clock, S.STARTED)
    with repository.begin() as uow:
        assert uow.recovery.decision(prior.id) is None
        with pytest.raises(JobExecutionNotFound):
            uow.recovery.decision(prior.id + 1000)
        result = uow.recovery.recover(prior.id, mark_failed(prior.version))
        decision = uow.recovery.decision(prior.id)
        uow.commit()
    assert decision is not None
    assert decision.id == result.decision.id
    assert (decision.job_execution_id, decision.execution_version) == (prior.id, prior.version)
    assert (decision.prior_status, decision.resulting_status) == (S.STARTED, S.FAILED)
    assert decision.decided_at == clock.now()
    # G10: the repr never shows the evidence digest.
    text = repr(decision)
    assert decision.evidence_digest.hex() not in text and "<redacted>" in text


def test_domain_errors_through_a_repository_call_are_repository_errors(
    repository: JobRepository, clock: ManualClock
) -> None:
    prior = execution_in(repository, clock, S.STARTED)
    with repository.begin() as uow:
        parent = create_step(uow, prior.id, StepName("parent"))
        parent = uow.steps.transition(
            parent.id, parent.version, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        uow.commit()
    # A context schema version valid as a u32 but beyond the integer column.
    too_big = PartitionPlanEntry(
        "a", ExecutionContext(StateSchemaId("tests.domain.v1"), 2**31, {"key": "a"})
    )
    with repository.begin() as uow, pytest.raises(RepositoryError) as caught:
        uow.partitions.create_plan(parent.id, [too_big])
    error = caught.value
    # The contract's RepositoryError.Domain(DomainError): the refusal is its field and cause.
    assert isinstance(error, RepositoryDomainError)
    refusal = error.error
    assert isinstance(refusal, StateSchemaVersionNotStorable) and isinstance(refusal, DomainError)
    assert error.__cause__ is error.error
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, RepositoryDomainError)
    assert isinstance(copy.error, StateSchemaVersionNotStorable)


def test_the_recovery_snapshot_reports_owner_latest_step_and_markers_without_the_token(
    repository: JobRepository, clock: ManualClock, admin: Any
) -> None:
    """Scenario G11."""
    owner, stranger = OwnerToken.generate(), OwnerToken.generate()
    with repository.begin() as uow:
        key = Job(repository, "snapshots", {"n": 1}).key
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        absent = execution
        uow.commit()
    snapshot = repository.recovery_snapshot(absent.id, owner)
    assert snapshot.owner is OwnerObservation.ABSENT
    assert snapshot.latest_step is None
    # The legacy definition has no delivery mode: its external effects are ambiguous.
    assert snapshot.markers == RecoveryMarkers.AMBIGUOUS_EXTERNAL_EFFECT
    with repository.begin() as uow:
        claim(uow, execution.id, execution.version, owner, clock.now())
        started = uow.executions.transition(
            execution.id, execution.version, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        step = create_step(uow, execution.id, StepName("load"))
        uow.executions.transition(
            started.id, started.version, LifecycleTransition.new(S.UNKNOWN, clock.advance())
        )
        uow.commit()
    mine = repository.recovery_snapshot(execution.id, owner)
    theirs = repository.recovery_snapshot(execution.id, stranger)
    assert (mine.owner, theirs.owner) == (
        OwnerObservation.CURRENT_PROCESS,
        OwnerObservation.OTHER_PROCESS,
    )
    assert mine.status is S.UNKNOWN and mine.version == started.version + 1
    assert mine.latest_step is not None and mine.latest_step.id == step.id
    assert RecoveryMarkers.UNKNOWN_COMMIT in mine.markers
    assert owner.value.hex() not in repr(mine)
    row = admin.execute("SELECT clock_timestamp()").fetchone()
    assert abs((row[0] - mine.server_time).total_seconds()) < 60
    with pytest.raises(JobExecutionNotFound):
        repository.recovery_snapshot(execution.id + 1000)


def test_a_recovery_request_never_shows_its_evidence_digest() -> None:
    """Scenario G10."""
    request = mark_failed(3)
    text = repr(request)
    assert request.evidence_digest.hex() not in text
    assert repr(request.evidence_digest) not in text
    assert 'evidence_digest="<redacted>"' in text


def test_completed_partitions_and_flow_decisions_are_snapshot_markers(
    repository: JobRepository, clock: ManualClock
) -> None:
    """`completed_partition` appears once a partition under the execution's steps is
    COMPLETED (not before), and `committed_flow_decision` once a decision is recorded.

    Scenario G11.
    """
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        execution = uow.executions.create(instance.id, DEFINITION)
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        parent = uow.flow.create_step(execution.id, StepName("load"), NodeId("load"))
        parent = uow.steps.transition(
            parent.id, 0, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        (partition,) = uow.partitions.create_plan(
            parent.id, [PartitionPlanEntry("a", ExecutionContext(PARTITION_SCHEMA, 1, {}))]
        )
        uow.commit()
    markers = repository.recovery_snapshot(execution.id).markers
    assert RecoveryMarkers.COMPLETED_PARTITION not in markers
    assert RecoveryMarkers.COMMITTED_FLOW_DECISION not in markers
    assert RecoveryMarkers.UNKNOWN_COMMIT not in markers
    with repository.begin() as uow:
        claimed = uow.partitions.claim(parent)
        assert claimed is not None and claimed[0].id == partition.id
        assigned, worker = claimed
        completed = LifecycleTransition.new(S.COMPLETED, clock.advance())
        uow.partitions.end_worker(assigned.id, assigned.version, worker.id, completed, None)
        uow.commit()
    markers = repository.recovery_snapshot(execution.id).markers
    assert RecoveryMarkers.COMPLETED_PARTITION in markers
    assert RecoveryMarkers.COMMITTED_FLOW_DECISION not in markers
    with repository.begin() as uow:
        extract = uow.flow.create_step(execution.id, StepName("extract"), NodeId("extract"))
        uow.flow.append_decision(decision_request(execution, source_step=extract.id))
        uow.commit()
    markers = repository.recovery_snapshot(execution.id).markers
    assert RecoveryMarkers.COMPLETED_PARTITION in markers
    assert RecoveryMarkers.COMMITTED_FLOW_DECISION in markers
