"""Stop requests and control (I1-I11), and stopping an ETL run.

What an operator relies on: `stop` is recorded durably, the run ends STOPPED at its next
chunk boundary (or within one poll interval during a long chunk) with its last checkpoint
committed, and running the script again resumes from that checkpoint.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch._explorer import JobExplorer
from pybatch._services.operator import OperatorService
from pybatch.errors import (
    ExecutionOwned,
    ExecutionOwnershipNotAllowed,
    JobExecutionNotFound,
    StaleVersion,
)
from pybatch.etl import Job, StepRun
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ActorRef, ExitCode, OperationId
from pybatch.values.operator import OperatorOutcomeClass
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import DAY, business_ids, executions, loader, steps_of
from tests.support.clock import ManualClock

S = BatchStatus
OPERATOR = ActorRef("cli:ops")
POLL_LEASE = datetime.timedelta(seconds=1.5)  # renew, and poll for stops, every 0.5 s


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def stop_columns(admin: psycopg.Connection[Any], execution_id: int) -> tuple[Any, ...]:
    row = admin.execute(
        "SELECT stop_requested_at, stop_requested_by, status, version FROM pybatch.job_execution"
        " WHERE id = %s",
        (execution_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def new_execution(repository: JobRepository, name: str = "stops") -> Any:
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(Job(repository, name, DAY).key).instance
        execution = uow.executions.create(instance.id)
        uow.commit()
    return execution


# --------------------------------------------------------------------------- repository (I1-I9)


def stored_execution(repository: JobRepository, execution_id: int) -> JobExecution:
    with repository.begin() as uow:
        execution = uow.executions.get(execution_id)
    assert execution is not None
    return execution


def test_a_stop_request_is_recorded_without_a_transition(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """I1: the request's time and actor are stored; status and version do not move, and the
    explorer shows both. I3: a COMPLETED execution records a stop without error (the
    repository does not guard on status).

    Scenario I1, I3.
    """
    execution = new_execution(repository)
    at = clock.advance()
    with repository.begin() as uow:
        stopped = uow.stop_requests.request(execution.id, execution.version, OPERATOR, at)
        uow.commit()
    assert (stopped.status, stopped.version) == (S.STARTING, execution.version)
    assert stop_columns(admin, execution.id) == (at, "cli:ops", "STARTING", execution.version)
    shown = JobExplorer(repository).execution(execution.id)
    assert shown is not None
    assert (shown.stop_requested_at, shown.stop_requested_by) == (at, "cli:ops")
    assert (shown.status, shown.version) == (S.STARTING, execution.version)
    # A COMPLETED execution: recorded, still COMPLETED at the same version.
    with repository.begin() as uow:
        current = uow.executions.get(execution.id)
        assert current is not None
        started = uow.executions.transition(
            current.id, current.version, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        completed = uow.executions.transition(
            started.id, started.version, LifecycleTransition.new(S.COMPLETED, clock.advance())
        )
        uow.commit()
    later = clock.advance()
    with repository.begin() as uow:
        recorded = uow.stop_requests.request(
            completed.id, completed.version, ActorRef("cli:other"), later
        )
        uow.commit()
    assert (recorded.status, recorded.version) == (S.COMPLETED, completed.version)
    assert stop_columns(admin, execution.id) == (
        later,
        "cli:other",
        "COMPLETED",
        completed.version,
    )


def test_a_stop_request_with_a_stale_version_or_unknown_id_changes_nothing(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario I2."""
    execution = new_execution(repository)
    with repository.begin() as uow:
        with pytest.raises(StaleVersion) as stale:
            uow.stop_requests.request(execution.id, execution.version + 1, OPERATOR, clock.now())
        assert (stale.value.expected, stale.value.actual) == (
            execution.version + 1,
            execution.version,
        )
        with pytest.raises(JobExecutionNotFound) as missing:
            uow.stop_requests.request(987654, 0, OPERATOR, clock.now())
        assert missing.value.id == 987654
        uow.commit()
    assert stop_columns(admin, execution.id) == (None, None, "STARTING", execution.version)
    assert stored_execution(repository, execution.id) == execution


def test_only_one_owner_token_claims_a_starting_execution(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """A claim succeeds on STARTING and again with the same token; another token is
    ExecutionOwned; on STARTED it is ExecutionOwnershipNotAllowed{STARTED}, but a stale
    version is reported first; an unknown execution is JobExecutionNotFound. No refusal
    changes the recorded owner or the version.

    Scenario I4, I5, I10.
    """
    mine, theirs = OwnerToken.generate(), OwnerToken.generate()
    execution = new_execution(repository)
    with repository.begin() as uow:
        claimed = uow.ownership.claim(execution.id, execution.version, mine, clock.now())
        again = uow.ownership.claim(execution.id, execution.version, mine, clock.now())
        assert claimed.version == again.version == execution.version
        with pytest.raises(ExecutionOwned) as owned:
            uow.ownership.claim(execution.id, execution.version, theirs, clock.now())
        assert owned.value.id == execution.id
        uow.commit()
    assert owner_of(admin, execution.id) == mine.value
    with repository.begin() as uow:
        started = uow.executions.transition(
            execution.id, execution.version, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        uow.commit()
    with repository.begin() as uow:
        with pytest.raises(ExecutionOwnershipNotAllowed) as not_allowed:
            uow.ownership.claim(execution.id, started.version, theirs, clock.now())
        assert (not_allowed.value.id, not_allowed.value.status) == (execution.id, "STARTED")
        # A stale version on a STARTED execution: the version is checked before the status.
        with pytest.raises(StaleVersion) as stale:
            uow.ownership.claim(execution.id, execution.version, theirs, clock.now())
        assert (stale.value.expected, stale.value.actual) == (execution.version, started.version)
        with pytest.raises(JobExecutionNotFound) as missing:
            uow.ownership.claim(987654, 0, theirs, clock.now())
        assert missing.value.id == 987654
        with pytest.raises(JobExecutionNotFound) as unobserved:
            uow.ownership.observe_control(987654, theirs, clock.now())
        assert unobserved.value.id == 987654
        uow.commit()
    assert owner_of(admin, execution.id) == mine.value
    assert stored_execution(repository, execution.id) == started


def owner_of(admin: psycopg.Connection[Any], execution_id: int) -> bytes | None:
    row = admin.execute(
        "SELECT owner_token FROM pybatch.job_execution WHERE id = %s", (execution_id,)
    ).fetchone()
    assert row is not None
    return None if row[0] is None else bytes(row[0])


def test_earlier_stop_or_claim_never_moves_updated_at_back(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """A stop request or a claim stamped before the row's `updated_at` leaves `updated_at`
    where it is; a repeated stop overwrites both its time and its actor.

    Scenario I11.
    """
    execution = new_execution(repository)
    updated_at = execution.updated_at
    earlier = updated_at - datetime.timedelta(seconds=30)
    with repository.begin() as uow:
        uow.ownership.claim(execution.id, execution.version, OwnerToken.generate(), earlier)
        uow.stop_requests.request(execution.id, execution.version, OPERATOR, earlier)
        uow.commit()
    after = stored_execution(repository, execution.id)
    assert after.updated_at == updated_at
    assert stop_columns(admin, execution.id)[:2] == (earlier, "cli:ops")
    even_earlier = earlier - datetime.timedelta(seconds=30)
    with repository.begin() as uow:
        uow.stop_requests.request(execution.id, execution.version, ActorRef("cli:b"), even_earlier)
        uow.commit()
    assert stop_columns(admin, execution.id)[:2] == (even_earlier, "cli:b")
    assert stored_execution(repository, execution.id).updated_at == updated_at


def test_observing_control_reports_ownership_and_a_stop_request_and_moves_to_stopping_once(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario I6-I9."""
    owner, stranger = OwnerToken.generate(), OwnerToken.generate()
    execution = new_execution(repository)
    with repository.begin() as uow:
        unclaimed = uow.ownership.observe_control(execution.id, owner, clock.now())
        assert (unclaimed.owner_matches, unclaimed.stop_requested) == (False, False)  # I8
        uow.ownership.claim(execution.id, execution.version, owner, clock.now())
        started = uow.executions.transition(
            execution.id, execution.version, LifecycleTransition.new(S.STARTED, clock.now())
        )
        quiet = uow.ownership.observe_control(execution.id, owner, clock.now())
        assert (quiet.owner_matches, quiet.stop_requested) == (True, False)  # I9: no stop
        assert quiet.execution.version == started.version
        assert quiet.execution.status is S.STARTED
        uow.stop_requests.request(execution.id, started.version, OPERATOR, clock.now())
        other = uow.ownership.observe_control(execution.id, stranger, clock.now())
        assert (other.owner_matches, other.stop_requested) == (False, True)  # I7
        assert (other.execution.status, other.execution.version) == (S.STARTED, started.version)
        assert uow.executions.get(execution.id) == other.execution  # no mutation
        observed = uow.ownership.observe_control(execution.id, owner, clock.now())
        assert (observed.owner_matches, observed.stop_requested) == (True, True)  # I6
        assert observed.execution.status is S.STOPPING
        assert observed.execution.version == started.version + 1
        again = uow.ownership.observe_control(execution.id, owner, clock.now())
        assert again.execution.version == observed.execution.version  # I9: already STOPPING
        uow.commit()
    with repository.begin() as uow:
        with pytest.raises(JobExecutionNotFound):
            uow.ownership.observe_control(987654, owner, clock.now())


# --------------------------------------------------------------------------- the ETL API


def test_a_stop_ends_the_run_stopped_at_the_next_chunk_and_a_rerun_resumes(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY, lease=POLL_LEASE)
    service = OperatorService(repository)

    def stopped_after_two(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < 10:
            with step.chunk() as chunk:
                chunk.execute("INSERT INTO public.orders VALUES (%s, 'x')", (offset + 1,))
                offset += 1
                chunk.commit(read=1, written=1, checkpoint={"offset": offset})
            if offset == 2:
                outcome = service.stop(OperationId("stop-1"), OPERATOR, step.run.execution.id)
                assert outcome.outcome is OperatorOutcomeClass.APPLIED
                deadline = time.monotonic() + 10
                while not step.stop_requested:  # the lease keeper polls every 0.5 s
                    assert time.monotonic() < deadline
                    time.sleep(0.02)

    with job.launch() as run:
        run.step("load", stopped_after_two)
        pytest.fail("the stop did not end the step")
    assert run.stopped
    [stopped] = executions(repository, run)
    assert (stopped.status, stopped.metadata.exit_status) == (S.STOPPED, ExitCode("STOPPED"))
    load = steps_of(repository, stopped.id)["load"]
    assert (load.status, load.checkpoint.payload) == (S.STOPPED, {"offset": 2})
    assert business_ids(admin) == [1, 2]

    seen: list[dict[str, int]] = []
    with job.launch() as again:
        assert again.attempt == 2
        again.step("load", loader(10, 4, seen=seen))
    assert seen[0]["offset"] == 2
    assert business_ids(admin) == list(range(1, 11))
    assert executions(repository, again)[-1].status is S.COMPLETED


def test_a_stop_is_observed_during_a_long_chunk_and_the_chunk_still_commits(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY, lease=POLL_LEASE)
    service = OperatorService(repository)
    statuses: list[str] = []

    def long_chunk(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'long')")
            service.stop(OperationId("stop-long"), OPERATOR, step.run.execution.id)
            time.sleep(1.5)  # three poll intervals inside one chunk
            row = admin.execute(
                "SELECT status FROM pybatch.job_execution WHERE id = %s",
                (step.run.execution.id,),
            ).fetchone()
            assert row is not None
            statuses.append(row[0])
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        with step.chunk() as chunk:  # the boundary: raises StopRequested
            chunk.execute("INSERT INTO public.orders VALUES (2, 'never')")
            chunk.commit(read=1, written=1, checkpoint={"offset": 2})

    with job.launch() as run:
        run.step("load", long_chunk)
    assert statuses == ["STOPPING"]  # observed by the poll, while the chunk ran
    assert run.stopped
    [stopped] = executions(repository, run)
    assert stopped.status is S.STOPPED
    assert steps_of(repository, stopped.id)["load"].checkpoint.payload == {"offset": 1}
    assert business_ids(admin) == [1]


def test_a_stop_requested_before_a_step_skips_it(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    job = Job(repository, "load_orders", DAY, lease=POLL_LEASE)
    service = OperatorService(repository)
    ran: list[str] = []
    with job.launch() as run:
        run.step("first", lambda step: ran.append("first"))
        service.stop(OperationId("stop-between"), OPERATOR, run.execution.id)
        keeper = run._keeper
        assert keeper is not None
        deadline = time.monotonic() + 10
        while not keeper.stop_requested:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        run.step("second", lambda step: ran.append("second"))
    assert ran == ["first"] and run.stopped
    [stopped] = executions(repository, run)
    assert stopped.status is S.STOPPED
    assert list(steps_of(repository, stopped.id)) == ["first"]
