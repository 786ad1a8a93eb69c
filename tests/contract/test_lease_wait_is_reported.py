"""A launch that waits for a dead run's lease says what it waits for; the lease is settable.

After a kill the restart waits up to one lease for the dead owner's lease to run out; it logs
the execution and the seconds left at INFO on the `pybatch` logger. PYBATCH_LEASE_SECONDS
sets the lease of every `Job` that does not choose one (the test plugin's JobRunner sets it).
"""

from __future__ import annotations

import datetime
import logging
import re
import time
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import EnvironmentValueInvalid
from pybatch.etl import LEASE_ENVIRONMENT, Job
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import DAY, executions, orders

__all__ = ["orders"]


def test_a_launch_waiting_for_a_dead_runs_lease_says_which_and_how_long(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    orders: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = Job(repository, "load_orders", DAY, lease=datetime.timedelta(seconds=2))
    dead = job.launch()
    dead._stop_renewing()  # the owner dies: nothing renews its lease any more
    caplog.set_level(logging.INFO, logger="pybatch")
    with job.launch() as run:
        assert run.attempt == 2
    waits = [r.getMessage() for r in caplog.records if "waiting for the lease" in r.getMessage()]
    assert waits, "the launch waited silently"
    found = re.search(r"job execution (\d+) .*: (\d+\.\d) s left", waits[0])
    assert found is not None
    assert int(found.group(1)) == dead.execution.id
    assert 0.0 < float(found.group(2)) <= 2.0
    assert executions(repository, run)[0].status is BatchStatus.FAILED


def test_the_lease_environment_variable_sets_the_default_lease(
    repository: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEASE_ENVIRONMENT, "1.5")
    assert Job(repository, "load_orders", DAY).lease.duration == datetime.timedelta(seconds=1.5)
    explicit = Job(repository, "load_orders", DAY, lease=datetime.timedelta(seconds=30))
    assert explicit.lease.duration == datetime.timedelta(seconds=30)
    for bad in ("soon", "0.5", "7200", "nan"):
        monkeypatch.setenv(LEASE_ENVIRONMENT, bad)
        with pytest.raises(EnvironmentValueInvalid, match=LEASE_ENVIRONMENT):
            Job(repository, "load_orders", DAY)


def test_a_restart_after_a_kill_waits_only_the_short_lease(
    repository: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEASE_ENVIRONMENT, "1")
    job = Job(repository, "load_orders", DAY)
    job.launch()._stop_renewing()
    started = time.monotonic()
    with job.launch() as run:
        assert run.attempt == 2
    assert time.monotonic() - started < 3.0  # not the default 10 s lease
