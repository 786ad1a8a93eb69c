"""A partitioned step's launcher stops supervising as soon as its run can no longer go on.

The launcher of a partitioned step forks local workers and supervises them until the plan is
done. Two things must end that supervision at once, not when the plan is done:

- its execution was recovered by another process (its lease ran out while it was frozen):
  the launcher must stop respawning workers for a plan it no longer owns and exit, saying it
  lost the execution; its forked workers go with it;
- an operator asked it to stop (`pybatch stop`): the run ends STOPPED with the partitions it
  had not reached still to do, and a relaunch does them.

Each time, the table ends with every source row exactly once (count and SHA-256, no unique
key), and no step is left STARTED under a finished execution.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.crash import zombie_job as zj
from tests.crash.partition_job import rows_sha256
from tests.crash.test_zombie_writers import (
    LEASE_S,
    Process,
    children,
    execution_status,
    job_env,
    open_steps_under_finished_executions,
    pybatch_cli,
    wait_for_status,
)

pytestmark = [pytest.mark.crash, pytest.mark.slow]

#: The launcher must notice within a few lease renewals, far less than the plan would take.
NOTICE_S = 15.0


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie awaiting its parent's wait is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def completed_partitions(admin: psycopg.Connection[Any], execution_id: int) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pybatch.step_partition AS p"
        " JOIN pybatch.step_execution AS s ON p.step_execution_id = s.id"
        " WHERE s.job_execution_id = %s AND p.status = 'COMPLETED'",
        (execution_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def assert_loaded_exactly_once(admin: psycopg.Connection[Any]) -> None:
    rows = admin.execute(zj.SELECT_ROWS).fetchall()
    assert len(rows) == zj.PARTITIONS * zj.ROWS_PER_PARTITION, f"{len(rows)} rows"
    assert rows_sha256(rows) == zj.source_sha256(), "the table differs from its source"
    assert open_steps_under_finished_executions(admin) == []


@pytest.mark.parametrize("recovery", ["relaunch", "operator"])
def test_a_launcher_whose_execution_was_recovered_exits_with_its_workers(
    recovery: str, db_dsn: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    admin.execute(zj.CREATE_TABLE)
    env = {**job_env(db_dsn, f"recovered-by-{recovery}", tmp_path / "none", pace=0.1)}
    env["ZOMBIE_PAUSE_FILE"] = ""
    launcher = Process("launch", {**env, "ZOMBIE_LOCAL_WORKERS": "2"}, tmp_path / "launcher.log")
    processes = [launcher]
    try:
        _, attempt, execution = launcher.expect("launched")
        assert attempt == "1"
        execution_id = int(execution)
        deadline = time.monotonic() + NOTICE_S
        while len(children(launcher.process.pid)) < 2:
            assert time.monotonic() < deadline, "the launcher never forked its workers"
            time.sleep(0.05)
        workers = children(launcher.process.pid)
        # Freeze the launcher alone: its workers go on, but nobody renews the execution's lease.
        launcher.signal(signal.SIGSTOP)
        time.sleep(LEASE_S * 2.5)
        if recovery == "relaunch":  # the next attempt recovers it and takes the plan over
            finisher = Process("launch", env, tmp_path / "finisher.log")
            processes.append(finisher)
            _, attempt, _ = finisher.expect("launched")
            assert attempt == "2"
        else:  # an operator marks it failed; the plan stays with the failed attempt
            args = ["recover", str(execution_id), "--mark-failed", "--reason", "OPERATOR_FORCED"]
            recovered = pybatch_cli(db_dsn, *args, "--operation-id", "recover-frozen")
            assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        assert execution_status(admin, execution_id) == "FAILED"

        launcher.signal(signal.SIGCONT)
        code, out = launcher.finish(timeout=NOTICE_S)
        assert code != 0, f"the recovered launcher claimed success: {out}"
        assert "done" not in out.split()
        assert "pybatch.errors.ExecutionOwnershipLost" in launcher.log(), launcher.log()
        deadline = time.monotonic() + NOTICE_S
        while any(alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "the recovered launcher's workers outlived it"
            time.sleep(0.05)
        assert open_steps_under_finished_executions(admin) == []

        if recovery == "operator":
            finisher = Process("launch", env, tmp_path / "finisher.log")
            processes.append(finisher)
            _, attempt, _ = finisher.expect("launched")
            assert attempt == "2"
        code, out = finisher.finish()
        assert code == 0 and out.split() == ["done", "COMPLETED"], finisher.log()
    finally:
        for process in processes:
            process.kill()
    assert_loaded_exactly_once(admin)


@pytest.mark.parametrize("workers", ["1", "0"])
def test_a_stop_request_ends_a_partitioned_run_before_its_plan_is_done(
    workers: str, db_dsn: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """With a forked worker, or with the launcher working on the plan alone (workers=0)."""
    admin.execute(zj.CREATE_TABLE)
    env = {**job_env(db_dsn, f"stopped-launcher-{workers}", tmp_path / "none", pace=0.35)}
    env["ZOMBIE_PAUSE_FILE"] = ""
    # One worker, 24 partitions of 3 chunks at 0.35 s each: the plan takes about 25 s.
    launcher = Process(
        "launch", {**env, "ZOMBIE_LOCAL_WORKERS": workers}, tmp_path / "launcher.log"
    )
    processes = [launcher]
    try:
        _, _, execution = launcher.expect("launched")
        execution_id = int(execution)
        deadline = time.monotonic() + NOTICE_S
        while completed_partitions(admin, execution_id) == 0:
            assert time.monotonic() < deadline, "no partition completed"
            time.sleep(0.05)
        asked = pybatch_cli(db_dsn, "stop", str(execution_id), "--operation-id", "stop-1")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        code, out = launcher.finish(timeout=NOTICE_S)
        assert code == 0, launcher.log()
        assert execution_status(admin, execution_id) == "STOPPED"
        left = zj.PARTITIONS - completed_partitions(admin, execution_id)
        assert left > 0, "the stop was only observed once the whole plan had run"
        assert open_steps_under_finished_executions(admin) == []
        assert "done" not in out.split()

        finisher = Process(
            "launch", {**env, "ZOMBIE_CHUNK_SLEEP_S": "0"}, tmp_path / "finisher.log"
        )
        processes.append(finisher)
        _, attempt, _ = finisher.expect("launched")
        assert attempt == "2"
        code, out = finisher.finish()
        assert code == 0 and out.split() == ["done", "COMPLETED"], finisher.log()
        assert wait_for_status(admin, execution_id, "STOPPED") == "STOPPED"
    finally:
        for process in processes:
            process.kill()
    assert_loaded_exactly_once(admin)
