"""Upgrading to skip records (migration 0011) under a live job.

A run of the older package keeps going while the migration creates `pybatch.step_skip`: its
next chunk commits as before. The upgraded package then restarts the failed step from that
chunk's checkpoint with `StepRun.load`, whose rejected rows are recorded in the new table;
the step executions written before the upgrade have none and still read.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pybatch._job_repository as repository_module
from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch._explorer import JobExplorer
from pybatch.etl import Chunk, Job, StepRun
from tests.conftest import plaintext_config
from tests.migrations.test_lease_upgrade import install_up_to

#: The migration that creates pybatch.step_skip.
SKIPS = 11


def test_a_job_live_across_the_upgrade_resumes_and_records_its_skips(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, SKIPS - 1)
    with psycopg.connect(blank_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.target (id BIGINT PRIMARY KEY CHECK (id % 10 <> 7))")
    applied: list[int] = []

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.target VALUES (1)")
            chunk.commit(read=1, written=1, checkpoint={"position": 1})
        applied.extend(m.version for m in migrator.migrate(config))  # while the run is live
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.target VALUES (2)")
            chunk.commit(read=1, written=1, checkpoint={"position": 2})
        raise KeyError("stopped on purpose")

    with monkeypatch.context() as old_package:
        old_package.setattr(repository_module, "supported_schema_version", lambda: SKIPS - 1)
        old = JobRepository.connect(config)
    with old:
        with pytest.raises(KeyError), Job(old, "live", {}).launch() as live:
            live.step("load", work)

    def write(chunk: Chunk, items: list[int]) -> None:
        chunk.copy("COPY public.target (id) FROM STDIN", [(item,) for item in items])

    def load(step: StepRun) -> None:
        step.load(lambda position: range(position + 1, 31), write, chunk_size=10, skip_limit=5)

    with JobRepository.connect(config) as repository:
        with Job(repository, "live", {}).launch() as restarted:
            restarted.step("load", load)
        explorer = JobExplorer(repository)
        before = explorer.skips(live.execution.id)
        after = explorer.skips(restarted.execution.id)
    # later migrations follow it
    assert applied == list(range(SKIPS, migrator.supported_schema_version() + 1))
    assert before.items == ()
    # Positions 2.. resumed: ids 3..30; 7, 17 and 27 break the CHECK.
    assert [(s.item_position, s.sqlstate) for s in after.items] == [
        (6, "23514"),
        (16, "23514"),
        (26, "23514"),
    ]
    with psycopg.connect(blank_database) as conn:
        ids: list[Any] = [row[0] for row in conn.execute("SELECT id FROM public.target")]
    assert sorted(ids) == [i for i in range(1, 31) if i % 10 != 7]
