"""Upgrading a live repository: a 0001 database whose step a dead process left STARTED is
migrated to the latest schema (0003 turns step_execution's column rules into domains).

What a DBA relies on: the migrations keep every row, and the job whose process died before
the upgrade resumes after it, through the ETL API, from its last committed checkpoint.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.etl import ETL_STATE_SCHEMA, Job, StepRun
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import NodeId, StepName
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.older_package import older_package

ORDERS = "CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)"


def _step_row(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(
            "SELECT status, version, read_count, write_count, commit_count, checkpoint_schema,"
            " checkpoint_payload, fault_state_checksum FROM pybatch.step_execution"
            " ORDER BY id LIMIT 1"
        ).fetchone()
    assert row is not None
    return row


def _leave_a_started_step_with_a_checkpoint(repository: JobRepository) -> None:
    """Attempt 1 commits two chunks (ids 1..4, offset 4) and its process dies mid-step.

    Written with the repository operations that schema 1 has (a launch of today's ETL API
    records a lease, which schema 1 has no column for), the way schema-1 pybatch left it.
    """
    key = Job(repository, "upgrade_load", {"day": "2026-11-30"}).key
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id,
            execution.version,
            LifecycleTransition.new(BatchStatus.STARTED, uow.clock.now()),
        )
        step = uow.flow.create_step(execution.id, StepName("load"), NodeId("load"))
        step = uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(BatchStatus.STARTED, uow.clock.now())
        )
        uow.commit()
    # Its two chunks, as schema-1 pybatch committed them: rows and progress in one transaction
    # (today's chunk statement reads columns that schema 1 does not have).
    with psycopg.connect(repository.config.dsn.reveal()) as conn:
        for first in (1, 3):
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO public.orders VALUES (%s, %s)",
                    [(first, "before upgrade"), (first + 1, "before upgrade")],
                )
                cursor.execute(
                    "UPDATE pybatch.step_execution SET read_count = read_count + 2,"
                    " processed_count = processed_count + 2, write_count = write_count + 2,"
                    " commit_count = commit_count + 1, checkpoint_schema = %s,"
                    " checkpoint_schema_version = 1, checkpoint_payload = %s,"
                    " version = version + 1 WHERE id = %s AND status = 'STARTED'",
                    (ETL_STATE_SCHEMA.value, Jsonb({"offset": first + 1}), step.id),
                )
            conn.commit()
    # The process is gone; the run never had a lease.


def test_a_step_started_under_0001_resumes_from_its_checkpoint_after_the_domains_migration(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    first = migrator.shipped_migrations()[:1]
    assert [(m.version, m.name) for m in first] == [(1, "create_schema")]
    with monkeypatch.context() as at_version_1, older_package(monkeypatch, 1):
        at_version_1.setattr(migrator, "shipped_migrations", lambda directory=None: first)
        assert [m.version for m in migrator.migrate(config)] == [1]
        with psycopg.connect(blank_database, autocommit=True) as conn:
            conn.execute(ORDERS)
        with JobRepository.connect(config) as repository:
            assert repository.schema_version == 1
            _leave_a_started_step_with_a_checkpoint(repository)
    before = _step_row(blank_database)
    assert (before["status"], before["read_count"], before["commit_count"]) == ("STARTED", 4, 2)
    assert before["checkpoint_payload"] == {"offset": 4}

    applied = migrator.migrate(config)
    shipped = migrator.shipped_migrations()
    assert [m.version for m in applied] == [m.version for m in shipped[1:]]
    assert "step_execution_domains" in [m.name for m in applied]
    assert _step_row(blank_database) == before  # every value kept by the column rewrite

    seen: list[dict[str, Any]] = []

    def load(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        seen.append({"offset": offset, "read": step.read_count, "commits": step.commit_count})
        for first_id in range(offset + 1, 9, 2):
            with step.chunk() as chunk:
                chunk.executemany(
                    "INSERT INTO public.orders VALUES (%s, %s)",
                    [(first_id, "after upgrade"), (first_id + 1, "after upgrade")],
                )
                chunk.commit(read=2, written=2, checkpoint={"offset": first_id + 1})

    with JobRepository.connect(config) as repository:
        assert repository.schema_version == migrator.supported_schema_version()
        with Job(repository, "upgrade_load", {"day": "2026-11-30"}).launch() as run:
            assert (run.attempt, run.restarted) == (2, True)
            outcome = run.step("load", load)
    assert seen == [{"offset": 4, "read": 4, "commits": 2}]
    assert outcome.step.status is BatchStatus.COMPLETED
    assert outcome.step.metadata.counts.read == 8
    assert outcome.step.checkpoint.payload == {"offset": 8}
    with psycopg.connect(blank_database) as conn:
        notes = conn.execute("SELECT id, note FROM public.orders ORDER BY id").fetchall()
    assert notes == [(i, "before upgrade" if i <= 4 else "after upgrade") for i in range(1, 9)]
