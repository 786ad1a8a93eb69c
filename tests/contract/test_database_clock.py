"""The database clock decides: a client whose clock is wrong cannot bend recovery or retention.

What an operator relies on: a run left behind by a host whose clock ran ahead is still
recovered by the next launcher; a purge never deletes a history that ended moments ago,
whatever the clocks of the host that wrote it or of the host that purges; `pybatch
unresolved` and the stale threshold measure age on the server; a host whose clock is beyond
the configured skew is refused on each new connection, with a typed error and a log line.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pybatch import ConnectionConfig, JobRepository
from pybatch._explorer import JobExplorer
from pybatch._services.retention import RetentionService
from pybatch.errors import ClockSkewBoundOutOfRange, ClockSkewExceeded, StaleThresholdOutOfRange
from pybatch.etl import Job
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ActorRef, JobName, NodeId, ReasonCode, StepName
from pybatch.values.retention import PurgeBatchBound, PurgePlanRequest, TerminalStatusSet
from pybatch.values.status import BatchStatus
from tests.cli.test_explore import run as explore_cli
from tests.cli.test_operator_cli import pybatch
from tests.contract.test_etl_api import (
    DAY,
    SHORT_LEASE,
    business_ids,
    loader,
    wait_for_lease_expiry,
)
from tests.support.clock import ManualClock, OffsetClock
from tests.support.race import terminate_backend

S = BatchStatus
HOUR = datetime.timedelta(hours=1)
MINUTE = datetime.timedelta(minutes=1)


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def server_now(admin: psycopg.Connection[Any]) -> datetime.datetime:
    row = admin.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    instant: datetime.datetime = row[0]
    return instant


def execution_rows(admin: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with admin.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM pybatch.job_execution ORDER BY id").fetchall()


def completed(repository: JobRepository, run: str, job: str = "nightly") -> int:
    """A COMPLETED history stamped by the repository's clock."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(Job(repository, job, {"run": run}).key)
        execution = uow.executions.create(instance.instance.id)
        for status in (S.STARTED, S.COMPLETED):
            execution = uow.executions.transition(
                execution.id, execution.version, LifecycleTransition.new(status, uow.clock.now())
            )
        uow.commit()
    return execution.id


def started(repository: JobRepository, run: str) -> int:
    """A STARTED execution stamped by the repository's clock, left unattended."""
    with repository.begin() as uow:
        key = Job(repository, "nightly", {"run": run}).key
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id, execution.version, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        uow.commit()
    return execution.id


# --------------------------------------------------------------------------- recovery


def test_a_dead_run_stamped_by_a_clock_ahead_is_recovered_by_a_launcher_with_the_right_clock(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any], orders: None
) -> None:
    """The run's host clock jumped an hour ahead after it connected, then the host died."""
    host_clock = OffsetClock()
    with JobRepository.connect(pg_config, clock=host_clock) as ahead:
        host_clock.offset = HOUR
        dead = Job(ahead, "load_orders", DAY, lease=SHORT_LEASE).launch()
        with ahead.begin() as uow:
            step = uow.flow.create_step(dead.execution.id, StepName("load"), NodeId("load"))
            uow.steps.transition(
                step.id, step.version, LifecycleTransition.new(S.STARTED, host_clock.now())
            )
            uow.commit()
        dead._stop_renewing()
        wait_for_lease_expiry(admin, dead.execution.id)

    with JobRepository.connect(pg_config) as right:  # the system clock, within the skew
        with Job(right, "load_orders", DAY, lease=SHORT_LEASE).launch() as run:
            assert run.attempt == 2
            run.step("load", loader(3, 2))
    first, second = execution_rows(admin)
    assert (first["status"], first["failure_category"]) == ("FAILED", "STALE_RECOVERED")
    assert first["ended_at"] >= first["started_at"]  # ordered, never InvalidTimestampOrder
    assert second["status"] == "COMPLETED"
    steps = admin.execute(
        "SELECT status FROM pybatch.step_execution WHERE job_execution_id = %s",
        (first["id"],),
    ).fetchall()
    assert steps == [("FAILED",)]
    decision = admin.execute(
        "SELECT job_execution_id, reason_code FROM pybatch.recovery_decision"
    ).fetchall()
    assert decision == [(first["id"], "OWNER_LOST")]
    assert business_ids(admin) == [1, 2, 3]


# --------------------------------------------------------------------------- retention


def test_a_history_completed_by_a_client_far_behind_is_not_purged(
    pg_config: ConnectionConfig, db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    behind = OffsetClock(-datetime.timedelta(days=100))
    refused: ClockSkewExceeded | None = None
    late: int | None = None
    try:
        with JobRepository.connect(pg_config, clock=behind) as late_host:
            late = completed(late_host, "late")
    except ClockSkewExceeded as error:
        refused = error
    with JobRepository.connect(pg_config) as right:
        fresh = completed(right, "fresh")

    purged = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d",
        "--operation-id", "nightly-purge",
    )  # fmt: skip
    assert purged.returncode == 0, purged.stderr
    remaining = [row["id"] for row in execution_rows(admin)]
    assert late is None or late in remaining, "a history completed seconds ago was purged"
    assert fresh in remaining
    assert refused is not None, "the host 100 days behind could write"
    assert refused.direction == "behind"
    assert refused.bound_ms == 5000
    assert refused.skew_ms >= 99 * 24 * 3600 * 1000


def test_a_purging_client_whose_clock_runs_ahead_deletes_nothing_young(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    with JobRepository.connect(pg_config) as right:
        young = completed(right, "young")
    purger_clock = ManualClock(server_now(admin) + datetime.timedelta(days=100))
    with JobRepository.connect(pg_config, clock=purger_clock) as purger:
        request = PurgePlanRequest(
            job_name=JobName("nightly"),
            statuses=TerminalStatusSet.of([S.COMPLETED]),
            minimum_age=datetime.timedelta(days=90),
            batch=PurgeBatchBound(1000),
        )
        progress = list(
            RetentionService(purger).purge(
                request, "ahead-purge", ActorRef("cli:ops"), ReasonCode("RETENTION")
            )
        )
    assert all(batch.total.job_executions == 0 for batch in progress)
    assert [row["id"] for row in execution_rows(admin)] == [young]


# --------------------------------------------------------------------------- staleness


def listed_ids(db_dsn: str, **environment: str) -> list[int]:
    """The ids `pybatch unresolved` lists with its default age."""
    result = explore_cli("unresolved", "--json", dsn=db_dsn, **environment)
    assert result.returncode == 0, result.stderr
    return [item["id"] for item in json.loads(result.stdout)["items"]]


def test_unresolved_executions_are_aged_on_the_database_clock(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], db_dsn: str
) -> None:
    server = server_now(admin)
    clock.set(server - 2 * MINUTE)
    fresh = started(repository, "fresh")
    clock.set(server - 20 * MINUTE)
    stale = started(repository, "stale")
    explorer = JobExplorer(repository)
    for observer in (server + datetime.timedelta(days=1), server - datetime.timedelta(days=1)):
        clock.set(observer)  # the observing client's clock does not matter
        listed = explorer.unresolved_executions(10 * MINUTE).items
        assert [item.id for item in listed] == [stale]

    # The CLI's default age is the stale threshold (15 minutes unless configured).
    clock.set(server - 12 * MINUTE)
    twelve = started(repository, "twelve-minutes")
    assert listed_ids(db_dsn) == [stale]
    assert listed_ids(db_dsn, PYBATCH_STALE_THRESHOLD_MS=str(10 * 60 * 1000)) == [stale, twelve]
    assert fresh not in listed_ids(db_dsn, PYBATCH_STALE_THRESHOLD_MS=str(10 * 60 * 1000))
    out_of_range = explore_cli(
        "unresolved", dsn=db_dsn, PYBATCH_STALE_THRESHOLD_MS=str(25 * 3600 * 1000)
    )
    assert out_of_range.returncode == 2
    assert "StaleThresholdOutOfRange" in out_of_range.stderr


def test_the_stale_threshold_compares_the_server_clock_with_the_durable_write(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    server = server_now(admin)
    clock.set(server - 20 * MINUTE)
    quiet = started(repository, "quiet")
    clock.set(server - 5 * MINUTE)
    recent = started(repository, "recent")
    clock.set(server + HOUR)  # a client ahead stamped this one: never stale early
    ahead = started(repository, "ahead")
    assert repository.recovery_snapshot(quiet).is_stale()
    assert not repository.recovery_snapshot(recent).is_stale()
    assert repository.recovery_snapshot(recent).is_stale(datetime.timedelta(minutes=1))
    assert not repository.recovery_snapshot(ahead).is_stale(datetime.timedelta(minutes=1))
    done = completed(repository, "done")
    assert not repository.recovery_snapshot(done).is_stale(datetime.timedelta(minutes=1))
    snapshot = repository.recovery_snapshot(quiet)
    for threshold in (59 * datetime.timedelta(seconds=1), datetime.timedelta(hours=24, seconds=1)):
        with pytest.raises(StaleThresholdOutOfRange):
            snapshot.is_stale(threshold)
    with pytest.raises(ClockSkewBoundOutOfRange):
        snapshot.is_stale(max_clock_skew=datetime.timedelta(seconds=61))


# --------------------------------------------------------------------------- skew at connect


@pytest.mark.parametrize(
    ("offset", "direction"),
    [(datetime.timedelta(seconds=10), "ahead of"), (datetime.timedelta(seconds=-10), "behind")],
)
def test_a_host_clock_beyond_the_skew_bound_is_refused_at_connect(
    pg_config: ConnectionConfig,
    caplog: pytest.LogCaptureFixture,
    offset: datetime.timedelta,
    direction: str,
) -> None:
    with caplog.at_level(logging.ERROR, logger="pybatch"):
        with pytest.raises(ClockSkewExceeded) as refused:
            JobRepository.connect(pg_config, clock=OffsetClock(offset))
    assert refused.value.direction == direction
    assert refused.value.bound_ms == 5000
    assert 9000 <= refused.value.skew_ms <= 11000
    assert "NTP" in str(refused.value)
    assert pg_config.dsn.reveal() not in str(refused.value)
    assert [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]

    # Within the bound, or under a wider configured bound, the host connects.
    with JobRepository.connect(pg_config, clock=OffsetClock(offset / 5)):
        pass
    wider = ConnectionConfig(
        dsn=pg_config.dsn,
        tls_mode=pg_config.tls_mode,
        max_clock_skew=datetime.timedelta(seconds=30),
    )
    with JobRepository.connect(wider, clock=OffsetClock(offset)):
        pass


def test_a_clock_that_jumps_after_connect_is_refused_on_the_next_new_connection(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    host_clock = OffsetClock()
    with JobRepository.connect(pg_config, clock=host_clock) as repository:
        completed(repository, "before-the-jump")
        host_clock.offset = -HOUR
        # Wait until each backend has really exited: pg_terminate_backend only signals it,
        # and a pooled connection whose backend has not gone yet still looks healthy.
        for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE application_name = 'pybatch' AND pid <> pg_backend_pid()"
        ).fetchall():
            terminate_backend(admin, pid)
        with pytest.raises(ClockSkewExceeded) as refused:
            completed(repository, "after-the-jump")
        assert refused.value.direction == "behind"
        host_clock.offset = datetime.timedelta(0)  # NTP put it right: the next one passes
        completed(repository, "after-the-fix")
    runs = admin.execute(
        "SELECT i.identifying_parameters::text FROM pybatch.job_instance AS i ORDER BY i.id"
    ).fetchall()
    assert len(runs) == 2
    assert "after-the-jump" not in str(runs)


def test_the_skew_and_stale_bounds_are_validated_settings(db_dsn: str) -> None:
    defaults = ConnectionConfig(dsn=db_dsn)
    assert defaults.max_clock_skew == datetime.timedelta(seconds=5)
    assert defaults.stale_threshold == datetime.timedelta(minutes=15)
    ms = datetime.timedelta(milliseconds=1)
    for good in (100 * ms, 60_000 * ms):
        assert ConnectionConfig(dsn=db_dsn, max_clock_skew=good).max_clock_skew == good
    bad: Any
    for bad in (99 * ms, 60_001 * ms, 5):
        with pytest.raises(ClockSkewBoundOutOfRange):
            ConnectionConfig(dsn=db_dsn, max_clock_skew=bad)
    for good in (MINUTE, 24 * HOUR):
        assert ConnectionConfig(dsn=db_dsn, stale_threshold=good).stale_threshold == good
    for bad in (MINUTE - ms, 24 * HOUR + ms, 900):
        with pytest.raises(StaleThresholdOutOfRange):
            ConnectionConfig(dsn=db_dsn, stale_threshold=bad)
    environ = {
        "PYBATCH_DSN": db_dsn,
        "PYBATCH_MAX_CLOCK_SKEW_MS": "250",
        "PYBATCH_STALE_THRESHOLD_MS": "120000",
    }
    from_env = ConnectionConfig.from_env(environ)
    assert from_env.max_clock_skew == 250 * ms
    assert from_env.stale_threshold == 2 * MINUTE
    with pytest.raises(ClockSkewBoundOutOfRange):
        ConnectionConfig.from_env({**environ, "PYBATCH_MAX_CLOCK_SKEW_MS": "50"})
