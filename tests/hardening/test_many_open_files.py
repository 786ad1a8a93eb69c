"""A process that holds many files still runs its jobs.

Applications often hold more than a thousand descriptors (files, sockets, pipes), so every
connection pybatch opens gets a number above 1024. The pool's checkout check and a step's
check of its held connection must work on such a descriptor: `select()` refuses it with a
ValueError, which would escape every unit of work and kill a lease keeper's thread, letting
the lease of a live run lapse.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus

#: Descriptor numbers the filler reaches before the test's connections are opened.
PAST_SELECT_LIMIT = 1100
ROWS, CHUNK = 12, 4


@pytest.fixture
def many_open_files() -> Iterator[None]:
    """Hold descriptors up to PAST_SELECT_LIMIT, so the next ones opened are numbered higher."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = PAST_SELECT_LIMIT + 200
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < PAST_SELECT_LIMIT:
            filler.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for descriptor in filler:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def end_idle_sessions(admin: psycopg.Connection[Any]) -> int:
    """Terminate the idle pybatch sessions of the database, as an operator or a pooler might,
    and wait until they are gone (their FATAL has then reached the client's sockets)."""
    pids = [
        pid
        for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND application_name = 'pybatch' AND state = 'idle'"
        ).fetchall()
    ]
    for pid in pids:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone():
        assert time.monotonic() < deadline, "a terminated backend survived"
        time.sleep(0.01)
    return len(pids)


@pytest.mark.usefixtures("many_open_files")
def test_a_job_in_a_process_with_over_a_thousand_open_files_loads_every_row_once(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    """Between chunks the server ends the idle connections: the checks swap them, whatever their
    descriptor numbers, and the load goes on from its checkpoint."""
    admin.execute("CREATE TABLE public.loaded (id bigint NOT NULL)")
    ended: list[int] = []

    def load(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < ROWS:
            with step.chunk() as chunk:
                chunk.executemany(
                    "INSERT INTO public.loaded (id) VALUES (%s)",
                    [(i,) for i in range(offset, offset + CHUNK)],
                )
                offset += CHUNK
                chunk.commit(read=CHUNK, written=CHUNK, checkpoint={"offset": offset})
            ended.append(end_idle_sessions(admin))

    with JobRepository.connect(pg_config) as repository:
        with repository.begin() as uow:  # a connection of the pool, numbered past the limit
            assert uow.connection.fileno() > PAST_SELECT_LIMIT
        with Job(repository, "many_files", {"run": 1}).launch() as run:
            outcome = run.step("load", load)
        with repository.begin() as uow:
            step = uow.steps.get(outcome.step.id)
    assert step is not None and step.status is BatchStatus.COMPLETED
    assert step.metadata.counts.written == ROWS
    assert all(ended) and len(ended) == ROWS // CHUNK
    row = admin.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM public.loaded").fetchone()
    assert row == (ROWS, ROWS)
