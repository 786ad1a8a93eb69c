"""A chunk's progress UPDATE is planned once per connection, for a step and for a partition.

What a user relies on: the per-chunk cost of pybatch's own statement stays flat. A prepared
statement whose parameter chooses between two fences makes every custom plan look cheaper
than the generic one, and PostgreSQL then plans it again on every chunk; the step's and the
partition worker's progress UPDATEs are separate statements so that the generic plan wins.
Each chunk reads its own connection's `pg_prepared_statements` and stores what it saw, in
the chunk's own transaction (so it lands only with the chunk).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.etl import Chunk, Job, StepRun

CHUNKS = 12


@pytest.fixture
def seen(admin: psycopg.Connection[Any]) -> None:
    admin.execute(
        "CREATE TABLE public.seen (chunk int PRIMARY KEY, statement text NOT NULL,"
        " prepared int NOT NULL, generic bigint, custom bigint)"
    )


def record_plans(chunk: Chunk, number: int) -> None:
    """Store the progress UPDATEs this connection has prepared, with their plan counts."""
    conn = chunk.connection
    with_counts = conn.info.server_version >= 140000  # the plan counters are PostgreSQL 14+
    counts = "generic_plans, custom_plans" if with_counts else "NULL, NULL"
    rows = conn.execute(
        f"SELECT substring(statement FROM '^-- pybatch chunks.sql (\\w+)'), {counts}"
        " FROM pg_prepared_statements WHERE statement LIKE '-- pybatch chunks.sql update_%'"
    ).fetchall()
    assert len(rows) == 1, rows  # one progress statement per kind of chunk owner
    name, generic, custom = rows[0]
    chunk.execute(
        "INSERT INTO public.seen VALUES (%s, %s, %s, %s, %s)",
        (number, name, len(rows), generic, custom),
    )


def chunks(step: StepRun) -> None:
    start = int(step.checkpoint.get("n", 0))
    for number in range(start + 1, CHUNKS + 1):
        with step.chunk() as chunk:
            if number > 1:  # the first chunk runs before any progress UPDATE was prepared
                record_plans(chunk, number)
            chunk.commit(read=1, written=1, checkpoint={"n": number})


def assert_planned_once(admin: psycopg.Connection[Any], statement: str) -> None:
    rows = admin.execute(
        "SELECT chunk, statement, generic, custom FROM public.seen ORDER BY chunk"
    ).fetchall()
    assert [row[0] for row in rows] == list(range(2, CHUNKS + 1))
    assert {row[1] for row in rows} == {statement}
    if rows[-1][2] is None:  # PostgreSQL 13: no plan counters, the single statement is all
        return
    # Chunk n sees n - 1 earlier executions: five custom plans, then the generic one only.
    last = rows[-1]
    assert last[3] == 5, rows
    assert last[2] == CHUNKS - 1 - 5, rows


@pytest.mark.usefixtures("seen")
def test_a_steps_progress_update_is_planned_once_per_connection(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    with Job(repository, "plans", {"run": 1}).launch() as run:
        run.step("load", chunks)
    assert_planned_once(admin, "update_step_chunk_progress")


@pytest.mark.usefixtures("seen")
def test_a_partition_workers_progress_update_is_planned_once_per_connection(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    with Job(repository, "plans", {"run": 2}).launch() as run:
        run.partitioned_step("load", ["only"], chunks, workers=1)
    assert_planned_once(admin, "update_partition_chunk_progress")
