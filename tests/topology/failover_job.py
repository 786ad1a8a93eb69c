"""Failover-test job: the crash test's chunked load, announcing every acknowledged chunk.

Run as ``python -m tests.topology.failover_job`` with PYBATCH_DSN a multi-host DSN
(`target_session_attrs=read-write`) and CRASH_RUN the run id. It prints the lines of
tests/crash/worker.py plus ``committed <offset>`` once `chunk.commit()` has returned, so the
parent knows which checkpoints the server acknowledged before it killed the primary.
"""

from __future__ import annotations

import os
import sys
import time

from pybatch import ConnectionConfig, JobRepository
from pybatch.etl import Job
from tests.crash import worker as w

#: A short breath per chunk, so the primary dies mid-load rather than after it.
CHUNK_PAUSE_S = 0.004


class Announce(w.Pause):
    """Never pauses; reports each committed checkpoint."""

    def at(self, point: str, number: int, span: tuple[int, int]) -> None:
        if point == "after_commit":
            w.say("committed", span[1])
            time.sleep(CHUNK_PAUSE_S)


def main() -> int:
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        job = Job(repository, w.JOB_NAME, w.parameters(os.environ["CRASH_RUN"]), lease=w.LEASE)
        run = w.launch(job)
        with run:
            w.say("launched", run.attempt)
            run.step(w.STEP_NAME, lambda step: w.load(step, Announce("none", 0)))
    w.say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
