"""The pytest plugin of pybatch.testing (entry point `pytest11`, name `pybatch`).

pytest imports this module in every environment where pybatch is installed, so it imports
nothing but pytest and the standard library: pybatch, its server machinery and
pytest-postgresql (the `testing` extra) are imported by the fixtures, when a test first
asks for one. A run that uses no pybatch fixture is unaffected. docs/testing.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from pybatch._config import ConnectionConfig
    from pybatch._job_repository import JobRepository
    from pybatch.testing import ClonePool, JobRunner, PostgresServer

__all__ = [
    "pybatch_clones",
    "pybatch_config",
    "pybatch_dsn",
    "pybatch_job_runner",
    "pybatch_repository",
    "pybatch_server",
    "pybatch_template",
]

_MAX_PREFETCH = 16
#: The lease of the job scripts `pybatch_job_runner` runs: the run after a kill waits about
#: 2 s for the killed run's lease, not the default 10 s (a live run renews every 0.67 s).
KILL_TEST_LEASE_SECONDS = 2.0


def _missing_extra() -> NoReturn:
    from pybatch.testing import MISSING_EXTRA

    pytest.fail(MISSING_EXTRA, pytrace=False)


def _require_extra() -> None:
    try:
        import pytest_postgresql  # noqa: F401  (the extra is what makes the fixtures work)
    except ImportError:
        _missing_extra()


@pytest.fixture(scope="session")
def pybatch_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL: PYBATCH_TEST_DSN, else a throwaway server for this session."""
    from pybatch.testing import TEST_DSN_ENV, PostgresServer, server_parent

    _require_extra()
    existing = os.environ.get(TEST_DSN_ENV)
    if existing:
        yield PostgresServer(existing)
        return
    from pybatch._demo.embedded import EmbeddedPostgres, EmbeddedPostgresUnavailable

    server = EmbeddedPostgres(durable=False, parent=server_parent())
    try:
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
    with pybatch_server.migrated_template() as name:
        yield name


def _prefetch_depth() -> int:
    from pybatch.testing import PREFETCH_ENV

    value = os.environ.get(PREFETCH_ENV, "2").strip()
    if not value.isdigit() or int(value) > _MAX_PREFETCH:
        pytest.fail(f"{PREFETCH_ENV} must be 0 to {_MAX_PREFETCH}", pytrace=False)
    return int(value)


@pytest.fixture(scope="session")
def pybatch_clones(pybatch_server: PostgresServer, pybatch_template: str) -> Iterator[ClonePool]:
    """Fresh clones of the template, made ahead of the tests and dropped after them."""
    from pybatch.testing import ClonePool

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
    from pybatch._config import ConnectionConfig, TlsMode

    return ConnectionConfig(dsn=pybatch_dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=4)


@pytest.fixture
def pybatch_repository(pybatch_config: ConnectionConfig) -> Iterator[JobRepository]:
    """A connected JobRepository on the test's fresh database, closed after the test."""
    from pybatch._job_repository import JobRepository

    with JobRepository.connect(pybatch_config) as repository:
        yield repository


@pytest.fixture
def pybatch_job_runner(pybatch_dsn: str) -> JobRunner:
    """Runs job scripts in a subprocess on the test's database, with a 2 s lease (JobRunner)."""
    from pybatch.testing import JobRunner

    return JobRunner(pybatch_dsn, python=sys.executable, lease=KILL_TEST_LEASE_SECONDS)
