"""Recovery of orphaned or ambiguous executions (G1-G11, L6), and the
flow-step starts recovery relies on (state copied across attempts, start limits: E5,
E21, L5).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pybatch import JobRepository, UnitOfWork
from pybatch._chunks import StepSession
from pybatch._fault_state import FaultState, RetryPolicy
from pybatch.errors import (
    AbandonedInstance,
    DuplicateStep,
    IntegrityViolation,
    JobExecutionNotFound,
    JobInstanceNotFound,
    RecoveryNotAllowed,
    RestartStateNotFound,
    StaleVersion,
    StartLimitExceeded,
)
from pybatch.values.chunks import ChunkContext, ChunkCounts, FaultProgress
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.flow import StartLimit
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    ClassifierRevision,
    ExitCode,
    JobName,
    NodeId,
    StateSchemaId,
    StepName,
)
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.recovery import RecoveryRequest, RecoveryResult
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.chunks import commit, inherited_progress
from tests.support.clock import ManualClock
from tests.support.owners import TEST_OWNER, claim_test_owner
from tests.support.race import race, race_units_of_work, wait_until_lock_wait
from tests.support.rows import write_exit_code
from tests.support.statements import create_step

S = BatchStatus
EVIDENCE = bytes(range(32))
STALE = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(4242))
USER = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(7))
SCHEMA = StateSchemaId("tests.orders.cursor.v1")
NODE = NodeId("load")

_keys = itertools.count(1)


# --------------------------------------------------------------------------- helpers


def new_key() -> JobInstanceKey:
    return JobInstanceKey(JobName("orders"), JobParameters.of({"run": next(_keys)}))


def to(target: BatchStatus, at: Any) -> LifecycleTransition:
    if target is S.FAILED:
        return LifecycleTransition.failed(at, USER)
    return LifecycleTransition.new(target, at)


#: A legal path from STARTING to each status.
PATHS: dict[BatchStatus, tuple[BatchStatus, ...]] = {
    S.STARTING: (),
    S.STARTED: (S.STARTED,),
    S.STOPPING: (S.STARTED, S.STOPPING),
    S.UNKNOWN: (S.STARTED, S.UNKNOWN),
    S.STOPPED: (S.STARTED, S.STOPPED),
    S.FAILED: (S.STARTED, S.FAILED),
    S.COMPLETED: (S.STARTED, S.COMPLETED),
    S.ABANDONED: (S.STARTED, S.FAILED, S.ABANDONED),
}


def execution_in(
    repository: JobRepository, clock: ManualClock, status: BatchStatus, exit_code: str = "RUNNING"
) -> JobExecution:
    """A committed job execution in `status`, with a non-default exit status."""
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        execution = write_exit_code(uow, execution, exit_code)
        for target in PATHS[status]:
            execution = uow.executions.transition(
                execution.id, execution.version, to(target, clock.advance())
            )
        uow.commit()
    assert execution.status is status
    return execution


def mark_failed(version: int) -> RecoveryRequest:
    return RecoveryRequest(version, "OWNER_LOST", "ticket-42", EVIDENCE, STALE)


def abandon(version: int) -> RecoveryRequest:
    return RecoveryRequest(version, "OPERATOR_ABANDON", "ticket-43", EVIDENCE)


def recover(
    repository: JobRepository, execution_id: int, request: RecoveryRequest
) -> RecoveryResult:
    with repository.begin() as uow:
        result = uow.recovery.recover(execution_id, request)
        uow.commit()
    return result


def stored(repository: JobRepository, execution_id: int) -> JobExecution:
    with repository.begin() as uow:
        execution = uow.executions.get(execution_id)
    assert execution is not None
    return execution


def decisions(admin: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with admin.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM pybatch.recovery_decision ORDER BY id").fetchall()


# --------------------------------------------------------------------------- G1, G2


def test_mark_failed_records_the_decision_and_allows_a_restart(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario G1, G2."""
    prior = execution_in(repository, clock, S.STARTED)
    decided_at = clock.advance(timedelta(minutes=20))
    result = recover(repository, prior.id, mark_failed(prior.version))

    recovered = result.execution
    assert recovered == stored(repository, prior.id)
    assert recovered.status is S.FAILED
    assert recovered.version == prior.version + 1
    assert recovered.metadata.exit_status == ExitCode("RUNNING")  # exit unchanged
    assert recovered.metadata.failure == STALE
    assert recovered.metadata.counts == prior.metadata.counts
    times = recovered.metadata.timestamps
    assert (times.created_at, times.started_at, times.ended_at) == (
        prior.created_at,
        prior.metadata.timestamps.started_at,
        decided_at,
    )
    assert recovered.updated_at == decided_at

    [decision] = decisions(admin)
    assert decision["id"] == result.decision.id
    assert decision["job_execution_id"] == prior.id
    assert decision["execution_version"] == prior.version  # observed before the decision
    assert (decision["prior_status"], decision["resulting_status"]) == ("STARTED", "FAILED")
    assert (decision["reason_code"], decision["operator_reference"]) == ("OWNER_LOST", "ticket-42")
    assert bytes(decision["evidence_digest"]) == EVIDENCE
    assert decision["decided_at"] == decided_at

    with repository.begin() as uow:
        restarted = uow.executions.create(prior.job_instance_id)
        uow.commit()
    assert (restarted.attempt, restarted.restart_of_execution_id) == (2, prior.id)


# --------------------------------------------------------------------------- G3, G4


def test_abandon_clears_the_failure_keeps_the_exit_and_ends_the_instance(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario G3."""
    with repository.begin() as uow:
        prior = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        prior = write_exit_code(uow, prior, "IN_DOUBT")
        prior = uow.executions.transition(prior.id, prior.version, to(S.STARTED, clock.advance()))
        prior = uow.executions.transition(
            prior.id, prior.version, LifecycleTransition(S.UNKNOWN, clock.advance(), USER)
        )
        uow.commit()
    assert prior.status is S.UNKNOWN and prior.metadata.failure == USER
    decided_at = clock.advance()
    result = recover(repository, prior.id, abandon(prior.version))
    for execution in (result.execution, stored(repository, prior.id)):
        assert execution.status is S.ABANDONED
        assert execution.metadata.failure is None  # the request's failure: none
        assert execution.metadata.exit_status == ExitCode("IN_DOUBT")
        assert execution.metadata.timestamps.ended_at == decided_at
        assert execution.version == prior.version + 1
    [decision] = decisions(admin)
    assert (decision["prior_status"], decision["resulting_status"]) == ("UNKNOWN", "ABANDONED")
    assert decision["reason_code"] == "OPERATOR_ABANDON"
    with repository.begin() as uow, pytest.raises(AbandonedInstance):
        uow.executions.create(prior.job_instance_id)


@pytest.mark.parametrize(
    ("status", "request_for", "result"),
    [
        (S.STARTING, abandon, S.ABANDONED),  # G4: the lifecycle table forbids this one
        (S.STARTING, mark_failed, S.FAILED),
        (S.STOPPING, mark_failed, S.FAILED),
        (S.STARTED, abandon, S.ABANDONED),
    ],
)
def test_recovery_bypasses_the_lifecycle_table(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    status: BatchStatus,
    request_for: Any,
    result: BatchStatus,
) -> None:
    """Scenario G4."""
    prior = execution_in(repository, clock, status)
    recovered = recover(repository, prior.id, request_for(prior.version)).execution
    assert (recovered.status, recovered.version) == (result, prior.version + 1)
    assert stored(repository, prior.id) == recovered
    [decision] = decisions(admin)
    assert (decision["prior_status"], decision["resulting_status"]) == (status.value, result.value)


# --------------------------------------------------------------------------- G5, G6, G7, G9


def test_finished_executions_cannot_be_recovered(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario G5."""
    for status in (S.FAILED, S.STOPPED, S.COMPLETED, S.ABANDONED):
        prior = execution_in(repository, clock, status)
        for request in (mark_failed(prior.version), abandon(prior.version)):
            with repository.begin() as uow, pytest.raises(RecoveryNotAllowed) as refused:
                uow.recovery.recover(prior.id, request)
            assert (refused.value.id, refused.value.status) == (prior.id, status.value)
        assert stored(repository, prior.id) == prior
    assert decisions(admin) == []


def test_stale_and_replayed_recovery_requests_are_stale_version(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario G6."""
    prior = execution_in(repository, clock, S.STARTED)
    with repository.begin() as uow, pytest.raises(StaleVersion) as stale:
        uow.recovery.recover(prior.id, mark_failed(prior.version - 1))
    assert (stale.value.expected, stale.value.actual) == (prior.version - 1, prior.version)
    request = mark_failed(prior.version)
    recovered = recover(repository, prior.id, request).execution
    clock.advance()
    for replay in (
        request,
        abandon(prior.version),
    ):  # a replayed recovery is stale, never re-applied
        with repository.begin() as uow, pytest.raises(StaleVersion) as stale:
            uow.recovery.recover(prior.id, replay)
        assert (stale.value.expected, stale.value.actual) == (prior.version, prior.version + 1)
    # At the new version the execution is FAILED, which is not recoverable.
    with repository.begin() as uow, pytest.raises(RecoveryNotAllowed):
        uow.recovery.recover(prior.id, abandon(recovered.version))
    assert stored(repository, prior.id) == recovered
    assert len(decisions(admin)) == 1


def test_unknown_executions_are_not_found_and_a_clock_behind_the_start_never_blocks_recovery(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario G7, G9."""
    prior = execution_in(repository, clock, S.STARTED)
    with repository.begin() as uow, pytest.raises(JobExecutionNotFound) as missing:
        uow.recovery.recover(prior.id + 1000, mark_failed(0))
    assert missing.value.id == prior.id + 1000

    # The run was stamped by a clock an hour ahead of the recovering one: recovery still
    # succeeds, and its end time is the stored start (never before it), so the execution's
    # timestamps stay ordered and the run does not stay STARTED forever.
    started_at = prior.metadata.timestamps.started_at
    assert started_at is not None
    clock.set(clock.now() - timedelta(hours=1))
    result = recover(repository, prior.id, mark_failed(prior.version))
    times = result.execution.metadata.timestamps
    assert result.execution.status is S.FAILED
    assert times.ended_at == started_at
    assert result.decision.decided_at == started_at
    assert stored(repository, prior.id) == result.execution
    [decision] = decisions(admin)
    assert decision["decided_at"] == started_at


def test_two_recoveries_at_one_version_make_one_decision(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L6."""
    prior = execution_in(repository, clock, S.STARTED)
    requests = [mark_failed(prior.version), abandon(prior.version)]
    outcomes = race_units_of_work(
        repository, 2, lambda uow, index: uow.recovery.recover(prior.id, requests[index])
    )
    winners = [outcome for outcome in outcomes if outcome.ok]
    losers = [outcome for outcome in outcomes if not outcome.ok]
    assert len(winners) == 1 and len(losers) == 1
    assert isinstance(losers[0].error, StaleVersion)
    winner = winners[0].value
    assert winner is not None
    [decision] = decisions(admin)
    assert decision["id"] == winner.decision.id
    assert decision["resulting_status"] == winner.execution.status.value
    assert stored(repository, prior.id) == winner.execution
    assert winner.execution.version == prior.version + 1


# --------------------------------------------------------------------------- flow steps


def attempt(repository: JobRepository, clock: ManualClock, instance_id: int) -> JobExecution:
    """The next attempt of an instance, STARTED."""
    with repository.begin() as uow:
        execution = uow.executions.create(instance_id)
        execution = claim_test_owner(uow, execution, clock.advance())
        execution = uow.executions.transition(
            execution.id, execution.version, to(S.STARTED, clock.advance())
        )
        uow.commit()
    return execution


def fail_attempt(repository: JobRepository, clock: ManualClock, execution: JobExecution) -> None:
    """Fail every open step of the attempt, then the attempt itself."""
    with repository.begin() as uow:
        for step in uow.steps.of_execution(execution.id):
            if step.status.is_active:
                uow.steps.transition(step.id, step.version, to(S.FAILED, clock.advance()))
        current = uow.executions.get(execution.id)
        assert current is not None
        uow.executions.transition(current.id, current.version, to(S.FAILED, clock.advance()))
        uow.commit()


def run_node(
    repository: JobRepository,
    clock: ManualClock,
    execution: JobExecution,
    name: str,
    offset: int,
    limit: StartLimit | None = None,
) -> StepExecution:
    """Start node NODE as step `name`, commit one chunk to `offset` and spend one retry."""
    with repository.begin() as uow:
        step = uow.flow.create_step(execution.id, StepName(name), NODE, limit)
        step = uow.steps.transition(step.id, step.version, to(S.STARTED, clock.advance()))
        uow.commit()
    context = ChunkContext(step.id, execution.id, TEST_OWNER)
    with contextlib.closing(StepSession(repository, context)) as session, session.begin() as chunk:
        commit(
            chunk,
            ChunkCounts(read=offset, processed=offset, written=offset - 1, filtered=1),
            FaultProgress(read_skips=1, write_skips=offset, no_rollbacks=2),
            checkpoint=Checkpoint(SCHEMA, 1, {"offset": offset}),
            context=ExecutionContext(SCHEMA, 1, {"file": f"part-{offset}"}),
        )
    fault_state = FaultState(repository, RetryPolicy(RetryLimit(3), RetryStateLimit(8)))
    fault_state.bind(context)
    fault_state.reserve(
        FaultEntry(
            key=RetryKey(bytes([offset]) * 32),
            phase=FaultPhase.WRITE,
            category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
            ordinal=RetryOrdinal(1),
            revision=ClassifierRevision("classifier-1"),
        )
    )
    with repository.begin() as uow:
        current = uow.steps.get(step.id)
    assert current is not None
    return current


def durable_columns(admin: psycopg.Connection[Any], step_id: int) -> dict[str, Any]:
    """Every durable state column a restart copies to resume where the last attempt stopped."""
    with admin.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            """
            SELECT read_count, processed_count, write_count, filter_count, commit_count,
                rollback_count, checkpoint_format, checkpoint_schema, checkpoint_schema_version,
                checkpoint_payload, context_format, context_schema, context_schema_version,
                context_payload, read_retry_count, process_retry_count, write_retry_count,
                read_skip_count, process_skip_count, write_skip_count, no_rollback_count,
                fault_state_format, fault_state_schema, fault_state_schema_version,
                fault_state_payload, fault_state_checksum
            FROM pybatch.step_execution WHERE id = %s
            """,
            (step_id,),
        ).fetchone()
    assert row is not None
    return row


def test_flow_step_copies_the_newest_state_of_its_node_across_attempts(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario E21."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.commit()
    first = attempt(repository, clock, instance.id)
    source_1 = run_node(repository, clock, first, "load", offset=3)
    fail_attempt(repository, clock, first)

    second = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        # A renamed step of the same node: the logical id is the restart authority.
        copy_2 = uow.flow.create_step(second.id, StepName("load-v2"), NODE)
        fresh = uow.flow.create_step(second.id, StepName("report"), NodeId("report"))
        uow.commit()
    assert (copy_2.step_name, copy_2.logical_id) == (StepName("load-v2"), NODE)
    assert (copy_2.status, copy_2.version) == (S.STARTING, 0)
    assert copy_2.metadata.exit_status == ExitCode("UNKNOWN")
    assert copy_2.metadata.failure is None
    assert copy_2.metadata.counts == source_1.metadata.counts
    assert copy_2.checkpoint == Checkpoint(SCHEMA, 1, {"offset": 3})
    assert copy_2.context == ExecutionContext(SCHEMA, 1, {"file": "part-3"})
    assert copy_2.fault_counts == source_1.fault_counts
    assert durable_columns(admin, copy_2.id) == durable_columns(admin, source_1.id)
    # The copied fault state is still valid for the copied checkpoint.
    assert inherited_progress(
        repository, ChunkContext(copy_2.id, second.id, TEST_OWNER)
    ).fault_state.ordinal_for(RetryKey(bytes([3]) * 32)) == RetryOrdinal(1)
    assert fresh.metadata.counts == ExecutionCounts() and fresh.checkpoint == Checkpoint.empty()
    assert durable_columns(admin, fresh.id)["fault_state_payload"]["entries"] == []

    with repository.begin() as uow:
        latest = uow.flow.latest_step(instance.id, NODE)
        assert latest is not None and latest.step_execution.id == copy_2.id
        assert latest.node_id == NODE
        assert latest.context == ExecutionContext(
            SCHEMA, 1, {"file": "part-3"}
        )  # the newest attempt's context wins
        assert uow.flow.latest_step(instance.id, NodeId("never-ran")) is None
        with pytest.raises(JobInstanceNotFound) as missing:
            uow.flow.latest_step(instance.id + 1000, NODE)
        assert missing.value.id == instance.id + 1000

    # Attempt 2 moves on; attempt 3 copies attempt 2 (the newest), not attempt 1.
    with repository.begin() as uow:
        uow.steps.transition(copy_2.id, 0, to(S.STARTED, clock.advance()))
        uow.commit()
    with (
        contextlib.closing(
            StepSession(repository, ChunkContext(copy_2.id, second.id, TEST_OWNER))
        ) as session,
        session.begin() as c,
    ):
        commit(c, ChunkCounts(read=2), checkpoint=Checkpoint(SCHEMA, 1, {"offset": 5}))
    fail_attempt(repository, clock, second)
    third = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        copy_3 = uow.flow.create_step(third.id, StepName("load"), NODE)
        uow.commit()
    assert copy_3.checkpoint == Checkpoint(SCHEMA, 1, {"offset": 5})
    assert copy_3.metadata.counts.read == 5 and copy_3.metadata.counts.committed == 2
    assert durable_columns(admin, copy_3.id) == durable_columns(admin, copy_2.id)


def test_restart_step_copies_the_same_named_step_of_the_previous_attempt(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario E2."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.commit()
    first = attempt(repository, clock, instance.id)
    source = run_node(repository, clock, first, "load", offset=4)  # logical id = its name
    fail_attempt(repository, clock, first)

    second = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        copy = create_step(uow, second.id, StepName("load"))
        uow.commit()
    assert (copy.status, copy.version, copy.job_execution_id) == (S.STARTING, 0, second.id)
    assert copy.metadata.exit_status == ExitCode("UNKNOWN") and copy.metadata.failure is None
    # The six counters, checkpoint, context, retry/skip/no-rollback counts and the fault
    # state envelope with its checksum: every durable column, byte for byte.
    assert copy.metadata.counts == source.metadata.counts
    assert copy.checkpoint == Checkpoint(SCHEMA, 1, {"offset": 4})
    assert copy.context == ExecutionContext(SCHEMA, 1, {"file": "part-4"})
    assert copy.fault_counts == source.fault_counts and copy.fault_counts.write_retry == 1
    assert durable_columns(admin, copy.id) == durable_columns(admin, source.id)
    assert durable_columns(admin, copy.id)["fault_state_payload"]["entries"] != []


def test_restart_step_without_a_same_named_source_is_refused(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E3."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.commit()
    first = attempt(repository, clock, instance.id)
    run_node(repository, clock, first, "load", offset=2)
    fail_attempt(repository, clock, first)

    second = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        with pytest.raises(RestartStateNotFound) as missing:
            create_step(uow, second.id, StepName("report"))
        assert (missing.value.execution_id, missing.value.step_name) == (second.id, "report")
        # Nothing was staged and the unit of work goes on (a typed refusal stages nothing).
        assert uow.steps.of_execution(second.id) == []
        copy = create_step(uow, second.id, StepName("load"))
        uow.commit()
    with repository.begin() as uow:
        assert [step.id for step in uow.steps.of_execution(second.id)] == [copy.id]


def test_node_ids_count_their_starts_apart_even_under_one_step_name(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E6."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.commit()
    once = StartLimit(1)
    first = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        uow.flow.create_step(first.id, StepName("shared"), NodeId("a"), once)
        uow.commit()
    fail_attempt(repository, clock, first)

    second = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        # Node b has never started, although a step named "shared" has.
        started = uow.flow.create_step(second.id, StepName("shared"), NodeId("b"), once)
        uow.commit()
    assert started.logical_id == NodeId("b")
    fail_attempt(repository, clock, second)

    third = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        for node in ("a", "b"):  # each started once: each is at its own limit
            with pytest.raises(StartLimitExceeded) as exceeded:
                uow.flow.create_step(third.id, StepName("shared"), NodeId(node), once)
            assert (exceeded.value.node_id, exceeded.value.limit) == (node, 1)
        uow.flow.create_step(third.id, StepName("shared"), NodeId("a"), StartLimit(2))
        uow.commit()


def test_start_limit_counts_every_attempt(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario E5."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.commit()
    limit = StartLimit(2)
    for _ in range(2):
        execution = attempt(repository, clock, instance.id)
        run_node(repository, clock, execution, "load", offset=2, limit=limit)
        fail_attempt(repository, clock, execution)
    third = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        with pytest.raises(StartLimitExceeded) as exceeded:
            uow.flow.create_step(third.id, StepName("load"), NODE, limit)
        assert (exceeded.value.instance_id, exceeded.value.node_id, exceeded.value.limit) == (
            instance.id,
            NODE.value,
            2,
        )
        # A typed refusal stages nothing; other nodes still start in the same unit of work.
        other = uow.flow.create_step(third.id, StepName("report"), NodeId("report"))
        with pytest.raises(DuplicateStep):  # one step per logical id in an execution
            uow.flow.create_step(third.id, StepName("report-2"), NodeId("report"))
        uow.commit()
    with repository.begin() as uow:
        assert [step.id for step in uow.steps.of_execution(third.id)] == [other.id]
        # A larger limit lets the node start a third time.
        started = uow.flow.create_step(third.id, StepName("load"), NODE, StartLimit(3))
        assert (started.job_execution_id, started.logical_id) == (third.id, NODE)
        assert (started.status, started.version) == (S.STARTING, 0)
        uow.commit()
    assert _starts_of_node(admin, instance.id) == 3


def _starts_of_node(admin: psycopg.Connection[Any], instance_id: int) -> int:
    row = admin.execute(
        """
        SELECT count(*) FROM pybatch.step_execution AS s
        JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id
        WHERE e.job_instance_id = %s AND s.step_logical_id = %s
        """,
        (instance_id, NODE.value),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.race
def test_two_flow_step_starts_against_a_start_limit_of_one_have_one_winner(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Two attempts of one instance start node NODE at once: the instance lock lets one in.

    Scenario L5.
    """
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        # An older attempt, FAILED already, whose process still tries to start the node.
        old = uow.executions.create(instance.id)
        old = uow.executions.transition(old.id, old.version, to(S.FAILED, clock.advance()))
        uow.commit()
    new = attempt(repository, clock, instance.id)
    targets = [old.id, new.id]

    def start(uow: UnitOfWork, index: int) -> StepExecution:
        return uow.flow.create_step(targets[index], StepName("load"), NODE, StartLimit(1))

    outcomes = race_units_of_work(repository, 2, start)
    assert sorted(outcome.ok for outcome in outcomes) == [False, True]
    [loser] = [outcome for outcome in outcomes if not outcome.ok]
    # The old attempt loses either way: to the start limit when the new one went first, or
    # at its COMMIT, where the database refuses a step opened under a finished execution
    # (migration 0006) and the new attempt's start goes through.
    assert isinstance(loser.error, StartLimitExceeded | IntegrityViolation)
    if isinstance(loser.error, IntegrityViolation):
        assert outcomes[1].ok
    assert _starts_of_node(admin, instance.id) == 1

    # The same race inside one execution: one step, and the loser is DuplicateStep.
    other = NodeId("report")

    def start_same(index: int) -> StepExecution:
        with repository.begin() as uow:
            step = uow.flow.create_step(new.id, StepName(f"report-{index}"), other, StartLimit(1))
            uow.commit()
        return step

    outcomes = race(2, start_same)
    assert sorted(outcome.ok for outcome in outcomes) == [False, True]
    [loser] = [outcome for outcome in outcomes if not outcome.ok]
    assert isinstance(loser.error, DuplicateStep | StartLimitExceeded)
    with repository.begin() as uow:
        assert [s.logical_id for s in uow.steps.of_execution(new.id)].count(other) == 1


@pytest.mark.race
def test_a_waiting_start_sees_the_committed_start(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Forced interleaving: the second start blocks on the instance lock, then counts 1.

    Scenario L5.
    """
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        old = uow.executions.create(instance.id)
        old = uow.executions.transition(old.id, old.version, to(S.FAILED, clock.advance()))
        uow.commit()
    new = attempt(repository, clock, instance.id)
    ready = threading.Event()
    pid: list[int] = []

    def second() -> str:
        with repository.begin() as uow:
            pid.append(uow.connection.info.backend_pid)
            ready.set()
            try:
                uow.flow.create_step(new.id, StepName("load"), NODE, StartLimit(1))
            except StartLimitExceeded:
                return "limit"
            uow.commit()
            return "created"

    with repository.begin() as first, ThreadPoolExecutor(1) as pool:
        step = first.flow.create_step(old.id, StepName("load"), NODE, StartLimit(1))
        # A step of a finished execution cannot stay open past COMMIT: this one ends at once.
        first.steps.transition(step.id, step.version, to(S.FAILED, clock.advance()))
        waiting = pool.submit(second)
        assert ready.wait(10)
        wait_until_lock_wait(admin, pid[0])
        first.commit()
        assert waiting.result(timeout=30) == "limit"
    assert _starts_of_node(admin, instance.id) == 1


# --------------------------------------------------------------------------- E1, E5, E20


def test_a_new_step_starts_clean_at_the_clock_instant(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario E1."""
    clock.set(clock.now() + timedelta(microseconds=123457))
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        step = create_step(uow, execution.id, StepName("extract"))
        uow.commit()
    with repository.begin() as uow:
        stored_step = uow.steps.get(step.id)
    assert stored_step == step
    assert (step.status, step.version, step.job_execution_id) == (S.STARTING, 0, execution.id)
    assert step.metadata.exit_status == ExitCode("UNKNOWN") and step.metadata.failure is None
    assert step.created_at == step.updated_at == clock.now()  # microsecond-exact
    assert step.metadata.timestamps.started_at is None
    assert step.metadata.timestamps.ended_at is None
    assert step.metadata.counts == ExecutionCounts()
    assert step.checkpoint == Checkpoint.empty()


def test_completed_and_stopped_starts_count_against_the_limit(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Starts that ended COMPLETED or STOPPED in earlier attempts count like FAILED ones.

    Scenario E5.
    """
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.commit()
    limit = StartLimit(2)
    for end in (S.COMPLETED, S.STOPPED):
        execution = attempt(repository, clock, instance.id)
        with repository.begin() as uow:
            step = uow.flow.create_step(execution.id, StepName("load"), NODE, limit)
            step = uow.steps.transition(step.id, 0, to(S.STARTED, clock.advance()))
            step = uow.steps.transition(step.id, step.version, to(end, clock.advance()))
            uow.commit()
        fail_attempt(repository, clock, execution)
    third = attempt(repository, clock, instance.id)
    with repository.begin() as uow:
        with pytest.raises(StartLimitExceeded) as exceeded:
            uow.flow.create_step(third.id, StepName("load"), NODE, limit)
        assert (exceeded.value.instance_id, exceeded.value.node_id, exceeded.value.limit) == (
            instance.id,
            NODE.value,
            2,
        )
        uow.commit()
    with repository.begin() as uow:
        assert uow.steps.of_execution(third.id) == []


def test_a_step_name_or_logical_id_is_used_once_per_execution(
    repository: JobRepository, clock: ManualClock
) -> None:
    """A second step with the same name, or a flow step whose node id is an existing step's
    logical id, is DuplicateStep; nothing is staged and the unit of work commits its earlier
    work.

    Scenario E20.
    """
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        extract = create_step(uow, execution.id, StepName("extract"))
        with pytest.raises(DuplicateStep) as same_name:
            create_step(uow, execution.id, StepName("extract"))
        assert (same_name.value.job_execution_id, same_name.value.step_name) == (
            execution.id,
            "extract",
        )
        with pytest.raises(DuplicateStep) as same_node:
            uow.flow.create_step(execution.id, StepName("other"), NodeId("extract"))
        assert (same_node.value.job_execution_id, same_node.value.node_id) == (
            execution.id,
            "extract",
        )
        assert uow.steps.of_execution(execution.id) == [extract]
        load = create_step(uow, execution.id, StepName("load"))
        uow.commit()
    with repository.begin() as uow:
        assert uow.steps.of_execution(execution.id) == [extract, load]
