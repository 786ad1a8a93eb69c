"""Holds and the purge of whole instance histories (scenarios J1-J19).

What an operator relies on: a purge deletes finished histories whole, never a row that a
retained row references, reports the rows actually deleted, leaves a tombstone so that a
finished load is never re-run by accident, never touches a held instance, and refuses a
plan that went stale (deleting nothing).
"""

from __future__ import annotations

import datetime
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch._services.retention import RetentionService
from pybatch.errors import (
    AbandonedInstance,
    AgeBoundTooSmall,
    BatchBoundOutOfRange,
    CompletedInstance,
    EmptyStatusSet,
    IntegrityViolation,
    JobInstanceNotFound,
    NonTerminalStatus,
    OperationIdConflict,
    RetentionPlanStale,
)
from pybatch.etl import Job
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    ActorRef,
    JobName,
    NodeId,
    OperationId,
    ReasonCode,
    StateSchemaId,
    StepName,
)
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.partitions import PartitionPlanEntry
from pybatch.values.retention import (
    PurgeBatchBound,
    PurgeCounts,
    PurgePlan,
    PurgePlanRequest,
    PurgeSurvey,
    TerminalStatusSet,
)
from pybatch.values.state import ExecutionContext
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.contract.test_flow_decisions import DEFINITION as FLOW_DEFINITION
from tests.contract.test_flow_decisions import request as flow_decision_request
from tests.contract.test_recovery_of_orphaned_executions import mark_failed
from tests.support.clock import ManualClock
from tests.support.race import race
from tests.support.rows import write_exit_code

S = BatchStatus
OPS = ActorRef("cli:ops")
HOUR = datetime.timedelta(hours=1)
LEGAL = ReasonCode("LEGAL_HOLD")
STATE_SCHEMA = StateSchemaId("tests.retention.partition.v1")


def history(
    repository: JobRepository, clock: ManualClock, run: str, *ends: S, name: str = "loads"
) -> int:
    """An instance whose attempts end in `ends`; one step and one operator stop per attempt."""
    key = Job(repository, name, {"run": run}).key
    service = OperatorService(repository)
    instance_id = 0
    for attempt, end in enumerate(ends, start=1):
        with repository.begin() as uow:
            instance_id = uow.instances.select_or_create(key).instance.id
            execution = uow.executions.create(instance_id)
            execution = uow.executions.transition(
                execution.id, execution.version, LifecycleTransition.new(S.STARTED, clock.advance())
            )
            step = uow.flow.create_step(execution.id, StepName("load"), NodeId("load"))
            step = uow.steps.transition(
                step.id, step.version, LifecycleTransition.new(S.STARTED, clock.advance())
            )
            uow.commit()
        service.stop(OperationId(f"stop-{run}-{attempt}"), OPS, execution.id)
        with repository.begin() as uow:
            current = uow.executions.get(execution.id)
            step_now = uow.steps.get(step.id)
            assert current is not None and step_now is not None
            at = clock.advance()
            if end is S.FAILED:
                failure = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(execution.id))
                transition = LifecycleTransition.failed(at, failure)
                step_transition = LifecycleTransition.failed(
                    at, FailureSummary(FailureCategory.USER_COMPONENT, FailureId(step.id))
                )
            else:
                transition = LifecycleTransition.new(end, at)
                step_transition = LifecycleTransition.new(
                    S.COMPLETED if end is S.COMPLETED else S.STOPPED, at
                )
            uow.steps.transition(step.id, step_now.version, step_transition)
            if end is S.ABANDONED:  # STARTED -> STOPPED -> ABANDONED
                current = uow.executions.transition(
                    current.id, current.version, LifecycleTransition.new(S.STOPPED, at)
                )
            if end is not S.STARTED:
                uow.executions.transition(current.id, current.version, transition)
            uow.commit()
    return instance_id


def request(
    *statuses: S, batch: int = 1000, forget: bool = False, name: str = "loads"
) -> PurgePlanRequest:
    return PurgePlanRequest(
        job_name=JobName(name),
        statuses=TerminalStatusSet.of(statuses or (S.COMPLETED,)),
        minimum_age=HOUR,
        batch=PurgeBatchBound(batch),
        forget_instances=forget,
    )


def rows(admin: psycopg.Connection[Any], table: str) -> int:
    row = admin.execute(f"SELECT count(*) FROM pybatch.{table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def retention(repository: JobRepository) -> RetentionService:
    return RetentionService(repository)


# --------------------------------------------------------------------------- values


def test_retention_values_refuse_bad_input() -> None:
    with pytest.raises(BatchBoundOutOfRange):
        PurgeBatchBound(0)
    with pytest.raises(BatchBoundOutOfRange):
        PurgeBatchBound(1001)
    with pytest.raises(EmptyStatusSet):
        TerminalStatusSet.of([])
    with pytest.raises(NonTerminalStatus) as active:
        TerminalStatusSet.of([S.COMPLETED, S.STARTED])
    assert active.value.status == "STARTED"
    with pytest.raises(AgeBoundTooSmall):
        attrs.evolve(request(), minimum_age=datetime.timedelta(minutes=59))


def test_retention_value_bounds_accept_their_limits_and_name_them() -> None:
    # A12: 1 and 1000 accepted, 1000 by default.
    assert PurgeBatchBound(1).value == 1
    assert PurgeBatchBound(1000).value == 1000
    assert PurgeBatchBound().value == 1000
    # A13: {FAILED, ABANDONED} accepted as exactly those two.
    chosen = TerminalStatusSet.of([S.FAILED, S.ABANDONED])
    assert chosen.statuses == frozenset({S.FAILED, S.ABANDONED})
    # A14: 3599 s refused naming the one-hour bound; exactly 3600 s accepted.
    with pytest.raises(AgeBoundTooSmall) as young:
        attrs.evolve(request(), minimum_age=datetime.timedelta(seconds=3599))
    assert young.value.minimum == "1 hour"
    assert str(young.value) == "the minimum age of a purge is 1 hour"
    at_bound = attrs.evolve(request(), minimum_age=datetime.timedelta(seconds=3600))
    assert at_bound.minimum_age == datetime.timedelta(hours=1)


def test_a_terminal_status_set_built_directly_is_validated_like_of() -> None:
    with pytest.raises(EmptyStatusSet):
        TerminalStatusSet(frozenset())
    with pytest.raises(NonTerminalStatus) as unknown:
        TerminalStatusSet(frozenset({S.FAILED, S.UNKNOWN}))
    assert unknown.value.status == "UNKNOWN"
    with pytest.raises(NonTerminalStatus) as active:
        attrs.evolve(TerminalStatusSet.of([S.STOPPED]), statuses=frozenset({S.STARTING}))
    assert active.value.status == "STARTING"
    for bad in (frozenset({"COMPLETED"}), {S.COMPLETED}, [S.COMPLETED]):
        with pytest.raises(TypeError):
            TerminalStatusSet(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TerminalStatusSet.of("COMPLETED")  # type: ignore[arg-type]
    chosen = TerminalStatusSet(frozenset({S.ABANDONED, S.FAILED}))
    assert chosen == TerminalStatusSet.of([S.FAILED, S.ABANDONED])
    assert chosen.ordered() == [S.FAILED, S.ABANDONED]


# --------------------------------------------------------------------------- holds (J1-J3)


def test_a_hold_is_placed_read_and_released_on_known_instances_only(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario J1, J2."""
    instance_id = history(repository, clock, "a", S.COMPLETED)
    with repository.begin() as uow:
        with pytest.raises(JobInstanceNotFound) as read_missing:
            uow.holds.get(987654)
        with pytest.raises(JobInstanceNotFound) as place_missing:
            uow.holds.place_unless_held(987654, OPS, LEGAL, clock.now())
        with pytest.raises(JobInstanceNotFound) as release_missing:
            uow.holds.release(987654)
        for missing in (read_missing, place_missing, release_missing):
            assert missing.value.id == 987654
        assert uow.holds.get(instance_id) is None
        assert uow.holds.release(instance_id) is None
        first, _ = uow.holds.place_unless_held(instance_id, OPS, LEGAL, clock.now())
        second, replaced = uow.holds.place_unless_held(
            instance_id, ActorRef("cli:b"), ReasonCode("AUDIT"), clock.advance()
        )
        assert replaced
        assert uow.holds.get(instance_id) == second != first
        assert uow.holds.release(instance_id) == second
        assert uow.holds.get(instance_id) is None
        uow.commit()


def test_a_held_instance_is_not_surveyed_but_still_runs(
    repository: JobRepository, clock: ManualClock, retention: RetentionService
) -> None:
    """Scenario J3."""
    held = history(repository, clock, "held", S.FAILED)
    free = history(repository, clock, "free", S.FAILED)
    retention.hold(OperationId("hold-1"), OPS, held, LEGAL)
    clock.advance(2 * HOUR)
    plan = retention.plan(request(S.FAILED))
    assert plan.instance_ids == [free]
    with repository.begin() as uow:  # a hold never blocks lifecycle work
        restarted = uow.executions.create(held)
        uow.commit()
    assert restarted.attempt == 2


# --------------------------------------------------------------------------- survey (J4-J7)


def server_now(admin: psycopg.Connection[Any]) -> datetime.datetime:
    row = admin.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    instant: datetime.datetime = row[0]
    return instant


def test_the_age_bound_is_measured_on_the_database_clock(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """The cutoff is the server's clock minus the age: the purging client's clock is ignored.

    Scenario J4.
    """
    server = server_now(admin)
    clock.set(server - HOUR + datetime.timedelta(minutes=10))
    young = history(repository, clock, "young", S.COMPLETED)
    clock.set(server - HOUR - datetime.timedelta(minutes=1))
    old = history(repository, clock, "old", S.COMPLETED)
    for purging_client in (
        server + datetime.timedelta(days=30),
        server - datetime.timedelta(days=30),
    ):
        clock.set(purging_client)
        with repository.begin() as uow:
            candidates = uow.retention.survey(request()).candidates
        assert [c.job_instance_id for c in candidates] == [old]
    assert young != old


def test_only_whole_finished_histories_whose_latest_status_matches_are_surveyed(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario J5, J14."""
    history(repository, clock, "running", S.FAILED, S.STARTED)
    history(repository, clock, "unknown", S.UNKNOWN)
    mixed = history(repository, clock, "mixed", S.FAILED, S.COMPLETED)
    history(repository, clock, "other-job", S.COMPLETED, name="others")
    clock.advance(2 * HOUR)
    with repository.begin() as uow:
        assert uow.retention.survey(request(S.FAILED)).candidates == ()  # mixed's latest: COMPLETED
        survey = uow.retention.survey(request(S.COMPLETED))
    assert {c.job_instance_id for c in survey.candidates} == {mixed}
    assert len(survey.candidates) == 2  # both attempts, together


def test_purge_batches_never_split_an_instance(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario J6."""
    big = history(repository, clock, "big", S.FAILED, S.FAILED, S.COMPLETED)
    small = history(repository, clock, "small", S.COMPLETED)
    clock.advance(2 * HOUR)
    with repository.begin() as uow:
        alone = uow.retention.survey(request(batch=2))
        assert {c.job_instance_id for c in alone.candidates} == {big}  # larger than the bound
        both = uow.retention.survey(request(batch=4))
        assert {c.job_instance_id for c in both.candidates} == {big, small}
        first = uow.retention.survey(request(batch=3))
        assert {c.job_instance_id for c in first.candidates} == {big}


# --------------------------------------------------------------------------- apply (J7-J17)


def test_apply_deletes_what_the_survey_counted_and_leaves_tombstones(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario J7, J8, J15."""
    gone = history(repository, clock, "gone", S.FAILED, S.COMPLETED)
    kept = history(repository, clock, "kept", S.FAILED)
    retention.hold(OperationId("hold-gone"), OPS, gone, LEGAL)
    retention.release(OperationId("release-gone"), OPS, gone, ReasonCode("RELEASED"))
    clock.advance(2 * HOUR)
    plan = retention.plan(request())
    assert plan.counts == PurgeCounts(
        flow_decisions=0,
        recovery_decisions=0,
        operator_requests=2,
        step_partitions=0,
        step_executions=2,
        job_executions=2,
        job_instances=1,
    )
    before = {table: rows(admin, table) for table in ("job_execution", "step_execution")}
    outcome = retention.apply(OperationId("purge-1"), OPS, ReasonCode("RETENTION"), plan)
    assert outcome.outcome == "APPLIED"
    assert outcome.counts == plan.counts  # nothing changed in between: the same rows
    assert rows(admin, "job_execution") == before["job_execution"] - 2
    assert rows(admin, "step_execution") == before["step_execution"] - 2
    with repository.begin() as uow:
        assert uow.executions.of_instance(gone) == []
        assert len(uow.executions.of_instance(kept)) == 1
        tombstone = admin.execute(
            "SELECT final_status, purged_at IS NOT NULL, last_attempt FROM pybatch.job_instance"
            " WHERE id = %s",
            (gone,),
        ).fetchone()
        assert tombstone == ("COMPLETED", True, 2)
        with pytest.raises(CompletedInstance) as completed:
            uow.executions.create(gone)
        assert "its history was purged" in str(completed.value)
    # Retention records survive; the audit chain accounts for every purged record.
    assert rows(admin, "retention_action") == 3
    assert verify_audit_chain(repository).intact
    assert rows(admin, "audit_chain_purge") == 2


def test_a_failed_tombstone_starts_again_from_scratch(
    repository: JobRepository, clock: ManualClock, retention: RetentionService
) -> None:
    """Scenario J14."""
    failed = history(repository, clock, "failed", S.FAILED, S.FAILED)
    abandoned = history(repository, clock, "abandoned", S.ABANDONED)
    clock.advance(2 * HOUR)
    plan = retention.plan(request(S.FAILED, S.ABANDONED))
    retention.apply(OperationId("purge-1"), OPS, ReasonCode("RETENTION"), plan)
    with repository.begin() as uow:
        again = uow.executions.create(failed)
        assert (again.attempt, again.restart_of_execution_id) == (3, None)
        with pytest.raises(AbandonedInstance) as purged:
            uow.executions.create(abandoned)
        assert purged.value.purged


def test_forgetting_instances_erases_them_and_keeps_the_audit_chain_intact(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario J14, J17."""
    instance_id = history(repository, clock, "erase", S.COMPLETED)
    retention.hold(OperationId("hold-1"), OPS, instance_id, LEGAL)
    retention.release(OperationId("release-1"), OPS, instance_id, ReasonCode("RELEASED"))
    clock.advance(2 * HOUR)
    plan = retention.plan(request(forget=True))
    outcome = retention.apply(OperationId("purge-1"), OPS, ReasonCode("ERASURE"), plan)
    assert outcome.counts.job_instances == 1
    key = Job(repository, "loads", {"run": "erase"}).key
    with repository.begin() as uow:
        assert uow.instances.find(key) is None
        selection = uow.instances.select_or_create(key)
        uow.commit()
    assert selection.instance.id > instance_id
    detached = admin.execute(
        "SELECT count(*) FROM pybatch.retention_action WHERE job_instance_id IS NULL"
    ).fetchone()
    assert detached == (3,)  # hold, release and the purge itself
    assert verify_audit_chain(repository).intact


def test_stale_purge_plans_delete_nothing(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario J9-J13."""
    versioned = history(repository, clock, "versioned", S.FAILED)
    held = history(repository, clock, "held", S.FAILED)
    restarted = history(repository, clock, "restarted", S.FAILED)
    clock.advance(2 * HOUR)
    reason = ReasonCode("RETENTION")
    before = rows(admin, "job_execution")

    plan = retention.plan(request(S.FAILED))
    latest_id = _latest(repository, versioned)
    with repository.begin() as uow:  # the candidate moves on: FAILED to ABANDONED
        latest = uow.executions.get(latest_id)
        assert latest is not None
        uow.executions.transition(
            latest.id, latest.version, LifecycleTransition.new(S.ABANDONED, clock.now())
        )
        uow.commit()
    with pytest.raises(RetentionPlanStale):  # J9: a candidate's version changed
        retention.apply(OperationId("p-1"), OPS, reason, plan)

    plan = retention.plan(request(S.FAILED))
    retention.hold(OperationId("hold-1"), OPS, held, LEGAL)
    with pytest.raises(RetentionPlanStale):  # J10: a hold placed after the plan
        retention.apply(OperationId("p-2"), OPS, reason, plan)

    plan = retention.plan(request(S.FAILED))
    with repository.begin() as uow:
        uow.executions.create(restarted)  # J11: an unresolved attempt appeared
        uow.commit()
    with pytest.raises(RetentionPlanStale):
        retention.apply(OperationId("p-3"), OPS, reason, plan)
    assert rows(admin, "job_execution") == before + 1  # nothing was deleted
    assert rows(admin, "retention_action") == 1  # only the hold

    empty = retention.plan(request(S.FAILED))
    assert empty.is_empty()  # J13
    assert retention.apply(OperationId("p-4"), OPS, reason, empty).counts == PurgeCounts()


def test_a_plan_applied_twice_is_stale_or_replayed(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario J12."""
    history(repository, clock, "once", S.COMPLETED)
    clock.advance(2 * HOUR)
    plan = retention.plan(request())
    reason = ReasonCode("RETENTION")
    first = retention.apply(OperationId("p-1"), OPS, reason, plan)
    assert first.outcome == "APPLIED"
    assert retention.apply(OperationId("p-1"), OPS, reason, plan).outcome == "REPLAYED"
    actions = rows(admin, "retention_action")
    with pytest.raises(RetentionPlanStale):
        retention.apply(OperationId("p-2"), OPS, reason, plan)
    assert rows(admin, "retention_action") == actions  # the stale apply recorded nothing


def test_the_plan_digest_is_stable_and_depends_on_the_request(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario J16."""
    instance_id = history(repository, clock, "d", S.FAILED)
    clock.advance(2 * HOUR)
    service = RetentionService(repository)
    first, again = service.plan(request(S.FAILED)), service.plan(request(S.FAILED))
    assert first.digest == again.digest and len(first.digest) == 32
    with repository.begin() as uow:
        [execution] = uow.executions.of_instance(instance_id)
        uow.stop_requests.request(execution.id, execution.version, OPS, clock.now())
        write_exit_code(uow, execution, execution.metadata.exit_status.value)
        uow.commit()
    clock.advance(2 * HOUR)
    assert service.plan(request(S.FAILED)).digest != first.digest
    assert "digest=" in repr(first) and first.digest.hex() in repr(first)


def test_a_repeated_hold_replays_and_a_reused_operation_id_conflicts(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario J18."""
    one = history(repository, clock, "one", S.COMPLETED)
    two = history(repository, clock, "two", S.COMPLETED)
    applied = retention.hold(OperationId("hold-1"), OPS, one, LEGAL)
    replay = retention.hold(OperationId("hold-1"), ActorRef("cli:other"), one, LEGAL)
    assert (applied.outcome, replay.outcome) == ("APPLIED", "REPLAYED")
    assert replay.record == applied.record
    with pytest.raises(OperationIdConflict):
        retention.hold(OperationId("hold-1"), OPS, two, LEGAL)
    with pytest.raises(OperationIdConflict):
        retention.hold(OperationId("hold-1"), OPS, one, ReasonCode("OTHER"))
    clock.advance(2 * HOUR)
    retention.release(OperationId("rel-1"), OPS, one, ReasonCode("RELEASED"))
    plan = retention.plan(request())
    retention.apply(OperationId("purge-1"), OPS, ReasonCode("RETENTION"), plan)
    other = PurgePlan.new(request(batch=7), _survey_of(plan))
    with pytest.raises(OperationIdConflict):
        retention.apply(OperationId("purge-1"), OPS, ReasonCode("RETENTION"), other)
    assert rows(admin, "retention_action") == 3


def test_a_plan_missing_one_attempt_of_an_instance_is_stale(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario J9."""
    history(repository, clock, "two", S.FAILED, S.COMPLETED)
    clock.advance(2 * HOUR)
    whole = retention.plan(request())
    assert len(whole.candidates) == 2
    before = rows(admin, "job_execution")
    bumped = attrs.evolve(whole.candidates[0], version=whole.candidates[0].version + 1)
    for candidates in (
        whole.candidates[1:],  # the older attempt left out
        (whole.candidates[0], whole.candidates[0], whole.candidates[1]),  # one listed twice
        (bumped, *whole.candidates[1:]),  # a version that never was
    ):
        forged = PurgePlan.new(request(), PurgeSurvey(candidates, whole.counts))
        with pytest.raises(RetentionPlanStale):
            retention.apply(OperationId(f"forged-{len(candidates)}"), OPS, LEGAL, forged)
    assert rows(admin, "job_execution") == before
    assert rows(admin, "retention_action") == 0
    assert retention.apply(OperationId("whole"), OPS, LEGAL, whole).counts.job_executions == 2


def test_a_retained_reference_still_fails_the_whole_delete(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """The histories go in one statement; RESTRICT still refuses a retained reference."""
    gone = history(repository, clock, "gone", S.COMPLETED)
    kept = history(repository, clock, "kept", S.FAILED)
    clock.advance(2 * HOUR)
    plan = retention.plan(request())
    assert plan.instance_ids == [gone]
    with repository.begin() as uow:
        [kept_execution] = uow.executions.of_instance(kept)
    step = admin.execute(
        "SELECT s.id FROM pybatch.step_execution AS s"
        " JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id"
        " WHERE e.job_instance_id = %s",
        (gone,),
    ).fetchone()
    assert step is not None
    # Never written by pybatch (the retained-chain rule keeps references inside an instance):
    # a decision of the kept history citing a step of the purged one.
    admin.execute(
        "INSERT INTO pybatch.flow_decision (job_execution_id, source_step_execution_id,"
        " sequence, source_node_id, observed_outcome, transition_kind, terminal_kind,"
        " plan_fingerprint, input_digest, decided_at)"
        " VALUES (%s, %s, 1, 'load', 'COMPLETED', 'STEP_EXIT', 'COMPLETE', %s, %s, now())",
        (kept_execution.id, step[0], bytes(32), bytes(32)),
    )
    before = {t: rows(admin, t) for t in ("job_execution", "step_execution", "flow_decision")}
    with pytest.raises(IntegrityViolation) as refused:
        retention.apply(OperationId("p-1"), OPS, ReasonCode("RETENTION"), plan)
    assert refused.value.constraint == "flow_decision_source_step_execution_fk"
    assert {t: rows(admin, t) for t in before} == before
    assert rows(admin, "retention_action") == 0
    tombstone = admin.execute(
        "SELECT final_status FROM pybatch.job_instance WHERE id = %s", (gone,)
    ).fetchone()
    assert tombstone == (None,)


def test_a_purge_ends_only_when_a_survey_from_the_start_finds_nothing(
    repository: JobRepository, clock: ManualClock, retention: RetentionService
) -> None:
    """Batches continue after the previous one; a hold released behind them is not missed."""
    first = history(repository, clock, "first", S.COMPLETED)
    held = history(repository, clock, "held", S.COMPLETED)
    last = history(repository, clock, "last", S.COMPLETED)
    retention.hold(OperationId("hold-1"), OPS, held, LEGAL)
    clock.advance(2 * HOUR)
    purged: list[int] = []
    for progress in retention.purge(request(batch=1), "purge", OPS, ReasonCode("RETENTION")):
        with repository.begin() as uow:
            purged += [i for i in (first, held, last) if not uow.executions.of_instance(i)]
        if progress.batch == 2:  # `first` and `last` are gone: the survey is past `held`
            retention.release(OperationId("release-1"), OPS, held, ReasonCode("RELEASED"))
    assert progress.batch == 3 and progress.total.job_instances == 3
    assert purged[:1] == [first] and sorted(set(purged)) == sorted([first, held, last])
    assert retention.plan(request()).is_empty()


def _survey_of(plan: PurgePlan) -> Any:
    return PurgeSurvey(plan.candidates, plan.counts, plan.final_statuses)


def _latest(repository: JobRepository, instance_id: int) -> int:
    with repository.begin() as uow:
        return uow.executions.of_instance(instance_id)[-1].id


# --------------------------------------------------------------------------- races


@pytest.mark.race
def test_race_purge_against_a_restart_of_the_same_instance(
    repository: JobRepository, clock: ManualClock, retention: RetentionService
) -> None:
    for round_ in range(6):
        instance_id = history(repository, clock, f"race-{round_}", S.FAILED)
        clock.advance(2 * HOUR)
        plan = retention.plan(request(S.FAILED))
        assert plan.instance_ids == [instance_id]

        def contender(
            index: int, round_: int = round_, plan: PurgePlan = plan, instance_id: int = instance_id
        ) -> str:
            if index == 0:
                retention.apply(OperationId(f"p-{round_}"), OPS, ReasonCode("RETENTION"), plan)
                return "purged"
            with repository.begin() as uow:
                uow.executions.create(instance_id)
                uow.commit()
            return "restarted"

        outcomes = race(2, contender)
        with repository.begin() as uow:
            left = uow.executions.of_instance(instance_id)
        purge, restart = outcomes
        if purge.ok:
            # The purge locked first: the restart waited, then started attempt 2 from scratch
            # on the FAILED tombstone; or the restart found nothing to restart yet.
            assert restart.ok and [e.attempt for e in left] == [2]
            assert left[0].restart_of_execution_id is None
        else:
            # The restart committed first: the plan went stale and nothing was deleted.
            assert isinstance(purge.error, RetentionPlanStale) and restart.ok
            assert [e.attempt for e in left] == [1, 2]
        with repository.begin() as uow:  # leave the instance finished for the next round
            current = left[-1]
            started = uow.executions.transition(
                current.id, current.version, LifecycleTransition.new(S.STARTED, clock.advance())
            )
            uow.executions.transition(  # COMPLETED: out of the next rounds' FAILED purges
                started.id, started.version, LifecycleTransition.new(S.COMPLETED, clock.advance())
            )
            uow.commit()


@pytest.mark.race
def test_race_a_hold_placed_mid_plan(
    repository: JobRepository, clock: ManualClock, retention: RetentionService, admin: Any
) -> None:
    for round_ in range(6):
        instance_id = history(repository, clock, f"hold-{round_}", S.COMPLETED)
        clock.advance(2 * HOUR)
        plan = retention.plan(request())
        assert plan.instance_ids == [instance_id]

        def contender(
            index: int, round_: int = round_, plan: PurgePlan = plan, instance_id: int = instance_id
        ) -> str:
            if index == 0:
                retention.apply(OperationId(f"p-{round_}"), OPS, ReasonCode("RETENTION"), plan)
                return "purged"
            retention.hold(OperationId(f"h-{round_}"), OPS, instance_id, LEGAL)
            return "held"

        purge, hold = race(2, contender)
        assert hold.ok  # a hold waits for the purge, then holds the tombstone
        with repository.begin() as uow:
            remaining = uow.executions.of_instance(instance_id)
            assert uow.holds.get(instance_id) is not None
        if purge.ok:
            assert remaining == []
        else:
            assert isinstance(purge.error, RetentionPlanStale) and len(remaining) == 1
    assert verify_audit_chain(repository).intact


@pytest.mark.race
def test_race_two_purges_at_once(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    for run in range(5):
        history(repository, clock, f"two-{run}", S.COMPLETED)
    clock.advance(2 * HOUR)
    plan = retention.plan(request())
    outcomes = race(
        2,
        lambda index: retention.apply(
            OperationId(f"p-{index}"), OPS, ReasonCode("RETENTION"), plan
        ),
    )
    applied = [o for o in outcomes if o.ok]
    stale = [o for o in outcomes if not o.ok]
    assert len(applied) == 1 and len(stale) == 1
    assert isinstance(stale[0].error, RetentionPlanStale)
    assert applied[0].value is not None and applied[0].value.counts.job_executions == 5
    assert rows(admin, "job_execution") == 0
    assert rows(admin, "retention_action") == 1
    assert verify_audit_chain(repository).intact


def test_survey_and_apply_count_every_dependent_kind_of_row(
    repository: JobRepository,
    clock: ManualClock,
    retention: RetentionService,
    admin: psycopg.Connection[Any],
) -> None:
    """A history with a flow decision, a partition and a recovery decision: the survey counts
    each kind, and the apply deletes exactly those rows and reports the same counts.

    Scenario J7, J8.
    """
    with repository.begin() as uow:
        key = JobInstanceKey(JobName("flows"), JobParameters.of({"run": "rich"}))
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id, FLOW_DEFINITION)
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        steps = {}
        for node in ("extract", "load"):
            step = uow.flow.create_step(execution.id, StepName(node), NodeId(node))
            steps[node] = uow.steps.transition(
                step.id, 0, LifecycleTransition.new(S.STARTED, clock.advance())
            )
        (partition,) = uow.partitions.create_plan(
            steps["load"].id, [PartitionPlanEntry("a", ExecutionContext(STATE_SCHEMA, 1, {}))]
        )
        uow.commit()
    with repository.begin() as uow:
        claimed = uow.partitions.claim(steps["load"])
        assert claimed is not None and claimed[0].id == partition.id
        assigned, worker = claimed
        completed = LifecycleTransition.new(S.COMPLETED, clock.advance())
        uow.partitions.end_worker(assigned.id, assigned.version, worker.id, completed, None)
        uow.partitions.aggregate(steps["load"].id, steps["load"].version, clock.advance())
        extract = uow.steps.transition(
            steps["extract"].id,
            steps["extract"].version,
            LifecycleTransition.new(S.COMPLETED, clock.advance()),
        )
        uow.flow.append_decision(flow_decision_request(execution, source_step=extract.id))
        uow.commit()
    with repository.begin() as uow:  # an orphaned run, recovered FAILED
        current = uow.executions.get(execution.id)
        assert current is not None
        uow.recovery.recover(execution.id, mark_failed(current.version))
        uow.commit()
    clock.advance(2 * HOUR)
    plan = retention.plan(request(S.FAILED, name="flows"))
    expected = PurgeCounts(
        flow_decisions=1,
        recovery_decisions=1,
        operator_requests=0,
        step_partitions=1,
        step_executions=3,
        job_executions=1,
        job_instances=1,
    )
    assert plan.counts == expected
    outcome = retention.apply(OperationId("purge-rich"), OPS, ReasonCode("RETENTION"), plan)
    assert outcome.counts == expected
    for table in (
        "flow_decision",
        "recovery_decision",
        "step_partition",
        "step_execution",
        "job_execution",
    ):
        assert rows(admin, table) == 0, table
