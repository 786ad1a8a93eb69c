"""A schema earlier on search_path cannot replace the built-ins pybatch relies on.

What an operator relies on: a database or role configured with `search_path = odd,
pg_catalog`, where `odd` holds functions named like built-ins (the lease clock, the audit
digest, the settings pybatch reads back), still runs jobs, renews leases and verifies the
audit chain with PostgreSQL's own functions. Each shadow raises, so any call to one fails
the statement that made it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch.etl import Job
from pybatch.values.names import ActorRef, OperationId
from pybatch.values.status import BatchStatus
from tests.contract.test_etl_api import DAY, business_ids, executions, loader, steps_of
from tests.support.clock import ManualClock

#: Built-ins pybatch calls, by the signature a shadow must have to be picked first.
SHADOWED = [
    ("clock_timestamp()", "timestamptz"),
    ("statement_timestamp()", "timestamptz"),
    ("now()", "timestamptz"),
    ("sha256(bytea)", "bytea"),
    ("int8send(bigint)", "bytea"),
    ("convert_to(text, name)", "bytea"),
    ("current_setting(text)", "text"),
    ("pg_try_advisory_lock(bigint)", "boolean"),
    ("to_regclass(text)", "regclass"),
]


@pytest.fixture
def shadowed_search_path(admin: psycopg.Connection[Any]) -> None:
    """Plant the shadows in `odd` and put it before pg_catalog for every new session."""
    admin.execute("CREATE SCHEMA odd")
    for signature, returns in SHADOWED:
        admin.execute(
            f"CREATE FUNCTION odd.{signature} RETURNS {returns} LANGUAGE plpgsql AS $$"
            f" BEGIN RAISE EXCEPTION 'shadow odd.{signature} ran'; END $$"
        )
    # count(*) is an aggregate: its shadow fails on the first row it counts.
    admin.execute(
        "CREATE FUNCTION odd.count_step(bigint) RETURNS bigint LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'shadow odd.count(*) ran'; END $$"
    )
    admin.execute("CREATE AGGREGATE odd.count(*) (SFUNC = odd.count_step, STYPE = bigint)")
    dbname = admin.info.dbname
    admin.execute(f'ALTER DATABASE "{dbname}" SET search_path = odd, pg_catalog, public')
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


@pytest.fixture
def shadowed_repository(
    shadowed_search_path: None, pg_config: ConnectionConfig, clock: ManualClock
) -> Iterator[JobRepository]:
    """A repository whose sessions all start after the shadows are in place."""
    with JobRepository.connect(pg_config, clock=clock) as repo:
        yield repo


def test_the_shadows_are_what_an_unqualified_call_runs(
    shadowed_search_path: None, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as session:
        with pytest.raises(psycopg.errors.RaiseException, match=r"shadow odd\.clock_timestamp"):
            session.execute("SELECT clock_timestamp()")
        session.rollback()
        row = session.execute("SELECT pg_catalog.clock_timestamp() IS NOT NULL").fetchone()
        assert row == (True,)


def test_a_job_runs_and_renews_its_lease_past_shadowed_builtins(
    shadowed_repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    job = Job(shadowed_repository, "load_orders", DAY)
    with job.launch() as run:
        assert run._keeper is not None
        run._keeper.renew_now()
        run.step("load", loader(5, 2))
    [execution] = executions(shadowed_repository, run)
    assert execution.status is BatchStatus.COMPLETED
    assert steps_of(shadowed_repository, execution.id)["load"].status is BatchStatus.COMPLETED
    assert business_ids(admin) == [1, 2, 3, 4, 5]


def test_audit_verify_uses_the_built_in_digest_past_shadows(
    shadowed_repository: JobRepository,
) -> None:
    service = OperatorService(shadowed_repository)
    key = Job(shadowed_repository, "audited", {"n": 1}).key
    launched = service.launch(OperationId("launch-1"), ActorRef("cli:ops"), key)
    assert launched.execution is not None
    service.stop(OperationId("stop-1"), ActorRef("cli:ops"), launched.execution.id)
    result = verify_audit_chain(shadowed_repository)
    assert result.intact and result.links == 2


def test_every_pybatch_function_resolves_names_from_pg_catalog_first(
    admin: psycopg.Connection[Any],
) -> None:
    """Function bodies are resolved when they run: each one pins its own search_path."""
    rows = admin.execute(
        "SELECT p.proname, p.proconfig FROM pg_catalog.pg_proc AS p"
        " WHERE p.pronamespace = 'pybatch'::regnamespace ORDER BY p.proname"
    ).fetchall()
    assert rows
    unpinned = [
        name
        for name, config in rows
        if not any(setting.startswith("search_path=pg_catalog") for setting in config or [])
    ]
    assert unpinned == []
