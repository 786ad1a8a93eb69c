"""SIGTERM (what a container orchestrator sends) stops a run at its next chunk boundary.

The run ends STOPPED, the process exits normally, and a restart resumes exactly where the
last chunk committed (docs/etl-guide.md, Stopping a run).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import psycopg

from pybatch import ConnectionConfig, JobRepository
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import DAY, business_ids, executions, loader, orders, steps_of
from tests.support.race import portable

__all__ = ["orders"]

TOTAL = 400


def _slow_loader(config_fields: dict[str, Any], queue: Any) -> None:
    """Child process: load one row per chunk, slowly; report after the third chunk."""
    with JobRepository.connect(ConnectionConfig(**config_fields)) as repository:

        def work(step: StepRun) -> None:
            offset = int(step.checkpoint.get("offset", 0))
            while offset < TOTAL:
                with step.chunk() as chunk:
                    offset += 1
                    chunk.execute("INSERT INTO public.orders VALUES (%s, 'child')", (offset,))
                    chunk.commit(read=1, written=1, checkpoint={"offset": offset})
                if offset == 3:
                    queue.put("running")
                time.sleep(0.02)

        with Job(repository, "load_orders", DAY).launch() as run:
            run.step("load", work)
        queue.put((run.stopped, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL))


def test_sigterm_ends_the_run_stopped_at_a_chunk_boundary_and_a_restart_is_exact(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any], orders: None
) -> None:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_slow_loader, args=(portable(pg_config), queue), daemon=True)
    child.start()
    try:
        assert queue.get(timeout=30) == "running"
        assert child.pid is not None
        os.kill(child.pid, signal.SIGTERM)
        stopped, handler_restored = queue.get(timeout=30)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0  # the run's with block ended quietly, as on a stop request
    assert stopped and handler_restored

    with JobRepository.connect(pg_config) as repository:
        job = Job(repository, "load_orders", DAY)
        with job.launch() as again:  # no lease wait: the stopped run released its execution
            [first, _] = executions(repository, again)
            assert first.status is BatchStatus.STOPPED
            step = steps_of(repository, first.id)["load"]
            assert step.status is BatchStatus.STOPPED
            committed = step.checkpoint.payload["offset"]
            assert 3 <= committed < TOTAL
            assert business_ids(admin) == list(range(1, committed + 1))
            seen: list[dict[str, int]] = []
            again.step("load", loader(TOTAL, 50, seen=seen))
        assert seen[0]["offset"] == committed and seen[0]["written"] == committed
        assert executions(repository, again)[-1].status is BatchStatus.COMPLETED
    assert business_ids(admin) == list(range(1, TOTAL + 1))
