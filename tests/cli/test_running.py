"""`pybatch running`: the executions whose lease is live now, with their step's progress and
the `host:pid` of the process that owns each, which `pybatch show` keeps once the run ended."""

from __future__ import annotations

import datetime
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from pybatch import JobRepository
from pybatch.etl import Job, StepRun
from pybatch.testing import JobRunner
from tests.cli.test_explore import run, run_json

DAY = {"business_date": "2026-12-04"}
#: This host as an owner host records it: letters, digits, `.`, `_` and `-`, others as `_`.
HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:200]


def test_running_lists_a_live_run_with_its_step_progress_and_lease_and_nothing_else(
    pg_config: Any, db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
    with JobRepository.connect(pg_config) as repository:  # a finished run is not running
        with Job(repository, "finished", DAY).launch() as done:
            done.step("noop", lambda step: None)
    chunks = threading.Event()
    release = threading.Event()
    state: dict[str, Any] = {}

    def etl() -> None:
        with JobRepository.connect(pg_config) as repository:
            job = Job(repository, "load_orders", DAY, lease=datetime.timedelta(seconds=300))
            with job.launch() as live:
                state["run"] = live

                def load(step: StepRun) -> None:
                    for offset in range(3):
                        with step.chunk() as chunk:
                            chunk.execute("INSERT INTO public.orders VALUES (%s)", (offset,))
                            chunk.commit(read=1, written=1, checkpoint={"offset": offset + 1})
                    chunks.set()
                    assert release.wait(60)

                live.step("load", load)

    worker = threading.Thread(target=etl, daemon=True)
    worker.start()
    try:
        assert chunks.wait(30)
        time.sleep(0.05)  # a rate needs time since the step started
        execution_id = state["run"].execution.id
        [item] = run_json("running", dsn=db_dsn)["items"]
        assert item["id"] == execution_id and item["job_name"] == "load_orders"
        assert item["status"] == "STARTED" and item["step_name"] == "load"
        assert (item["read"], item["written"], item["commits"]) == (3, 3, 3)
        assert 0 < item["lease_left_seconds"] <= 300
        assert item["items_per_second"] is not None and item["items_per_second"] > 0
        assert item["owner_host"] == f"{HOST}:{os.getpid()}"  # the job's process, not the CLI's
        wide = run("running", dsn=db_dsn, COLUMNS="200").stdout.splitlines()
        assert "OWNER" in wide[0].split() and f"{HOST}:{os.getpid()}" in wide[1].split()
        table = run("running", dsn=db_dsn, COLUMNS="80")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert (
            lines[0].split()[:4] == ["EXECUTION", "JOB", "ATTEMPT", "STATUS"]
            or "STATUS" in lines[0]
        )
        assert "STARTED" in lines[1] and str(execution_id) in lines[1]
        assert all(len(line) <= 80 for line in lines), lines
        # A run whose lease ran out on the database clock (its process died) is not running.
        admin.execute(
            "UPDATE pybatch.job_execution SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (execution_id,),
        )
        assert run_json("running", dsn=db_dsn)["items"] == []
        assert run("running", dsn=db_dsn).stdout.strip() == "nothing is running"
    finally:
        release.set()
        worker.join(30)
    # The run ended: `show` keeps who ran it.
    shown = run_json("show", str(execution_id), dsn=db_dsn)["execution"]
    assert (shown["status"], shown["owner_host"]) == ("COMPLETED", f"{HOST}:{os.getpid()}")
    owner = run("show", str(execution_id), dsn=db_dsn).stdout
    assert re.search(rf"^owner +{re.escape(HOST)}:{os.getpid()}$", owner, re.M), owner


def test_show_keeps_the_owner_host_of_a_run_that_died_and_was_recovered(
    db_dsn: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    script = Path(__file__).resolve().parents[2] / "docs" / "examples" / "load_orders.py"
    admin.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount NUMERIC NOT NULL)")
    source = tmp_path / "orders.csv"
    source.write_text("".join(f"{i},1\n" for i in range(1, 301)))
    runner = JobRunner(db_dsn, python=sys.executable, lease=1)
    assert runner.run(script, str(source), kill_at_chunk=1).killed
    [dead] = run_json("executions", "--param", f"file={source}", dsn=db_dsn)["items"]
    died_on = dead["owner_host"]
    assert (
        re.fullmatch(rf"{re.escape(HOST)}:[0-9]+", died_on) and died_on != f"{HOST}:{os.getpid()}"
    )
    resumed = runner.run(script, str(source))  # recovers the dead run (OWNER_LOST), then loads
    assert resumed.returncode == 0, resumed.stderr
    restart, recovered = run_json("executions", "--param", f"file={source}", dsn=db_dsn)["items"]
    assert (recovered["id"], recovered["status"], recovered["owner_host"]) == (
        dead["id"],
        "FAILED",
        died_on,
    )
    assert restart["status"] == "COMPLETED" and restart["owner_host"] not in (None, died_on)
