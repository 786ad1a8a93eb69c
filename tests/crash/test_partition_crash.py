"""Crash proof of partitioned steps: 8 worker processes, 200 partitions, 20+ SIGKILLs.

A job process (tests/crash/partition_job.py) runs one partitioned step whose 8 forked
workers COPY 24,000 deterministic rows in 600 chunks. The test SIGKILLs random worker
processes at random instants (during start-up, a claim, a chunk, a COMMIT or the end of a
partition); the job replaces them and the survivors recover the dead workers' partitions.
Then it SIGKILLs the whole job mid-way and runs it again: the restart records the dead
attempt FAILED, carries the plan over and reruns only the partitions that did not complete.
End state, each time: every partition COMPLETED exactly once and the table equal to the
source (count and sha256), with no unique key to hide a duplicate.

The kill instants come from a fixed seed (PYBATCH_CRASH_SEED overrides it).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch.etl import Job
from pybatch.values.names import NodeId
from pybatch.values.status import BatchStatus
from tests.crash import partition_job as pj

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("PYBATCH_CRASH_SEED", "20261130"))
KILLS = 22
DEADLINE_S = 240.0


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split()]


class JobProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.partition_job"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        assert line[:1] == ["launched"], f"job did not launch: {line} (see {log})"
        self.attempt = int(line[1])

    def kill_all(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def finish(self) -> tuple[int, str]:
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        code = self.process.wait(timeout=DEADLINE_S)
        self._log.close()
        return code, out


def job_env(db_dsn: str, run: str, slow_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CRASH_"))}
    env.update(
        PYBATCH_DSN=db_dsn,
        PYBATCH_TLS="plaintext",
        CRASH_RUN=run,
        CRASH_SLOW_FILE=str(slow_file),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def final_state(
    config: ConnectionConfig, admin: psycopg.Connection[Any], run: str
) -> dict[str, Any]:
    rows = admin.execute(pj.SELECT_ROWS).fetchall()
    with JobRepository.connect(config) as repository, repository.begin() as uow:
        instance = uow.instances.find(Job(repository, pj.JOB_NAME, {"run": run}).key)
        assert instance is not None
        latest = uow.flow.latest_step(instance.id, NodeId(pj.STEP_NAME))
        assert latest is not None
        parent = latest.step_execution
        plan = uow.partitions.plan(parent.id)
        executions = uow.executions.of_instance(instance.id)
        workers = [
            step
            for execution in executions
            for step in uow.steps.of_execution(execution.id)
            if step.logical_id != NodeId(pj.STEP_NAME)
        ]
    return {
        "count": len(rows),
        "sha256": pj.rows_sha256(rows),
        "parent": parent,
        "plan": plan,
        "executions": executions,
        "workers": workers,
    }


def completed_once(state: dict[str, Any]) -> None:
    """Each key has exactly one COMPLETED worker step across all attempts."""
    by_key: dict[str, int] = {}
    for worker in state["workers"]:
        if worker.status is BatchStatus.COMPLETED:
            by_key[worker.step_name.value.split("#")[1].split(".")[0]] = (
                by_key.get(worker.step_name.value.split("#")[1].split(".")[0], 0) + 1
            )
    assert len(by_key) == pj.PARTITIONS and set(by_key.values()) == {1}, by_key


def test_sigkilled_workers_and_job_end_with_every_row_once(
    db_dsn: str, pg_config: ConnectionConfig, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    admin.execute(pj.CREATE_TABLE)
    slow = tmp_path / "slow"
    slow.touch()
    run = f"workers-{SEED}"
    job = JobProcess(job_env(db_dsn, run, slow), tmp_path / "job-1.log")
    kills = 0
    deadline = time.monotonic() + DEADLINE_S
    try:
        while kills < KILLS:
            assert time.monotonic() < deadline, f"seed {SEED}: only {kills} kills in time"
            assert job.process.poll() is None, f"seed {SEED}: job ended after {kills} kills"
            time.sleep(rng.uniform(0.05, 0.4))
            alive = children(job.process.pid)
            if alive:
                os.kill(rng.choice(alive), signal.SIGKILL)
                kills += 1
        slow.unlink()
        code, out = job.finish()
    finally:
        if job.process.poll() is None:
            job.kill_all()
    log = (tmp_path / "job-1.log").read_text()[-3000:]
    assert code == 0 and out.split() == ["done", "COMPLETED"], f"seed {SEED}: {out}\n{log}"
    state = final_state(pg_config, admin, run)
    assert state["count"] == pj.PARTITIONS * pj.ROWS_PER_PARTITION
    assert state["sha256"] == pj.source_sha256()
    assert {p.status for p in state["plan"]} == {BatchStatus.COMPLETED}
    assert state["parent"].metadata.counts.written == pj.PARTITIONS * pj.ROWS_PER_PARTITION
    completed_once(state)
    lost = [w for w in state["workers"] if w.metadata.failure is not None]
    assert lost, f"seed {SEED}: no kill landed on a partition in progress"


def test_sigkilled_job_restarts_and_reruns_only_unfinished_partitions(
    db_dsn: str, pg_config: ConnectionConfig, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rng = random.Random(SEED + 1)
    admin.execute(pj.CREATE_TABLE)
    slow = tmp_path / "slow"
    slow.touch()
    run = f"job-{SEED}"
    env = job_env(db_dsn, run, slow)
    first = JobProcess(env, tmp_path / "job-1.log")
    # Let some partitions complete, then kill the job and all its workers at once.
    deadline = time.monotonic() + DEADLINE_S
    while True:
        done = admin.execute(
            "SELECT COUNT(*) FROM pybatch.step_partition WHERE status = 'COMPLETED'"
        ).fetchone()
        assert done is not None
        if done[0] >= rng.randint(20, 60):
            break
        assert time.monotonic() < deadline and first.process.poll() is None
        time.sleep(0.05)
    first.kill_all()
    completed_before = {
        row[0]: row[1]
        for row in admin.execute(
            "SELECT partition_key, worker_step_execution_id FROM pybatch.step_partition"
            " WHERE status = 'COMPLETED'"
        )
    }
    slow.unlink()
    second = JobProcess(env, tmp_path / "job-2.log")
    assert second.attempt == 2
    code, out = second.finish()
    log = (tmp_path / "job-2.log").read_text()[-3000:]
    assert code == 0 and out.split() == ["done", "COMPLETED"], f"seed {SEED}: {out}\n{log}"
    state = final_state(pg_config, admin, run)
    assert [e.status for e in state["executions"]] == [BatchStatus.FAILED, BatchStatus.COMPLETED]
    assert state["count"] == pj.PARTITIONS * pj.ROWS_PER_PARTITION
    assert state["sha256"] == pj.source_sha256()
    carried = {p.key.value: p.worker_step_execution_id for p in state["plan"]}
    for key, worker in completed_before.items():  # not rerun: same worker as attempt 1
        assert carried[key] == worker
    completed_once(state)
