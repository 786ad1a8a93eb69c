"""Upgrading to migration 0008 (job family isolation) on live data, then enabling it.

The migration only creates `job_family_grant` and the policies: applied under a running
job, that job goes on committing chunks and completes, and row level security is enabled
nowhere. When the DBA then runs the guide's scripts (docs/dba.md, "Isolating job
families"), the history written before belongs to its family by its job name, with no
row moved: the family's role restarts a run that failed before the upgrade and resumes it
from its checkpoint, while the runtime role, which has no family, no longer reaches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.errors import PermissionDenied
from pybatch.etl import Job, StepRun
from tests.conftest import plaintext_config
from tests.contract.test_job_family_isolation import ISOLATED_TABLES, family_block
from tests.contract.test_least_privilege import grants
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to

#: The last schema version without job families (migration 0008 adds them).
BEFORE = 7
DAY = {"business_date": "2026-12-01"}
ROLES = ("pybatch_orders", "pybatch_operator", "pybatch_retention", "pybatch_runtime")


def as_role(dsn: str, role: str) -> str:
    user = next(part for part in dsn.split() if part.startswith("user="))
    return dsn.replace(user, f"user={role}")


@pytest.fixture
def owner(blank_database: str) -> Iterator[psycopg.Connection[Any]]:
    """The database owner's connection, with the guide's runtime and retention roles."""
    install_up_to(blank_database, BEFORE)
    with psycopg.connect(blank_database, autocommit=True) as conn:
        for role in ROLES:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute("CREATE ROLE pybatch_runtime LOGIN")
        conn.execute("CREATE ROLE pybatch_retention LOGIN")
        # As granted at schema 7: pybatch.step_skip comes with migration 0011.
        conn.execute(grants("runtime-grants").replace(", pybatch.step_skip", ""))
        conn.execute(grants("retention-grants"))
        conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
        conn.execute("GRANT SELECT, INSERT ON public.orders TO pybatch_runtime")
        try:
            yield conn
        finally:
            for role in ROLES:
                if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    conn.execute(f"DROP OWNED BY {role}")
                    conn.execute(f"DROP ROLE {role}")


def loader(stop_after: int | None = None) -> Any:
    """Load ids 1..6 in chunks of 2 from the checkpoint; raise after `stop_after` rows."""

    def load(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < 6:
            if stop_after is not None and offset >= stop_after:
                raise RuntimeError("the loader fails before the upgrade")
            with step.chunk() as chunk:
                chunk.executemany(
                    "INSERT INTO public.orders VALUES (%s)", [(offset + 1,), (offset + 2,)]
                )
                offset += 2
                chunk.commit(read=2, written=2, checkpoint={"offset": offset})

    return load


def test_upgrade_under_a_live_run_enables_nothing_and_the_family_resumes_its_history(
    owner: psycopg.Connection[Any], blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = plaintext_config(as_role(blank_database, "pybatch_runtime"), pool_size=3)
    with older_package(monkeypatch, BEFORE):
        with JobRepository.connect(runtime) as old:
            with pytest.raises(RuntimeError), Job(old, "orders.load", DAY).launch() as failed:
                failed.step("load", loader(stop_after=4))
            # A run of the old package goes on across the upgrade, between two chunks.
            with Job(old, "orders.live", DAY).launch() as live:

                def upgrade_midway(step: StepRun) -> None:
                    with step.chunk() as chunk:
                        chunk.commit(read=1, written=0, checkpoint={"offset": 1})
                    applied = migrator.migrate(plaintext_config(blank_database))
                    assert [m.version for m in applied] == list(
                        range(BEFORE + 1, migrator.supported_schema_version() + 1)
                    )
                    with step.chunk() as chunk:
                        chunk.commit(read=1, written=0, checkpoint={"offset": 2})

                live.step("count", upgrade_midway)
    enabled = owner.execute(
        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'pybatch' AND (c.relrowsecurity OR c.relforcerowsecurity)"
    ).fetchall()
    assert enabled == []
    assert owner.execute("SELECT count(*) FROM pybatch.job_family_grant").fetchone() == (0,)
    policies = owner.execute(
        "SELECT tablename FROM pg_policies WHERE schemaname = 'pybatch' ORDER BY 1"
    ).fetchall()
    assert sorted(table for (table,) in policies) == sorted(ISOLATED_TABLES)
    assert owner.execute(
        "SELECT e.status, s.read_count FROM pybatch.job_execution AS e"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
        " JOIN pybatch.step_execution AS s ON s.job_execution_id = e.id"
        " WHERE i.job_name = 'orders.live'"
    ).fetchall() == [("COMPLETED", 2)]

    # The DBA enables isolation with the guide's scripts.
    owner.execute(family_block("pybatch_orders", "orders."))
    owner.execute(grants("isolation-enable"))
    with JobRepository.connect(runtime) as unmapped:
        with pytest.raises(PermissionDenied):
            Job(unmapped, "orders.load", DAY).launch()
    family = plaintext_config(as_role(blank_database, "pybatch_orders"), pool_size=3)
    with JobRepository.connect(family) as repository:
        with Job(repository, "orders.load", DAY).launch() as restarted:
            assert restarted.attempt == 2
            restarted.step("load", loader())
    assert owner.execute("SELECT count(*), min(id), max(id) FROM public.orders").fetchone() == (
        6,
        1,
        6,
    )
