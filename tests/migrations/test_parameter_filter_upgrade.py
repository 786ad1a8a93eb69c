"""Upgrading to the parameter index and the owner host (migrations 0012, 0013) under live jobs.

The database is isolated by job family (docs/dba.md), so its runtime roles may update only
the columns granted to them. A run of the older package goes on across the upgrade and
completes; a run that failed before it is restarted by the upgraded package, whose claim
writes the new owner host (0012 grants the column wherever owner_token was granted), and the
history written before the upgrade is found by the parameter filter through the new index.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch._explorer import JobExplorer
from pybatch.etl import Job, StepRun
from pybatch.values.explorer import ParameterFilter
from tests.conftest import plaintext_config
from tests.contract.test_job_family_isolation import family_block
from tests.contract.test_least_privilege import grants
from tests.migrations.older_package import OWNER_HOST, older_package
from tests.migrations.test_isolation_upgrade import ROLES, as_role, loader
from tests.migrations.test_lease_upgrade import install_up_to

DAY = {"business_date": "2026-12-01"}


@pytest.fixture
def owner(blank_database: str) -> Any:
    """The database owner's connection; schema 11, isolated by family as the guide says."""
    install_up_to(blank_database, OWNER_HOST - 1)
    with psycopg.connect(blank_database, autocommit=True) as conn:
        for role in ROLES:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute("CREATE ROLE pybatch_runtime LOGIN")
        conn.execute("CREATE ROLE pybatch_retention LOGIN")
        conn.execute(grants("runtime-grants"))
        conn.execute(grants("retention-grants"))
        conn.execute(family_block("pybatch_orders", "orders."))
        # As enabled at schema 11: owner_host comes with migration 0012.
        conn.execute(grants("isolation-enable").replace("owner_host, ", ""))
        conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
        conn.execute("GRANT SELECT, INSERT ON public.orders TO pybatch_orders")
        try:
            yield conn
        finally:
            for role in ROLES:
                if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    conn.execute(f"DROP OWNED BY {role}")
                    conn.execute(f"DROP ROLE {role}")


def test_an_isolated_family_upgraded_under_a_live_run_claims_with_its_host_and_is_found(
    owner: psycopg.Connection[Any], blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = plaintext_config(as_role(blank_database, "pybatch_orders"), pool_size=3)
    applied: list[int] = []
    with older_package(monkeypatch, OWNER_HOST - 1):
        with JobRepository.connect(family) as old:
            with pytest.raises(RuntimeError), Job(old, "orders.load", DAY).launch() as failed:
                failed.step("load", loader(stop_after=4))
            with Job(old, "orders.live", DAY).launch() as live:

                def upgrade_midway(step: StepRun) -> None:
                    with step.chunk() as chunk:
                        chunk.commit(read=1, written=0, checkpoint={"offset": 1})
                    applied.extend(
                        m.version for m in migrator.migrate(plaintext_config(blank_database))
                    )
                    with step.chunk() as chunk:
                        chunk.commit(read=1, written=0, checkpoint={"offset": 2})

                live.step("count", upgrade_midway)
    assert applied == list(range(OWNER_HOST, migrator.supported_schema_version() + 1))
    with JobRepository.connect(family) as repository:
        with Job(repository, "orders.load", DAY).launch() as restarted:
            assert restarted.attempt == 2
            restarted.step("load", loader())
        explorer = JobExplorer(repository)
        day = ParameterFilter.parse([f"business_date={DAY['business_date']}"])
        found = explorer.executions_with_parameters(day).items
        (instance,) = explorer.instances("orders.load", parameters=day).items
    assert [(e.job_name, e.attempt, e.status.value) for e in found] == [
        ("orders.load", 2, "COMPLETED"),
        ("orders.live", 1, "COMPLETED"),
        ("orders.load", 1, "FAILED"),
    ]
    assert found[0].owner_host is not None and found[0].owner_host.endswith(f":{os.getpid()}")
    assert found[1].owner_host is None and found[1].owner_recorded  # claimed before 0012
    assert instance.parameters[0].value == DAY["business_date"]
    assert owner.execute("SELECT count(*), min(id), max(id) FROM public.orders").fetchone() == (
        6,
        1,
        6,
    )
    # The owner host's two rules hold for every row (0013 validated them; since 0021 the rule
    # trigger of job_execution checks them).
    for assignment, rule in (
        ("owner_host = 'no port'", "job_execution_owner_host_format"),
        ("owner_token = NULL, lease_expires_at = NULL", "job_execution_owner_host_has_owner"),
    ):
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            owner.execute(
                f"UPDATE pybatch.job_execution SET {assignment} WHERE id = %s", (found[0].id,)
            )
        assert refused.value.diag.constraint_name == rule
        owner.rollback()
    assert owner.execute(
        "SELECT indisvalid FROM pg_index"
        " WHERE indexrelid = 'pybatch.job_instance_parameter_values'::regclass"
    ).fetchone() == (True,)
