"""`pybatch worker`: a worker started by hand joins a running partitioned step."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch._cli import main
from pybatch.etl import Job, PartitionRun
from tests.contract.test_partitioned_step import (
    ROWS_PER_PARTITION,
    business,
    load,
    orders,
    plan_of,
)

__all__ = ["orders"]  # the fixture, shared with the partitioned-step tests


#: Environment variable naming the test database for `gated_load` (forked workers inherit it).
GATE_DSN = "PYBATCH_TEST_WORKER_GATE_DSN"


def gated_load(partition: PartitionRun) -> None:
    """`load`, once two partitions are claimed: the job's own worker cannot run the whole
    plan before the command-line worker has joined it."""
    with psycopg.connect(os.environ[GATE_DSN], autocommit=True) as gate:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = gate.execute(
                "SELECT COUNT(*) FROM pybatch.step_partition"
                " WHERE worker_step_execution_id IS NOT NULL"
            ).fetchone()
            if row is not None and row[0] >= 2:
                break
            time.sleep(0.02)
    load(partition)


def worker_args(
    db_dsn: str, *extra: str, function: str = "tests.cli.test_worker:gated_load"
) -> list[str]:
    return [
        "worker",
        "--dsn",
        db_dsn,
        "--plaintext",
        "--job",
        "cli_fanout",
        "--param",
        "run=one",
        "--param-int",
        "day=7",
        "--step",
        "load",
        "--function",
        function,
        *extra,
    ]


@pytest.mark.usefixtures("orders")
def test_cli_worker_joins_the_plan(
    repository: JobRepository,
    db_dsn: str,
    admin: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(GATE_DSN, db_dsn)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(main(worker_args(db_dsn, "--wait", "30")))
    )
    thread.start()
    with Job(repository, "cli_fanout", {"run": "one", "day": 7}).launch() as run:
        outcome = run.partitioned_step("load", plan_of(6), gated_load, workers=1)
    thread.join(timeout=60)
    assert codes == [0]
    ran = re.search(r"worked on (\d+) partitions of cli_fanout step load", capsys.readouterr().out)
    assert ran is not None and 1 <= int(ran.group(1)) <= 5
    assert outcome.step.metadata.counts.written == 6 * ROWS_PER_PARTITION
    assert business(admin) == (6 * ROWS_PER_PARTITION, 6 * ROWS_PER_PARTITION)


@pytest.mark.usefixtures("orders")
def test_cli_worker_arriving_after_the_step_completed_has_nothing_to_do(
    repository: JobRepository, db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Job(repository, "cli_fanout", {"run": "one", "day": 7}).launch() as run:
        run.partitioned_step("load", plan_of(3), load, workers=0)
        # The job is still running: its step completed, so a late worker returns at once.
        assert main(worker_args(db_dsn, "--wait", "30")) == 0
        assert "worked on 0 partitions" in capsys.readouterr().out
    assert main(worker_args(db_dsn, "--wait", "30")) == 0  # the whole job completed
    assert "worked on 0 partitions" in capsys.readouterr().out


@pytest.mark.usefixtures("repository")
def test_cli_worker_without_a_published_plan_exits_not_found(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(worker_args(db_dsn, "--wait", "0.3")) == 4
    err = capsys.readouterr().err
    assert "PartitionPlanNotPublished" in err
    assert "cli_fanout" in err and "step load" in err


def test_cli_worker_refuses_a_negative_wait(db_dsn: str) -> None:
    with pytest.raises(SystemExit) as refused:
        main(worker_args(db_dsn, "--wait", "-1"))
    assert "--wait is 0 to 86400 seconds" in str(refused.value)


def test_cli_worker_refuses_a_bad_function(db_dsn: str) -> None:
    with pytest.raises(SystemExit) as refused:
        main(
            [
                "worker",
                "--dsn",
                db_dsn,
                "--plaintext",
                "--job",
                "j",
                "--step",
                "s",
                "--function",
                "no_such_module:load",
                "--wait",
                "0",
            ]
        )
    assert "cannot import" in str(refused.value)
