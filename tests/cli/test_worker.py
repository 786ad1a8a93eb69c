"""`pybatch worker`: a worker started by hand joins a running partitioned step."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.cli import main
from pybatch.etl import Job
from tests.contract.test_partitioned_step import (
    ROWS_PER_PARTITION,
    business,
    load,
    orders,
    plan_of,
)

__all__ = ["orders"]  # the fixture, shared with the partitioned-step tests


@pytest.mark.usefixtures("orders")
def test_cli_worker_joins_the_plan(
    repository: JobRepository,
    db_dsn: str,
    admin: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    codes: list[int] = []
    args = [
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
        "tests.contract.test_partitioned_step:load",
        "--wait",
        "30",
    ]
    thread = threading.Thread(target=lambda: codes.append(main(args)))
    thread.start()
    with Job(repository, "cli_fanout", {"run": "one", "day": 7}).launch() as run:
        outcome = run.partitioned_step("load", plan_of(6), load, workers=1)
    thread.join(timeout=60)
    assert codes == [0]
    assert "partitions of cli_fanout step load" in capsys.readouterr().out
    assert outcome.step.metadata.counts.written == 6 * ROWS_PER_PARTITION
    assert business(admin) == (6 * ROWS_PER_PARTITION, 6 * ROWS_PER_PARTITION)


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
