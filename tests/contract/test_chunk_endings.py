"""A chunk block ends with a commit or an explicit rollback, never silently (docs/etl-guide.md).

A block left without either used to roll back quietly and the job ended COMPLETED with nothing
written; now it raises ChunkNotEnded and the step fails, restartable. Rolled-back chunks count
in the step's durable rollback counter.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import ChunkNotEnded, ExecutionOwnershipLost, NotCommitted, PyBatchError
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import DAY, business_ids, executions, orders, steps_of

__all__ = ["orders"]


def test_a_chunk_left_without_commit_fails_the_job_instead_of_completing_empty(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    def forgets_to_commit(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'forgotten')")

    job = Job(repository, "load_orders", DAY)
    with pytest.raises(ChunkNotEnded, match=r"chunk\.commit\(\.\.\.\) or chunk\.rollback\(\)"):
        with job.launch() as run:
            run.step("load", forgets_to_commit)
    [failed] = executions(repository, run)
    assert failed.status is BatchStatus.FAILED
    step = steps_of(repository, failed.id)["load"]
    assert step.status is BatchStatus.FAILED
    assert step.metadata.counts.rolled_back == 1
    assert business_ids(admin) == []

    def loads(step: StepRun) -> None:  # the business date is not lost: it restarts
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'loaded')")
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})

    with job.launch() as again:
        again.step("load", loads)
    assert executions(repository, again)[-1].status is BatchStatus.COMPLETED
    assert business_ids(admin) == [1]


def test_explicit_rollbacks_are_counted_and_the_step_goes_on(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    def skips_odd_chunks(step: StepRun) -> None:
        for item in range(1, 5):
            with step.chunk() as chunk:
                chunk.execute("INSERT INTO public.orders VALUES (%s, 'row')", (item,))
                if item % 2:
                    chunk.rollback()
                else:
                    chunk.commit(read=1, written=1, checkpoint={"offset": item})

    with Job(repository, "load_orders", DAY).launch() as run:
        run.step("load", skips_odd_chunks)
    step = steps_of(repository, run.execution.id)["load"]
    assert step.status is BatchStatus.COMPLETED
    assert (step.metadata.counts.rolled_back, step.metadata.counts.committed) == (2, 2)
    assert (step.metadata.counts.written, step.checkpoint.payload) == (2, {"offset": 4})
    assert business_ids(admin) == [2, 4]
    row = admin.execute(
        "SELECT rollback_count FROM pybatch.step_execution WHERE id = %s", (step.id,)
    ).fetchone()
    assert row == (2,)


def test_an_error_leaving_the_block_propagates_unmasked(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    def raises(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'rolled back')")
            raise ValueError("bad input file")

    with pytest.raises(ValueError, match="bad input file"):
        with Job(repository, "load_orders", DAY).launch() as run:
            run.step("load", raises)
    assert executions(repository, run)[-1].status is BatchStatus.FAILED
    assert business_ids(admin) == []


def test_a_partition_workers_rollback_is_counted_through_its_partition_fence(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    def work(part: Any) -> None:
        with part.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (%s, 'no')", (int(part.key),))
            chunk.rollback()
        with part.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (%s, 'yes')", (int(part.key),))
            chunk.commit(read=1, written=1, checkpoint={"done": True})

    with Job(repository, "load_orders", DAY).launch() as run:
        run.partitioned_step("load", ["1", "2"], work, workers=0)
    rows = admin.execute(
        "SELECT s.rollback_count, s.commit_count FROM pybatch.step_partition AS p"
        " JOIN pybatch.step_execution AS s ON s.id = p.worker_step_execution_id ORDER BY p.id"
    ).fetchall()
    assert rows == [(1, 1), (1, 1)]
    assert business_ids(admin) == [1, 2]


def test_a_rollback_counted_after_the_owner_lost_its_execution_changes_nothing(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    """The rollback count is fenced like a commit: a replaced owner's count is refused."""
    refused: list[PyBatchError] = []

    def loses_ownership(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'stale')")
            admin.execute(  # what a recovery does: another owner's token
                "UPDATE pybatch.job_execution SET owner_token = %s WHERE id = %s",
                (b"\x00" * 16, step.execution.job_execution_id),
            )
            with pytest.raises((NotCommitted, ExecutionOwnershipLost)) as error:
                chunk.rollback()
            refused.append(error.value)

    run = Job(repository, "load_orders", DAY).launch()
    with pytest.raises(PyBatchError), run:
        run.step("load", loses_ownership)
    assert len(refused) == 1
    row = admin.execute(
        "SELECT rollback_count FROM pybatch.step_execution WHERE job_execution_id = %s",
        (run.execution.id,),
    ).fetchone()
    assert row == (0,)
    assert business_ids(admin) == []
