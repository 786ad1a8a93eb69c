"""Test harness: one PostgreSQL per run, a migrated template, a fresh database per test.

The server binaries come from PG_BINDIR (set per tox env) through tools/pg_ctl_wrapper,
which runs initdb/pg_ctl as the postgres user when the tests run as root.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from pytest_postgresql import factories

from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from tests.support import pg_harness
from tests.support.clock import ManualClock

# Property-based tests are deterministic by default (the same examples on every run and in
# CI, bounded so the suite stays fast, no example database written into the tree).
# HYPOTHESIS_PROFILE=explore searches with fresh random examples, many more of them.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    max_examples=2000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    pg_harness.configure(config)


def dsn_for(*, host: str, port: int, user: str, dbname: str, password: str | None = None) -> str:
    parts = [f"host={host}", f"port={port}", f"user={user}", f"dbname={dbname}"]
    if password:
        parts.append(f"password={password}")
    return " ".join(parts)


def plaintext_config(dsn: str, **overrides: Any) -> ConnectionConfig:
    return ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, **overrides)


def migrate_template(
    host: str, port: int, user: str, dbname: str, password: str | None = None, **_: Any
) -> None:
    """pytest-postgresql loader: run the real migrations into the template database once."""
    migrate(
        plaintext_config(dsn_for(host=host, port=port, user=user, dbname=dbname, password=password))
    )


# fsync off: each test clones the template database, and durability against an OS crash
# of a throwaway server buys nothing (the crash tests kill clients, not the server).
_postgresql_proc = factories.postgresql_proc(
    load=[migrate_template], postgres_options="-c fsync=off -c full_page_writes=off"
)


@pytest.fixture(scope="session")
def postgresql_proc(_postgresql_proc: Any) -> Any:
    """The session's server, once it has proved to be the major its tox env names."""
    pg_harness.check_executor_major(_postgresql_proc)
    return _postgresql_proc


postgresql = factories.postgresql("postgresql_proc")


@pytest.fixture
def db_dsn(postgresql: psycopg.Connection[Any]) -> str:
    info = postgresql.info
    return dsn_for(
        host=info.host,
        port=info.port,
        user=info.user,
        dbname=info.dbname,
        password=info.password or None,
    )


@pytest.fixture
def pg_config(db_dsn: str) -> ConnectionConfig:
    return plaintext_config(db_dsn, pool_size=4)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def repository(pg_config: ConnectionConfig, clock: ManualClock) -> Iterator[JobRepository]:
    with JobRepository.connect(pg_config, clock=clock) as repo:
        yield repo


@pytest.fixture
def admin(postgresql: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test database's owner connection, autocommit, for arranging rows behind pybatch."""
    postgresql.autocommit = True
    return postgresql


@pytest.fixture
def blank_database(postgresql_proc: Any) -> Iterator[str]:
    """A brand-new database with no pybatch schema; yields its DSN."""
    name = f"blank_{uuid.uuid4().hex[:12]}"
    server = dict(
        host=postgresql_proc.host,
        port=postgresql_proc.port,
        user=postgresql_proc.user,
        password=postgresql_proc.password,
    )
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield dsn_for(dbname=name, **server)
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
