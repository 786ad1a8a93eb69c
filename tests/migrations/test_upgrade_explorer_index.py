"""Upgrading to the explorer's unresolved-executions index with a job in flight.

A job is SIGKILLed part-way (its execution stays STARTED with two committed chunks), the
database is put back to the schema version before the migration, and `migrate` runs:
it builds the index, the dead execution is listed as unresolved through it, and the job
then resumes from its checkpoint and completes.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch import _migrator as migrator
from pybatch._explorer import JobExplorer
from pybatch.testing import JobRunner
from pybatch.values.status import BatchStatus

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "docs" / "examples" / "load_orders.py"
INDEX = "job_execution_unresolved_identity"


def _index_exists(admin: psycopg.Connection[Any]) -> bool:
    row = admin.execute("SELECT to_regclass(%s)", (f"pybatch.{INDEX}",)).fetchone()
    return row is not None and row[0] is not None


def test_upgrade_with_a_job_in_flight_then_resume(
    pg_config: ConnectionConfig,
    db_dsn: str,
    admin: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = migrator.shipped_migrations()
    (migration,) = [m for m in shipped if m.name == "explorer_unresolved_index"]
    admin.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount NUMERIC NOT NULL)")
    source = tmp_path / "orders.csv"
    source.write_text("".join(f"{i},1\n" for i in range(1, 501)))
    runner = JobRunner(db_dsn, python=sys.executable)
    assert runner.run(JOB, str(source), kill_at_chunk=2).killed

    # The database as the previous schema version left it, with the job in flight. Later
    # migrations (which this one does not depend on) stay applied: their bookkeeping is set
    # aside while only this migration runs, then put back.
    later = admin.execute(
        "SELECT version, name, checksum, installed_at, installed_by, execution_ms, success"
        " FROM pybatch.schema_migration WHERE version > %s ORDER BY version",
        (migration.version,),
    ).fetchall()
    admin.execute(f"DROP INDEX pybatch.{INDEX}")
    admin.execute("DELETE FROM pybatch.schema_migration WHERE version >= %s", (migration.version,))
    admin.execute("UPDATE pybatch.schema_version SET version = %s", (migration.version - 1,))
    with monkeypatch.context() as up_to_this_one:
        up_to_this_one.setattr(
            migrator, "shipped_migrations", lambda directory=None: shipped[: migration.version]
        )
        assert [m.version for m in migrator.migrate(pg_config)] == [migration.version]
    for row in later:
        admin.execute(
            "INSERT INTO pybatch.schema_migration VALUES (%s, %s, %s, %s, %s, %s, %s)", row
        )
    admin.execute("UPDATE pybatch.schema_version SET version = %s", (shipped[-1].version,))
    assert _index_exists(admin)

    # Unresolved age is measured on the database clock: age the dead run there.
    admin.execute(
        "UPDATE pybatch.job_execution SET created_at = created_at - interval '1 hour',"
        " started_at = started_at - interval '1 hour', updated_at = updated_at - interval '1 hour'"
    )
    with JobRepository.connect(pg_config) as repository:
        (dead,) = JobExplorer(repository).unresolved_executions(timedelta(minutes=10)).items
        assert (dead.status, dead.counts.written) == (BatchStatus.STARTED, 200)
        with admin.transaction():  # a one-row table: ask for the index the planner would skip
            admin.execute("SET LOCAL enable_seqscan = off")
            plan = admin.execute(
                "EXPLAIN SELECT id FROM pybatch.job_execution WHERE status IN"
                " ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN') ORDER BY id LIMIT 50"
            ).fetchall()
        assert INDEX in " ".join(str(row[0]) for row in plan)

    resumed = runner.run(JOB, str(source))
    assert resumed.returncode == 0, resumed.stderr
    assert admin.execute("SELECT count(*) FROM orders").fetchone() == (500,)
    with JobRepository.connect(pg_config) as repository:
        explorer = JobExplorer(repository)
        (instance,) = explorer.instances("load_orders").items
        latest = explorer.executions(instance.id).items[0]
    assert (latest.attempt, latest.status, latest.counts.written) == (
        2,
        BatchStatus.COMPLETED,
        500,
    )
