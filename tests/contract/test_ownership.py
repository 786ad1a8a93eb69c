"""Ownership that survives a dropped connection (docs/etl-guide.md "Crashes and restarts").

What a script author relies on: while a run lives, nothing that happens to its idle
connections lets a second launch take it over; after a crash a restart proceeds within
one lease; a run whose ownership was taken gets a typed error and touches nothing; a role
without pybatch's grants cannot block recovery; UNKNOWN is never resolved automatically.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pybatch import ConnectionConfig, JobRepository
from pybatch._lease_keeper import LeaseKeeper
from pybatch.errors import (
    ExecutionAlreadyActive,
    ExecutionOwnershipLost,
)
from pybatch.etl import Job, StepRun
from pybatch.values.ownership import ExecutionLease
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import (
    DAY,
    SHORT_LEASE,
    business_ids,
    decisions,
    executions,
    loader,
    steps_of,
    wait_for_lease_expiry,
)

S = BatchStatus


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def operator_requests(admin: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with admin.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM pybatch.operator_request ORDER BY id").fetchall()


def pausing_loader(total: int, pause: Any) -> Any:
    """Load ids 1..total one per chunk, calling `pause()` between the chunks."""

    def work(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < total:
            with step.chunk() as chunk:
                chunk.execute("INSERT INTO public.orders VALUES (%s, 'x')", (offset + 1,))
                offset += 1
                chunk.commit(read=1, written=1, checkpoint={"offset": offset})
            if offset < total:
                pause()

    return work


# --------------------------------------------------------------------------- live owner


def test_idle_session_timeout_never_loses_a_live_run(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any], orders: None
) -> None:
    """The runtime role's idle sessions die after 2 s; the run pauses 3 s between chunks."""
    major = admin.info.server_version // 10000
    if major >= 14:  # idle_session_timeout exists from PostgreSQL 14 on
        admin.execute(f'ALTER DATABASE "{admin.info.dbname}" SET idle_session_timeout = 2000')
    refused: list[BaseException] = []
    with (
        JobRepository.connect(pg_config) as repository,
        JobRepository.connect(pg_config) as other,
    ):

        def pause() -> None:
            time.sleep(3)
            try:
                Job(other, "load_orders", DAY).launch()
            except ExecutionAlreadyActive as active:
                refused.append(active)

        job = Job(repository, "load_orders", DAY, lease=datetime.timedelta(seconds=1.5))
        with job.launch() as run:
            run.step("load", pausing_loader(3, pause))
        assert [type(error) for error in refused] == [ExecutionAlreadyActive] * 2
        assert all(error.execution_id == run.execution.id for error in refused)  # type: ignore[attr-defined]
        [execution] = executions(repository, run)
        assert execution.status is S.COMPLETED
    assert business_ids(admin) == [1, 2, 3]
    assert decisions(admin) == []


def test_terminated_idle_backends_never_lose_a_live_run(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any], orders: None
) -> None:
    """pg_terminate_backend of every idle pybatch session between chunks."""
    refused: list[BaseException] = []
    killed: list[int] = []
    with (
        JobRepository.connect(pg_config) as repository,
        JobRepository.connect(pg_config) as other,
    ):

        def pause() -> None:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name = 'pybatch' AND state = 'idle'"
            ).fetchall()
            killed.append(len(rows))
            time.sleep(1.5)
            try:
                Job(other, "load_orders", DAY).launch()
            except ExecutionAlreadyActive as active:
                refused.append(active)

        job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
        with job.launch() as run:
            run.step("load", pausing_loader(3, pause))
        assert len(refused) == 2 and all(killed)
        assert executions(repository, run)[0].status is S.COMPLETED
    assert business_ids(admin) == [1, 2, 3]
    assert decisions(admin) == []


def test_a_role_without_grants_cannot_block_recovery(
    repository: JobRepository, admin: psycopg.Connection[Any], db_dsn: str, orders: None
) -> None:
    """Any role may take any advisory-lock key; ownership depends on none, only on the lease."""
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    dead = job.launch()
    dead._stop_renewing()
    admin.execute("DROP ROLE IF EXISTS pybatch_intruder")
    admin.execute("CREATE ROLE pybatch_intruder LOGIN")
    intruder_dsn = db_dsn.replace(f"user={admin.info.user}", "user=pybatch_intruder")
    try:
        with psycopg.connect(intruder_dsn, autocommit=True) as intruder:
            intruder.execute(
                "SELECT pg_advisory_lock(hashtextextended('pybatch.job_execution.liveness', %s))",
                (dead.execution.id,),
            )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                intruder.execute("SELECT 1 FROM pybatch.job_execution FOR UPDATE")
            wait_for_lease_expiry(admin, dead.execution.id)
            with job.launch() as run:
                assert run.attempt == 2
                run.step("load", loader(2, 2))
    finally:
        admin.execute("DROP OWNED BY pybatch_intruder")
        admin.execute("DROP ROLE pybatch_intruder")
    [decision] = decisions(admin)
    assert decision["job_execution_id"] == dead.execution.id


# --------------------------------------------------------------------------- stale owner


def test_a_stale_owner_gets_a_typed_error_and_touches_nothing(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    stale = job.launch()
    stale_steps: list[StepRun] = []
    lost: list[BaseException] = []

    def stale_work(step: StepRun) -> None:
        stale_steps.append(step)
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'stale attempt')")
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        # The process stalls (a long GC pause, a frozen VM) longer than its lease.
        keeper = stale._keeper
        assert keeper is not None
        keeper.halt()
        wait_for_lease_expiry(admin, stale.execution.id)
        # Meanwhile another launch recovers the attempt and runs attempt 2.
        with Job(repository, "load_orders", DAY, lease=SHORT_LEASE).launch() as second:
            assert second.attempt == 2
            second.step("other", lambda step: None)
        # The stale owner wakes up: its next commit fails naming the lost ownership.
        try:
            with step.chunk() as chunk:
                chunk.execute("INSERT INTO public.orders VALUES (2, 'stale attempt')")
                chunk.commit(read=1, written=1, checkpoint={"offset": 2})
        except ExecutionOwnershipLost as error:
            lost.append(error)
            raise

    with pytest.raises(ExecutionOwnershipLost) as caught, stale:
        stale.step("load", stale_work)
    assert caught.value.id == stale.execution.id
    assert "no longer owned" in str(caught.value)
    assert lost == [caught.value]
    first, second = executions(repository, stale)
    assert (first.status, second.status) == (S.FAILED, S.COMPLETED)
    assert first.metadata.failure is not None
    assert steps_of(repository, first.id)["load"].status is S.FAILED  # as recovery left it
    assert business_ids(admin) == [1]
    [decision] = decisions(admin)
    assert (decision["job_execution_id"], decision["reason_code"]) == (first.id, "OWNER_LOST")


def test_a_renewal_that_fails_in_an_unforeseen_way_is_retried_and_the_run_keeps_its_lease(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Whatever a renewal raises, short of the lost ownership, the keeper's thread lives on."""
    run = Job(repository, "load_orders", DAY, lease=SHORT_LEASE).launch()
    keeper = run._keeper
    assert keeper is not None
    keeper.halt()
    flaky = LeaseKeeper(repository, run.execution.id, keeper.owner, keeper.lease)
    renew, failures = flaky._renew_once, [RuntimeError("unforeseen")] * 3

    def renew_once() -> None:
        if failures:
            raise failures.pop()
        renew()

    flaky._renew_once = renew_once  # type: ignore[method-assign]
    run._keeper = flaky
    flaky.start()
    time.sleep(SHORT_LEASE.total_seconds() * 3)  # three leases: renewed only after the failures
    assert failures == [] and not flaky.lost
    assert admin.execute(
        "SELECT lease_expires_at > clock_timestamp() FROM pybatch.job_execution WHERE id = %s",
        (run.execution.id,),
    ).fetchone() == (True,)
    with run:
        pass
    [execution] = executions(repository, run)
    assert execution.status is S.COMPLETED


def test_the_lease_keeper_reports_a_lost_ownership_at_the_next_boundary(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    stale = job.launch()
    keeper = stale._keeper
    assert keeper is not None
    keeper.halt()
    wait_for_lease_expiry(admin, stale.execution.id)
    with job.launch() as second:
        # The stale process resumes renewing: its first renewal finds the ownership gone.
        assert stale.owner is not None
        revived = LeaseKeeper(repository, stale.execution.id, stale.owner, keeper.lease)
        stale._keeper = revived
        revived.start()
        deadline = time.monotonic() + 10
        while not revived.lost:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(ExecutionOwnershipLost):
            stale.step("load", loader(1, 1))
        with pytest.raises(ExecutionOwnershipLost), stale:
            pass
        second.step("load", loader(1, 1))
    first, completed = executions(repository, second)
    assert (first.status, completed.status) == (S.FAILED, S.COMPLETED)
    assert list(steps_of(repository, first.id)) == []  # the stale owner created nothing
    assert business_ids(admin) == [1]


# --------------------------------------------------------------------------- recovery rules


def test_unknown_is_never_recovered_automatically(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    run = job.launch()
    run._stop_renewing()
    admin.execute(
        "UPDATE pybatch.job_execution SET status = 'UNKNOWN' WHERE id = %s", (run.execution.id,)
    )
    wait_for_lease_expiry(admin, run.execution.id)
    with pytest.raises(ExecutionAlreadyActive) as active:
        job.launch()
    assert (active.value.execution_id, active.value.status) == (run.execution.id, "UNKNOWN")
    assert decisions(admin) == []
    assert operator_requests(admin) == []


def test_automatic_recovery_is_audited_like_an_operators(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    dead = job.launch()
    dead._stop_renewing()
    wait_for_lease_expiry(admin, dead.execution.id)
    with job.launch() as run:
        assert run.attempt == 2
    [decision] = decisions(admin)
    [request] = operator_requests(admin)
    assert request["action"] == "RECOVER"
    assert request["authorization_class"] == "DESTRUCTIVE"
    assert request["actor_ref"] == "pybatch.etl"
    assert request["reason_code"] == "OWNER_LOST"
    assert request["outcome_class"] == "APPLIED"
    assert request["job_execution_id"] == dead.execution.id
    assert request["observed_version"] == decision["execution_version"]
    assert (request["prior_status"], request["result_status"]) == ("STARTED", "FAILED")
    assert request["operation_id"] == f"pybatch.etl:recover:{dead.execution.id}:" + str(
        decision["execution_version"]
    )


def test_a_launch_waits_no_longer_than_one_lease_after_a_crash(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    lease = datetime.timedelta(seconds=2)
    job = Job(repository, "load_orders", DAY, lease=lease)
    dead = job.launch()
    dead._stop_renewing()  # the last renewal happened at most now
    crashed_at = time.monotonic()
    while True:
        try:
            run = job.launch()
            break
        except ExecutionAlreadyActive:
            time.sleep(0.05)
    waited = time.monotonic() - crashed_at
    with run:
        assert run.attempt == 2
    assert waited <= lease.total_seconds() + 1.0


def test_lease_bounds_are_enforced() -> None:
    with pytest.raises(ValueError):
        ExecutionLease(datetime.timedelta(milliseconds=999))
    with pytest.raises(ValueError):
        ExecutionLease(datetime.timedelta(hours=1, seconds=1))
    lease = ExecutionLease()
    assert lease.duration == datetime.timedelta(seconds=10)
    assert lease.renew_interval == datetime.timedelta(seconds=10) / 3
