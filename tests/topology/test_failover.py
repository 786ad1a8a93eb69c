"""Failover: a chunked load survives the death of its primary and resumes on the promoted standby.

A job (tests/topology/failover_job.py, the ETL API in a child process) loads 4,000 rows in
chunks of 25 through one multi-host DSN, `target_session_attrs=read-write`, primary first.
The standby is synchronous, so every chunk the job saw acknowledged is on it. Mid-load the
primary is stopped immediately (a crash); the job cannot write to the read-only standby and
fails. The standby is promoted and the job, launched again through the same DSN, reaches the
new primary, records the dead attempt's recovery and resumes from its checkpoint: the target
table ends equal to the source, by count and content, and the checkpoint and counters match
the rows at every step.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from pybatch.etl import Job
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.crash import worker as w
from tests.crash.test_etl_crash import check_consistent, durable_state, observer
from tests.support.standby import StreamingPair

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
#: The primary dies once the job has seen this many rows acknowledged.
KILL_AT_OFFSET = 1_000


def job_env(dsn: str, run: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CRASH_"))}
    return env | {
        "PYBATCH_DSN": dsn,
        "PYBATCH_TLS": "plaintext",
        # A dead host is given up quickly; the acquire bound ends the orphaned attempt.
        "PYBATCH_CONNECT_TIMEOUT_MS": "1000",
        "PYBATCH_ACQUIRE_TIMEOUT_MS": "2000",
        "PYBATCH_POOL_CLOSE_TIMEOUT_MS": "2000",
        "CRASH_RUN": run,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


class JobProcess:
    """The job in a child process; its stdout lines arrive through a queue so reads time out."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.topology.failover_job"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.lines: queue.Queue[list[str] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.split())
        self.lines.put(None)

    def next_line(self) -> list[str] | None:
        return self.lines.get(timeout=60)

    def wait(self) -> int:
        return self.process.wait(timeout=60)

    def stderr(self) -> str:
        return self.log.read_text()[-3000:]


def test_a_load_resumes_exactly_after_its_primary_dies_and_the_standby_is_promoted(
    fresh_standby_pair: StreamingPair, tmp_path: Path
) -> None:
    pair = fresh_standby_pair
    with pair.primary.connect() as primary:
        primary.execute(w.CREATE_TABLE)
    pair.make_synchronous()
    run = "failover"
    env = job_env(pair.failover_dsn(), run)
    first = JobProcess(env, tmp_path / "first.log")
    acknowledged = 0
    while acknowledged < KILL_AT_OFFSET:
        words = first.next_line()
        assert words is not None, f"the job ended before the failover: {first.stderr()}"
        if words[0] == "committed":
            acknowledged = int(words[1])
    pair.primary.stop("immediate")
    # Nothing left to write to: the standby is read-only and target_session_attrs skips it.
    assert first.wait() != 0, f"the job outlived its primary: {first.stderr()}"
    pair.promote()

    config = plaintext_config(pair.failover_dsn())
    with psycopg.connect(pair.standby.dsn(), autocommit=True) as admin:
        state = durable_state(config, admin, run)
        check_consistent(state, "after the failover")
        assert acknowledged <= state.offset < w.ROWS, (acknowledged, state)

        second = JobProcess(env, tmp_path / "second.log")
        said: list[list[str]] = []
        while (words := second.next_line()) is not None:
            said.append(words)
        assert second.wait() == 0, second.stderr()
        assert ["begin", str(state.offset)] in said and said[-1] == ["done"], said

        final = durable_state(config, admin, run)
        assert final.table_count == w.ROWS, final
        assert final.table_sha256 == w.source_sha256(w.ROWS), final
        assert final.read == final.written == w.ROWS, final
        with observer(config) as repository, repository.begin() as uow:
            instance = uow.instances.find(Job(repository, w.JOB_NAME, w.parameters(run)).key)
            assert instance is not None
            statuses = [e.status for e in uow.executions.of_instance(instance.id)]
        assert statuses == [BatchStatus.FAILED, BatchStatus.COMPLETED], statuses
        reasons = admin.execute(
            "SELECT d.reason_code FROM pybatch.recovery_decision AS d"
            " JOIN pybatch.job_execution AS e ON e.id = d.job_execution_id"
            " WHERE e.job_instance_id = %s",
            (instance.id,),
        ).fetchall()
        assert reasons == [("OWNER_LOST",)]
