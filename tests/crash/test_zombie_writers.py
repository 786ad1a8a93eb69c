"""Nothing of an old owner commits after its ownership ended, by any way it can end.

A launcher process runs a partitioned step (tests/crash/zombie_job.py) and works on the plan
itself; a second process joins it from "another host" and stops in the middle of its first
chunk, its rows COPYed and its commit not yet sent. The test then ends the ownership that chunk
belongs to, in each way one can end:

- the launcher is interrupted (SIGINT: the execution ends STOPPED);
- the launcher fails (an exception: FAILED);
- an operator recovers the live run (`pybatch recover --force`: FAILED, audited);
- the launcher is SIGKILLed and a relaunch recovers it on its own once its lease ran out;
- the joined worker is frozen past its partition lease, another worker recovers the
  partition, and the job completes normally.

(An operator's stop is not among them: the launcher observes it between two polls of its
workers and ends in its own process, through the same transition the interrupt uses;
tests/crash/test_partitioned_launcher_endings.py shows that a stop ends a partitioned run
before its plan is done.)

Then the paused worker goes on and commits. Every time, its commit is refused: none of its
rows are in the table, no step is left STARTED under a finished execution, and a relaunch
completes the job with every source row exactly once (count and SHA-256, no unique key).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from tests.crash import zombie_job as zj
from tests.crash.partition_job import rows_sha256

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2.0
WAIT_S = 60.0


class Process:
    """A zombie_job process, its stdout read line by line."""

    def __init__(self, role: str, env: dict[str, str], log: Path) -> None:
        self._log = log.open("wb")
        self.log_path = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.zombie_job", role],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )

    @property
    def stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def expect(self, word: str) -> list[str]:
        """The next stdout line, which must start with `word`."""
        line = self.stdout.readline().split()
        assert line[:1] == [word], f"expected {word!r}, got {line} ({self.log()})"
        return line

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def finish(self, timeout: float = WAIT_S) -> tuple[int, str]:
        """Wait for the process to end (killing it after `timeout`); its exit code and output."""
        try:
            out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.log_path.stem} did not end: {self.log()}") from None
        self._log.close()
        return self.process.returncode, out

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split()]


def job_env(db_dsn: str, run: str, pause_file: Path, pace: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "ZOMBIE_"))}
    env.update(
        PYBATCH_DSN=db_dsn,
        PYBATCH_TLS="plaintext",
        ZOMBIE_RUN=run,
        ZOMBIE_LEASE_S=str(LEASE_S),
        ZOMBIE_CHUNK_SLEEP_S=str(pace),
        ZOMBIE_PAUSE_FILE=str(pause_file),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def pybatch_cli(db_dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYBATCH_")}
    env.update(PYBATCH_DSN=db_dsn, PYBATCH_TLS="plaintext")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pybatch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


def rows_from(admin: psycopg.Connection[Any], first_id: int) -> int:
    """How many rows of the paused chunk (ids first_id .. first_id + CHUNK - 1) are loaded."""
    row = admin.execute(
        f"SELECT count(*) FROM {zj.TABLE} WHERE id BETWEEN %s AND %s",
        (first_id, first_id + zj.CHUNK - 1),
    ).fetchone()
    assert row is not None
    return int(row[0])


def open_steps_under_finished_executions(admin: psycopg.Connection[Any]) -> list[Any]:
    return admin.execute(
        "SELECT s.id, s.step_name, s.status, e.id, e.status"
        " FROM pybatch.step_execution AS s"
        " JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id"
        " WHERE s.status IN ('STARTING', 'STARTED', 'STOPPING')"
        " AND e.status IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')"
    ).fetchall()


def execution_status(admin: psycopg.Connection[Any], execution_id: int) -> str:
    row = admin.execute(
        "SELECT status FROM pybatch.job_execution WHERE id = %s", (execution_id,)
    ).fetchone()
    assert row is not None
    return str(row[0])


def wait_for_status(admin: psycopg.Connection[Any], execution_id: int, *wanted: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while (status := execution_status(admin, execution_id)) not in wanted:
        assert time.monotonic() < deadline, f"execution {execution_id} stayed {status}"
        time.sleep(0.05)
    return status


ENDINGS = ["interrupt", "failure", "operator_recovery", "automatic_recovery", "lease_lost"]


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_paused_worker_commits_nothing_after_its_ownership_ended(
    ending: str, db_dsn: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    admin.execute(zj.CREATE_TABLE)
    pause = tmp_path / "pause"
    pause.touch()
    run = f"zombie-{ending}"
    env = job_env(db_dsn, run, pause, pace=0.05)
    processes: list[Process] = []

    def start(role: str, name: str, environment: dict[str, str] = env) -> Process:
        process = Process(role, environment, tmp_path / f"{name}.log")
        processes.append(process)
        return process

    try:
        workers = "1" if ending == "failure" else "0"
        launcher = start(
            "launch", "launcher", {**env, "ZOMBIE_LOCAL_WORKERS": workers, "ZOMBIE_PAUSE_FILE": ""}
        )
        _, attempt, execution = launcher.expect("launched")
        assert attempt == "1"
        execution_id = int(execution)
        zombie = start("join", "zombie")
        _, paused_key, first = zombie.expect("paused")
        first_id = int(first)
        assert rows_from(admin, first_id) == 0

        if ending == "interrupt":
            launcher.signal(signal.SIGINT)
            launcher.finish()
            assert wait_for_status(admin, execution_id, "STOPPED") == "STOPPED"
        elif ending == "failure":
            launcher.signal(signal.SIGUSR1)  # it supervises one local worker: end that one too
            for child in children(launcher.process.pid):
                os.kill(child, signal.SIGKILL)
            launcher.finish()
            assert wait_for_status(admin, execution_id, "FAILED") == "FAILED"
        elif ending == "operator_recovery":
            args = ["recover", str(execution_id), "--mark-failed", "--reason", "OPERATOR_FORCED"]
            refused = pybatch_cli(db_dsn, *args, "--operation-id", "recover-1")
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "EXECUTION_ALREADY_ACTIVE" in refused.stdout
            assert "--force" in refused.stderr
            assert execution_status(admin, execution_id) == "STARTED"
            forced = pybatch_cli(db_dsn, *args, "--force", "--operation-id", "recover-2")
            assert forced.returncode == 0, forced.stdout + forced.stderr
            assert execution_status(admin, execution_id) == "FAILED"
            code, _ = launcher.finish()
            assert code != 0  # it learns that its execution was recovered, and stops
        elif ending == "automatic_recovery":
            launcher.kill()
            relauncher = start("launch", "relauncher", {**env, "ZOMBIE_PAUSE_FILE": ""})
            _, attempt, _ = relauncher.expect("launched")
            assert attempt == "2"
            assert execution_status(admin, execution_id) == "FAILED"
        else:  # lease_lost: the zombie is frozen, its partition recovered, the job completes
            zombie.signal(signal.SIGSTOP)
            helper = start("join", "helper", {**env, "ZOMBIE_PAUSE_FILE": ""})
            code, out = launcher.finish()
            assert code == 0 and out.split() == ["done", "COMPLETED"], launcher.log()
            helper.finish()
            assert execution_status(admin, execution_id) == "COMPLETED"
            zombie.signal(signal.SIGCONT)

        assert open_steps_under_finished_executions(admin) == []
        loaded_before = admin.execute(f"SELECT count(*) FROM {zj.TABLE}").fetchone()
        pause.unlink()  # the zombie goes on: its commit must be refused
        code, out = zombie.finish()
        assert "refused" in out.split(), f"{ending}: the zombie's commit was not refused: {out}"
        if ending not in ("automatic_recovery", "lease_lost"):  # else reloaded by another owner
            assert rows_from(admin, first_id) == 0, f"{ending}: the zombie's rows committed"
            loaded_after = admin.execute(f"SELECT count(*) FROM {zj.TABLE}").fetchone()
            assert loaded_after == loaded_before, f"{ending}: rows landed after the end"
        assert open_steps_under_finished_executions(admin) == []

        # Whatever remains is done by a relaunch (or by the attempt already running).
        if ending == "automatic_recovery":
            finisher = processes[-1]
        elif ending == "lease_lost":
            finisher = None
        else:
            finisher = start("launch", "finisher", {**env, "ZOMBIE_PAUSE_FILE": ""})
            _, attempt, _ = finisher.expect("launched")
            assert attempt == "2"
        if finisher is not None:
            code, out = finisher.finish()
            assert code == 0 and out.split() == ["done", "COMPLETED"], finisher.log()
    finally:
        for process in processes:
            process.kill()
    rows = admin.execute(zj.SELECT_ROWS).fetchall()
    assert len(rows) == zj.PARTITIONS * zj.ROWS_PER_PARTITION, f"{ending}: {len(rows)} rows"
    assert rows_sha256(rows) == zj.source_sha256(), f"{ending}: the table differs"
    assert open_steps_under_finished_executions(admin) == []
    del paused_key
