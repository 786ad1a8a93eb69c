"""Idempotent, audited operator requests (H3-H16), service layer.

What an operator relies on: a retried request with the same operation id replays instead
of acting twice; the same id for another request is refused; every refusal is recorded
with its details; a lost COMMIT acknowledgement is reported as unknown, never as success.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch._services.operator import UNKNOWN_EFFECT, OperatorService, operator_evidence
from pybatch.errors import OperationIdConflict, OperationOutcomeUnknown
from pybatch.etl import Job
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ActorRef, DefinitionRevision, OperationId
from pybatch.values.operator import OperatorAction, OperatorOutcomeClass, OperatorRejectionCode
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.race import race, terminate_backend

S = BatchStatus
Outcome = OperatorOutcomeClass
Code = OperatorRejectionCode
OPS = ActorRef("cli:ops")


def instance_key(repository: JobRepository, name: str = "orders", day: str = "2026-11-30") -> Any:
    return Job(repository, name, {"business_date": day}).key


def audit_rows(admin: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return admin.execute(
        "SELECT action, operation_id, outcome_class, rejection_code FROM pybatch.operator_request"
        " ORDER BY id"
    ).fetchall()


def execution_row(admin: psycopg.Connection[Any], execution_id: int) -> tuple[Any, ...]:
    """The durable columns an operator request may change."""
    row = admin.execute(
        "SELECT status, version, updated_at, ended_at, failure_category, stop_requested_at,"
        " stop_requested_by FROM pybatch.job_execution WHERE id = %s",
        (execution_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def recovery_decisions(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM pybatch.recovery_decision").fetchone()
    assert row is not None
    return int(row[0])


def execution_count(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM pybatch.job_execution").fetchone()
    assert row is not None
    return int(row[0])


def set_status(repository: JobRepository, clock: ManualClock, execution_id: int, *path: S) -> Any:
    with repository.begin() as uow:
        current = uow.executions.get(execution_id)
        assert current is not None
        for status in path:
            at = clock.advance()
            if status is S.FAILED:
                transition = LifecycleTransition.failed(
                    at, FailureSummary(FailureCategory.USER_COMPONENT, FailureId(execution_id))
                )
            else:
                transition = LifecycleTransition.new(status, at)
            current = uow.executions.transition(current.id, current.version, transition)
        uow.commit()
    return current


@pytest.fixture
def service(repository: JobRepository) -> OperatorService:
    return OperatorService(repository)


def test_a_repeated_launch_replays_whoever_repeats_it(
    repository: JobRepository, service: OperatorService, admin: psycopg.Connection[Any]
) -> None:
    """Scenario H3, H5."""
    k = instance_key(repository)
    first = service.launch(OperationId("launch-1"), OPS, k)
    assert first.outcome is Outcome.APPLIED
    assert first.execution is not None and first.execution.status is S.STARTING
    again = service.launch(OperationId("launch-1"), ActorRef("cli:someone-else"), k)
    assert again.outcome is Outcome.REPLAYED
    assert again.record == first.record  # the recorded row, actor included
    assert execution_count(admin) == 1
    assert audit_rows(admin) == [("LAUNCH", "launch-1", "APPLIED", None)]


def test_the_same_operation_id_for_another_request_is_refused(
    repository: JobRepository, service: OperatorService, admin: psycopg.Connection[Any]
) -> None:
    """Scenario H4."""
    service.launch(OperationId("launch-1"), OPS, instance_key(repository))
    with pytest.raises(OperationIdConflict) as conflict:
        service.launch(OperationId("launch-1"), OPS, instance_key(repository, day="2026-12-01"))
    assert (conflict.value.action, conflict.value.operation_id) == ("LAUNCH", "launch-1")
    with pytest.raises(OperationIdConflict):
        service.launch(OperationId("launch-1"), OPS, instance_key(repository, name="other"))
    # The same key with another definition is another request too.
    other_definition = DefinitionIdentity.from_manifest(
        None, DefinitionRevision("r2"), {"format": 1, "steps": ["extract"]}
    )
    with pytest.raises(OperationIdConflict) as by_definition:
        service.launch(
            OperationId("launch-1"), OPS, instance_key(repository), definition=other_definition
        )
    assert (by_definition.value.action, by_definition.value.operation_id) == (
        "LAUNCH",
        "launch-1",
    )
    assert execution_count(admin) == 1
    assert audit_rows(admin) == [("LAUNCH", "launch-1", "APPLIED", None)]


def test_stop_is_applied_to_live_or_stopping_runs_and_rejected_for_unknown_or_missing_ones(
    repository: JobRepository,
    service: OperatorService,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario H8, H14."""
    run = service.launch(OperationId("launch-1"), OPS, instance_key(repository)).execution
    assert run is not None
    started = set_status(repository, clock, run.id, S.STARTED)
    applied = service.stop(OperationId("stop-1"), OPS, run.id)
    assert applied.outcome is Outcome.APPLIED
    assert applied.execution is not None
    assert (applied.execution.status, applied.execution.version) == (S.STARTED, started.version)
    stopping = set_status(repository, clock, run.id, S.STOPPING)
    before = execution_row(admin, run.id)
    clock.advance()
    noop = service.stop(OperationId("stop-2"), OPS, run.id)
    assert noop.outcome is Outcome.APPLIED and noop.record.result_status is S.STOPPING
    assert noop.execution is not None and noop.execution.version == stopping.version
    assert execution_row(admin, run.id) == before  # no change at all
    set_status(repository, clock, run.id, S.STOPPED)
    finished = service.stop(OperationId("stop-3"), OPS, run.id)
    assert finished.outcome is Outcome.APPLIED and finished.record.result_status is S.STOPPED
    other = service.launch(OperationId("launch-2"), OPS, instance_key(repository, "x")).execution
    assert other is not None
    set_status(repository, clock, other.id, S.STARTED, S.UNKNOWN)
    before_unknown = execution_row(admin, other.id)
    unknown = service.stop(OperationId("stop-4"), OPS, other.id)
    assert unknown.outcome is Outcome.REJECTED
    assert execution_row(admin, other.id) == before_unknown
    with repository.begin() as uow:
        stored = uow.operator_requests.find(OperatorAction.STOP, OperationId("stop-4"))
    assert stored is not None and stored.rejection is not None
    assert stored.rejection == unknown.rejection
    assert (stored.rejection.code, stored.rejection.status) == (Code.INVALID_STATE, S.UNKNOWN)
    missing = service.stop(OperationId("stop-5"), OPS, 987654)
    assert missing.rejection is not None and missing.rejection.code is Code.EXECUTION_NOT_FOUND


def test_a_launch_refused_as_already_active_is_read_back_with_its_details(
    repository: JobRepository,
    service: OperatorService,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """A launch while the latest attempt is active is REJECTED EXECUTION_ALREADY_ACTIVE with
    that attempt's id and status, audited, and read back with exactly those details.

    Scenario H14.
    """
    key = instance_key(repository)
    run = service.launch(OperationId("launch-1"), OPS, key).execution
    assert run is not None
    started = set_status(repository, clock, run.id, S.STARTED)
    refused = service.launch(OperationId("launch-2"), OPS, key)
    assert refused.outcome is Outcome.REJECTED and refused.rejection is not None
    assert (
        refused.rejection.code,
        refused.rejection.execution_id,
        refused.rejection.status,
    ) == (Code.EXECUTION_ALREADY_ACTIVE, run.id, S.STARTED)
    with repository.begin() as uow:
        stored = uow.operator_requests.find(OperatorAction.LAUNCH, OperationId("launch-2"))
    assert stored is not None and stored.rejection == refused.rejection
    assert execution_count(admin) == 1
    assert execution_row(admin, run.id)[:2] == ("STARTED", started.version)
    assert audit_rows(admin)[-1] == (
        "LAUNCH",
        "launch-2",
        "REJECTED",
        "EXECUTION_ALREADY_ACTIVE",
    )
    # A rejected request replays as well: the rejection is the recorded outcome.
    replay = service.launch(OperationId("launch-2"), OPS, key)
    assert replay.outcome is Outcome.REPLAYED and replay.record == refused.record


def test_a_stop_of_a_completed_execution_is_applied_and_changes_nothing(
    repository: JobRepository,
    service: OperatorService,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario H8."""
    run = service.launch(OperationId("launch-1"), OPS, instance_key(repository)).execution
    assert run is not None
    completed = set_status(repository, clock, run.id, S.STARTED, S.COMPLETED)
    columns = (
        "SELECT status, version, updated_at, ended_at, stop_requested_at, stop_requested_by"
        " FROM pybatch.job_execution WHERE id = %s"
    )
    before = admin.execute(columns, (run.id,)).fetchone()
    clock.advance()
    outcome = service.stop(OperationId("stop-done"), OPS, run.id)
    assert outcome.outcome is Outcome.APPLIED and outcome.rejection is None
    assert outcome.execution is not None
    assert (outcome.execution.status, outcome.execution.version) == (
        S.COMPLETED,
        completed.version,
    )
    assert (outcome.record.prior_status, outcome.record.result_status) == (
        S.COMPLETED,
        S.COMPLETED,
    )
    after = admin.execute(columns, (run.id,)).fetchone()
    assert after == before  # no transition, no stop request, no timestamp moved
    assert before is not None and before[4] is None and before[5] is None
    assert execution_count(admin) == 1
    assert audit_rows(admin)[-1] == ("STOP", "stop-done", "APPLIED", None)
    again = service.stop(OperationId("stop-done"), OPS, run.id)
    assert again.outcome is Outcome.REPLAYED
    assert admin.execute(columns, (run.id,)).fetchone() == before


def test_stale_expected_version_records_the_current_one(
    repository: JobRepository,
    service: OperatorService,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario H11."""
    run = service.launch(OperationId("launch-1"), OPS, instance_key(repository)).execution
    assert run is not None
    started = set_status(repository, clock, run.id, S.STARTED)
    stale = service.stop(OperationId("stop-1"), OPS, run.id, expected_version=run.version)
    assert stale.outcome is Outcome.REJECTED
    with repository.begin() as uow:
        stored = uow.operator_requests.find(OperatorAction.STOP, OperationId("stop-1"))
    assert stored is not None and stored.rejection is not None
    assert stored.rejection.code is Code.OPTIMISTIC_CONFLICT
    assert stored.rejection.current_version == started.version
    assert stored.observed_version == run.version
    assert stale.rejection == stored.rejection
    assert execution_row(admin, run.id)[:2] == ("STARTED", started.version)
    assert execution_row(admin, run.id)[5:] == (None, None)  # no stop was recorded


def test_recovering_an_unknown_commit_needs_the_unknown_effect_reason(
    repository: JobRepository,
    service: OperatorService,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario H10."""
    run = service.launch(OperationId("l-1"), OPS, instance_key(repository)).execution
    assert run is not None
    current = set_status(repository, clock, run.id, S.STARTED, S.UNKNOWN)

    def request(reason: str) -> RecoveryRequest:
        return RecoveryRequest(
            current.version,
            reason,
            OPS.value,
            operator_evidence(current),
            FailureSummary(FailureCategory.UNKNOWN_COMMIT, FailureId(run.id)),
        )

    before = execution_row(admin, run.id)
    refused = service.recover(
        OperationId("r-1"), OPS, run.id, request("OPERATOR"), unknown_commit=True
    )
    assert refused.outcome is Outcome.REJECTED and refused.rejection is not None
    assert refused.rejection.code is Code.UNRESOLVED_RECOVERY_REQUIRED
    assert execution_row(admin, run.id) == before  # still UNKNOWN
    assert recovery_decisions(admin) == 0
    applied = service.recover(
        OperationId("r-2"), OPS, run.id, request(UNKNOWN_EFFECT), unknown_commit=True
    )
    assert applied.outcome is Outcome.APPLIED
    assert applied.execution is not None and applied.execution.status is S.FAILED
    with repository.begin() as uow:
        decision = uow.recovery.decision(run.id)
    assert decision is not None and decision.reason_code == UNKNOWN_EFFECT
    assert recovery_decisions(admin) == 1
    assert "redacted" in repr(decision) and decision.evidence_digest.hex() not in repr(decision)


def test_a_lost_commit_is_reported_unknown_and_is_atomic(
    repository: JobRepository,
    service: OperatorService,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario H12."""
    run = service.launch(OperationId("l-1"), OPS, instance_key(repository)).execution
    assert run is not None
    set_status(repository, clock, run.id, S.STARTED)
    original = UnitOfWork.commit

    def lose_acknowledgement(uow: UnitOfWork) -> None:
        terminate_backend(admin, uow.connection.info.backend_pid)
        original(uow)

    monkeypatch.setattr(UnitOfWork, "commit", lose_acknowledgement)
    with pytest.raises(OperationOutcomeUnknown):
        service.stop(OperationId("stop-1"), OPS, run.id)
    monkeypatch.setattr(UnitOfWork, "commit", original)
    row = admin.execute(
        "SELECT stop_requested_at IS NOT NULL FROM pybatch.job_execution WHERE id = %s", (run.id,)
    ).fetchone()
    recorded = [r for r in audit_rows(admin) if r[0] == "STOP"]
    assert row is not None and row[0] == bool(recorded)  # both or neither
    # Re-running with the same operation id settles it: replay or apply, never twice.
    settled = service.stop(OperationId("stop-1"), OPS, run.id)
    assert settled.outcome in (Outcome.REPLAYED, Outcome.APPLIED)
    assert len([r for r in audit_rows(admin) if r[0] == "STOP"]) == 1


@pytest.mark.race
def test_concurrent_identical_requests_with_one_operation_id_apply_once_and_replay(
    repository: JobRepository, service: OperatorService, admin: psycopg.Connection[Any]
) -> None:
    """Scenario H16."""
    k = instance_key(repository)
    outcomes = race(4, lambda index: service.launch(OperationId("launch-1"), OPS, k))
    assert all(outcome.ok for outcome in outcomes), [o.error for o in outcomes]
    classes = sorted(outcome.value.outcome.value for outcome in outcomes if outcome.value)
    assert classes == ["APPLIED", "REPLAYED", "REPLAYED", "REPLAYED"]
    assert execution_count(admin) == 1
    assert len(audit_rows(admin)) == 1


@pytest.mark.race
def test_concurrent_different_requests_with_one_operation_id_apply_one_and_refuse_the_rest(
    repository: JobRepository, service: OperatorService, admin: psycopg.Connection[Any]
) -> None:
    """Launches of different keys under one operation id: one is APPLIED, every other one is
    OperationIdConflict; one audit row and one execution exist.

    Scenario H16.
    """
    keys = [instance_key(repository, day=f"2026-12-0{index + 1}") for index in range(4)]
    outcomes = race(4, lambda index: service.launch(OperationId("launch-1"), OPS, keys[index]))
    applied = [o.value for o in outcomes if o.ok and o.value is not None]
    assert [a.outcome for a in applied] == [Outcome.APPLIED]
    assert [type(o.error) for o in outcomes if not o.ok] == [OperationIdConflict] * 3
    assert execution_count(admin) == 1
    assert audit_rows(admin) == [("LAUNCH", "launch-1", "APPLIED", None)]
