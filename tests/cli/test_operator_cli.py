"""`pybatch stop` and `recover`: real processes against the test database."""

from __future__ import annotations

import datetime
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.etl import Job, StepRun
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.status import BatchStatus
from tests.cli.test_demo import clean_env
from tests.cli.test_explore import PYBATCH

S = BatchStatus
DAY = {"business_date": "2026-11-30"}


def pybatch(db_dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed `pybatch` console script against the test database."""
    return subprocess.run(
        [PYBATCH, *args, "--dsn", db_dsn, "--plaintext"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )


def unknown_execution(repository: JobRepository) -> int:
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(Job(repository, "cli", DAY).key).instance
        execution = uow.executions.create(instance.id)
        started = uow.executions.transition(
            execution.id, execution.version, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        uow.executions.transition(
            started.id, started.version, LifecycleTransition.new(S.UNKNOWN, uow.clock.now())
        )
        uow.commit()
    return execution.id


def test_stop_wait_returns_when_the_run_stopped(
    pg_config: Any, db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
    launched = threading.Event()
    state: dict[str, Any] = {}

    def etl() -> None:
        with JobRepository.connect(pg_config) as repository:
            job = Job(repository, "load_orders", DAY, lease=datetime.timedelta(seconds=1.5))
            with job.launch() as run:
                state["run"] = run

                def endless(step: StepRun) -> None:
                    offset = 0
                    while True:
                        with step.chunk() as chunk:
                            chunk.execute("INSERT INTO public.orders VALUES (%s)", (offset,))
                            offset += 1
                            chunk.commit(read=1, written=1, checkpoint={"offset": offset})
                        launched.set()
                        time.sleep(0.05)

                run.step("load", endless)

    worker = threading.Thread(target=etl, daemon=True)
    worker.start()
    assert launched.wait(30)
    execution_id = state["run"].execution.id
    result = pybatch(db_dsn, "stop", str(execution_id), "--wait", "--operation-id", "stop-7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "APPLIED STOP operation stop-7: execution is STARTED"
    assert result.stdout.splitlines()[-1] == f"execution {execution_id} ended STOPPED"
    worker.join(30)
    assert state["run"].stopped
    again = pybatch(db_dsn, "stop", str(execution_id), "--operation-id", "stop-7")
    assert again.returncode == 0
    assert again.stdout.startswith("REPLAYED STOP operation stop-7")


def test_a_stop_on_a_completed_run_is_a_noop_and_its_replay_replayed(
    pg_config: Any, db_dsn: str
) -> None:
    with JobRepository.connect(pg_config) as repository:
        with Job(repository, "done", DAY).launch() as run:
            pass
    execution_id = run.execution.id
    noop = pybatch(db_dsn, "stop", str(execution_id), "--operation-id", "stop-done")
    assert noop.returncode == 0, noop.stderr
    assert noop.stdout == (
        "NOOP STOP operation stop-done: execution is already COMPLETED, nothing to change\n"
    )
    again = pybatch(db_dsn, "stop", str(execution_id), "--operation-id", "stop-done")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "REPLAYED STOP operation stop-done: execution is COMPLETED\n"


def test_generated_operation_id_is_printed_and_missing_execution_exits_4(db_dsn: str) -> None:
    result = pybatch(db_dsn, "stop", "987654")
    assert result.returncode == 4
    assert result.stderr.startswith("operation id: cli:")
    assert "rejected EXECUTION_NOT_FOUND" in result.stdout


def test_recover_an_unknown_execution_needs_unknown_effect(pg_config: Any, db_dsn: str) -> None:
    with JobRepository.connect(pg_config) as repository:  # the system clock, like the CLI's
        execution_id = unknown_execution(repository)
        check_recovered(repository, db_dsn, execution_id)


def check_recovered(repository: JobRepository, db_dsn: str, execution_id: int) -> None:
    refused = pybatch(db_dsn, "recover", str(execution_id), "--mark-failed", "--reason", "OOPS")
    assert refused.returncode == 1
    assert "rejected UNRESOLVED_RECOVERY_REQUIRED" in refused.stdout
    applied = pybatch(
        db_dsn, "recover", str(execution_id), "--mark-failed", "--reason", "UNKNOWN_EFFECT"
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "APPLIED RECOVER" in applied.stdout and "execution is FAILED" in applied.stdout
    with repository.begin() as uow:
        execution = uow.executions.get(execution_id)
        decision = uow.recovery.decision(execution_id)
    assert execution is not None and execution.status is S.FAILED
    assert decision is not None and decision.reason_code == "UNKNOWN_EFFECT"


@pytest.mark.parametrize("reason", ["lower case", ""])
def test_a_bad_reason_is_a_usage_error(db_dsn: str, reason: str) -> None:
    result = pybatch(db_dsn, "recover", "1", "--abandon", "--reason", reason)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
