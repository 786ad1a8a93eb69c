"""The clone pool behind pybatch_dsn: faithful copies of the template, made the fast way on
every major, dropped whatever the test left open (run on each major of the tox matrix).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository, TlsMode
from pybatch._explorer import JobExplorer
from pybatch._statements import load_statements
from pybatch.etl import Job, StepRun
from pybatch.testing import ClonePool, PostgresServer
from pybatch.testing._clones import CLONE_PREFIX, clone_statement

#: What a database holds of pybatch: its relations, constraints and migration history.
SHAPE = """
SELECT 'relation', c.relname || ':' || c.relkind::text
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'pybatch'
UNION ALL
SELECT 'constraint', con.conname || ':' || pg_get_constraintdef(con.oid)
FROM pg_constraint AS con JOIN pg_namespace AS n ON n.oid = con.connamespace
WHERE n.nspname = 'pybatch'
UNION ALL
SELECT 'migration', version || ':' || name || ':' || encode(checksum, 'hex')
FROM pybatch.schema_migration
UNION ALL
SELECT 'version', version::text FROM pybatch.schema_version
ORDER BY 1, 2
"""


@pytest.fixture(scope="module")
def server(postgresql_proc: Any) -> PostgresServer:
    return PostgresServer(
        f"host={postgresql_proc.host} port={postgresql_proc.port} "
        f"user={postgresql_proc.user} dbname=postgres"
    )


@pytest.fixture(scope="module")
def template(server: PostgresServer) -> Iterator[str]:
    """A template made as pybatch_template makes it."""
    with server.migrated_template() as name:
        yield name


def shape(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return [(kind, item) for kind, item in conn.execute(SHAPE).fetchall()]


def databases(server: PostgresServer, prefix: str) -> list[str]:
    with psycopg.connect(server.maintenance_dsn) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,)
        ).fetchall()
    return [row[0] for row in rows]


def run_a_job(repository: JobRepository) -> str:
    def step(run: StepRun) -> None:
        with run.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})

    with Job(repository, "clone_check", {"n": 1}).launch() as run:
        run.step("one", step)
    explorer = JobExplorer(repository)
    (instance,) = explorer.instances("clone_check").items
    return explorer.executions(instance.id).items[0].status.value


@pytest.mark.parametrize("depth", [0, 2])
def test_a_clone_is_a_faithful_copy_of_the_template_and_the_repository_works_in_it(
    server: PostgresServer, template: str, depth: int
) -> None:
    expected = shape(server.dsn_for(template))
    version = int(dict(expected)["version"])
    assert version > 0 and len([kind for kind, _ in expected if kind == "migration"]) == version
    pool = ClonePool(server, template, depth=depth)
    try:
        names = [pool.take() for _ in range(2)]  # with depth 2, two copies made at once
        for name in names:
            dsn = server.dsn_for(name)
            assert shape(dsn) == expected
            config = ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT)
            with JobRepository.connect(config) as repository:
                assert repository.schema_version == version
                assert run_a_job(repository) == "COMPLETED"
            pool.give_back(name)
    finally:
        pool.close()
    assert shape(server.dsn_for(template)) == expected  # the template is untouched
    assert databases(server, CLONE_PREFIX) == []


@pytest.mark.parametrize(
    ("server_version", "statement"),
    [
        (130023, "clone_template"),
        (140019, "clone_template"),
        (150014, "clone_template_by_file_copy"),
        (160010, "clone_template_by_file_copy"),
        (180001, "clone_template_by_file_copy"),
    ],
)
def test_the_clone_statement_follows_the_server_major(server_version: int, statement: str) -> None:
    assert clone_statement(server_version).name == statement


def test_a_clone_copies_the_template_files_instead_of_logging_every_page(
    server: PostgresServer, template: str
) -> None:
    """On 15 and later the default strategy (WAL_LOG) would write the whole template through
    the WAL; a file copy (the only way on 13 and 14) logs a few records and a checkpoint."""
    pool = ClonePool(server, template, depth=0)
    try:
        with psycopg.connect(server.maintenance_dsn, autocommit=True) as conn:
            size = conn.execute("SELECT pg_database_size(%s)", (template,)).fetchone()
            before = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            name = pool.take()
            after = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", before
            ).fetchone()
        pool.give_back(name)
    finally:
        pool.close()
    assert size is not None and after is not None
    assert after[0] < size[0] / 4, f"{after[0]} bytes of WAL for a {size[0]}-byte template"


def test_database_names_are_quoted_as_identifiers(server: PostgresServer, template: str) -> None:
    statements = load_statements("testing")
    odd = f'{CLONE_PREFIX}" TEMPLATE template0; -- {uuid.uuid4().hex[:6]}'
    with psycopg.connect(server.maintenance_dsn, autocommit=True) as conn:
        clone_statement(conn.info.server_version).run_with_identifiers(
            conn, database=odd, template=template
        )
        assert databases(server, odd) == [odd]
        statements.drop_test_database.run_with_identifiers(conn, database=odd)
    assert databases(server, odd) == []
    assert databases(server, template) == [template]


@pytest.mark.parametrize("depth", [0, 1])
def test_a_database_is_dropped_even_with_a_session_the_test_left_open(
    server: PostgresServer, template: str, depth: int
) -> None:
    pool = ClonePool(server, template, depth=depth)
    try:
        name = pool.take()
        with psycopg.connect(server.dsn_for(name)) as leaked:
            pool.give_back(name)
            pool.close()  # waits for a background drop
            with pytest.raises(psycopg.OperationalError):
                leaked.execute("SELECT 1")
    finally:
        pool.close()
    assert databases(server, name) == []
