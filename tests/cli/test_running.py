"""`pybatch running`: the executions whose lease is live now, with their step's progress."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import psycopg

from pybatch import JobRepository
from pybatch.etl import Job, StepRun
from tests.cli.test_explore import run, run_json

DAY = {"business_date": "2026-12-04"}


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
            job = Job(repository, "load_orders", DAY, lease=datetime.timedelta(seconds=60))
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
        assert 0 < item["lease_left_seconds"] <= 60
        assert item["items_per_second"] is not None and item["items_per_second"] > 0
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
