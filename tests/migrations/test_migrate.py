"""The migrator and the runtime's schema-version check, against real PostgreSQL."""

from __future__ import annotations

import hashlib
import multiprocessing
import threading
from typing import Any

import psycopg
import pytest

import pybatch
from pybatch import _migrator as migrator
from pybatch import errors
from pybatch._config import ConnectionConfig
from tests.conftest import plaintext_config
from tests.migrations.catalogue import describe_catalogue
from tests.support.clock import ManualClock

#: The shipped schema version, and every version from 1 to it.
LATEST = migrator.supported_schema_version()
ALL_VERSIONS = list(range(1, LATEST + 1))
REFERENCE = __import__("pathlib").Path(__file__).with_name("reference_catalogue.txt")


def _history(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT version, name, checksum, success FROM pybatch.schema_migration ORDER BY 1"
        ).fetchall()


def test_migrate_from_empty_creates_the_reference_schema(blank_database: str) -> None:
    config = plaintext_config(blank_database)
    assert migrator.installed_schema_version(config) is None
    applied = migrator.migrate(config)
    assert [m.version for m in applied] == ALL_VERSIONS
    assert migrator.installed_schema_version(config) == migrator.supported_schema_version()
    with psycopg.connect(blank_database) as conn:
        assert describe_catalogue(conn) == REFERENCE.read_text()
    history = _history(blank_database)
    assert len(history) == LATEST
    for (version, name, checksum, success), shipped in zip(
        history, migrator.shipped_migrations(), strict=True
    ):
        assert (version, name, bytes(checksum), success) == (
            shipped.version,
            shipped.name,
            shipped.checksum,
            True,
        )
        assert bytes(checksum) == hashlib.sha256(shipped.path.read_bytes()).digest()


def test_rerun_is_a_no_op(pg_config: ConnectionConfig, db_dsn: str) -> None:
    before = _history(db_dsn)
    assert migrator.migrate(pg_config) == []
    assert migrator.migrate(pg_config, dry_run=True) == []
    assert _history(db_dsn) == before


def test_dry_run_lists_pending_files_and_changes_nothing(blank_database: str) -> None:
    config = plaintext_config(blank_database)
    pending = migrator.migrate(config, dry_run=True)
    assert [m.version for m in pending] == ALL_VERSIONS
    assert migrator.installed_schema_version(config) is None


def test_printed_sql_applies_by_hand_to_the_same_schema(
    blank_database: str, pg_config: ConnectionConfig, db_dsn: str
) -> None:
    script = migrator.migration_sql(plaintext_config(blank_database))
    assert "CREATE TABLE pybatch.job_execution" in script
    with psycopg.connect(blank_database, autocommit=True) as conn:
        conn.execute(script.encode())
        hand_applied = describe_catalogue(conn)
    with psycopg.connect(db_dsn) as conn:
        assert hand_applied == describe_catalogue(conn)
    assert migrator.installed_schema_version(plaintext_config(blank_database)) == LATEST
    assert migrator.migrate(plaintext_config(blank_database)) == []


def _migrate_in_thread(
    config: ConnectionConfig, barrier: threading.Barrier, results: list[object]
) -> None:
    barrier.wait()
    try:
        results.append([m.version for m in migrator.migrate(config)])
    except Exception as error:
        results.append(error)


@pytest.mark.race
def test_four_concurrent_migrators_in_threads_end_with_one_schema(blank_database: str) -> None:
    config = plaintext_config(blank_database)
    barrier = threading.Barrier(4)
    results: list[object] = []
    threads = [
        threading.Thread(target=_migrate_in_thread, args=(config, barrier, results))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Each file is applied exactly once, by whichever migrator took the lock for it.
    applied = [v for result in results if isinstance(result, list) for v in result]
    assert len(applied) == len(ALL_VERSIONS) and all(isinstance(r, list) for r in results)
    assert sorted(applied) == ALL_VERSIONS
    assert len(_history(blank_database)) == LATEST


def test_a_first_install_that_loses_the_race_changes_nothing_without_the_history_lock(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migrator found no history, then another install committed the first file. Before it
    applies the second file it takes the history lock like every other migrator: while an
    upgrade holds that lock, it holds no lock on a table the second file changes (0002 indexes
    job_execution), so the two cannot deadlock."""
    found_no_history = threading.Event()
    history_locked_elsewhere = threading.Event()
    original = migrator._lock_migrations

    def lock_after_the_race(conn: psycopg.Connection[Any]) -> bool:
        locked = original(conn)
        if not locked and not found_no_history.is_set():
            found_no_history.set()
            assert history_locked_elsewhere.wait(30)
        return locked

    monkeypatch.setattr(migrator, "_lock_migrations", lock_after_the_race)
    results: list[object] = []
    loser = threading.Thread(
        target=lambda: results.append(migrator.migrate(plaintext_config(blank_database)))
    )
    loser.start()
    assert found_no_history.wait(30)
    with psycopg.connect(blank_database, autocommit=True) as winner:
        winner.execute("CREATE SCHEMA IF NOT EXISTS pybatch")
        migrator._apply(winner, migrator.shipped_migrations()[0])
    with psycopg.connect(blank_database) as upgrade:
        upgrade.execute("LOCK TABLE pybatch.schema_migration IN EXCLUSIVE MODE")
        history_locked_elsewhere.set()
        with psycopg.connect(blank_database, autocommit=True) as watcher:
            while watcher.execute(
                "SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_locks"
                " WHERE NOT granted AND relation = 'pybatch.schema_migration'::regclass)"
            ).fetchone() == (True,):
                pass  # until the loser queues behind the upgrade's lock
        # Granted at once: the loser waits for the history lock holding nothing of 0002's.
        upgrade.execute("LOCK TABLE pybatch.job_execution IN ACCESS EXCLUSIVE MODE NOWAIT")
        upgrade.rollback()
    loser.join(60)
    assert len(results) == 1 and isinstance(results[0], list)
    assert [m.version for m in results[0]] == ALL_VERSIONS[1:]
    assert migrator.installed_schema_version(plaintext_config(blank_database)) == LATEST


def _migrate_in_process(dsn: str, barrier: Any, queue: Any) -> None:
    config = plaintext_config(dsn)
    barrier.wait()
    try:
        queue.put([m.version for m in migrator.migrate(config)])
    except Exception as error:
        queue.put(repr(error))


@pytest.mark.race
def test_four_concurrent_migrator_processes_end_with_one_schema(blank_database: str) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    queue = context.Queue()
    processes = [
        context.Process(target=_migrate_in_process, args=(blank_database, barrier, queue))
        for _ in range(4)
    ]
    for process in processes:
        process.start()
    results = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    assert all(isinstance(result, list) for result in results), results
    assert sorted(v for result in results for v in result) == ALL_VERSIONS
    assert migrator.installed_schema_version(plaintext_config(blank_database)) == LATEST


def test_newer_schema_is_refused_and_left_untouched(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any], db_dsn: str
) -> None:
    admin.execute("UPDATE pybatch.schema_version SET version = %s", (LATEST + 1,))
    before = _history(db_dsn)
    with pytest.raises(errors.NewerSchema) as caught:
        migrator.migrate(pg_config)
    assert (caught.value.current, caught.value.supported) == (LATEST + 1, LATEST)
    assert _history(db_dsn) == before
    with pytest.raises(errors.NewerSchema):
        pybatch.JobRepository.connect(pg_config)


def test_changed_checksum_is_refused(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    admin.execute(
        "UPDATE pybatch.schema_migration SET checksum = sha256('edited'::bytea) WHERE version = 1"
    )
    with pytest.raises(errors.MigrationChecksumMismatch) as caught:
        migrator.migrate(pg_config)
    assert caught.value.version == 1
    with pytest.raises(errors.MigrationChecksumMismatch):
        migrator.migrate(pg_config, dry_run=True)


def test_version_read_works_for_a_role_that_may_create_nothing(
    admin: psycopg.Connection[Any], db_dsn: str
) -> None:
    admin.execute("DROP ROLE IF EXISTS pybatch_reader")
    admin.execute("CREATE ROLE pybatch_reader LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    dbname = admin.info.dbname
    admin.execute(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC')
    admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    admin.execute("GRANT USAGE ON SCHEMA pybatch TO pybatch_reader")
    admin.execute("GRANT SELECT ON pybatch.schema_version TO pybatch_reader")
    reader_dsn = db_dsn.replace(f"user={admin.info.user}", "user=pybatch_reader")
    try:
        assert migrator.installed_schema_version(plaintext_config(reader_dsn)) == LATEST
    finally:
        admin.execute("DROP OWNED BY pybatch_reader")
        admin.execute("DROP ROLE pybatch_reader")


def test_runtime_refuses_an_uninitialized_database(blank_database: str) -> None:
    with pytest.raises(errors.SchemaUninitialized) as caught:
        pybatch.JobRepository.connect(plaintext_config(blank_database))
    assert "run `pybatch migrate`" in str(caught.value)  # the error names the fix
    assert migrator.installed_schema_version(plaintext_config(blank_database)) is None


def test_runtime_refuses_an_older_schema_and_never_migrates(
    pg_config: ConnectionConfig, monkeypatch: pytest.MonkeyPatch, db_dsn: str
) -> None:
    import pybatch._job_repository as job_repository_module

    monkeypatch.setattr(job_repository_module, "supported_schema_version", lambda: LATEST + 1)
    before = _history(db_dsn)
    with pytest.raises(errors.MigrationRequired) as caught:
        pybatch.JobRepository.connect(pg_config)
    assert (caught.value.current, caught.value.supported) == (LATEST, LATEST + 1)
    assert _history(db_dsn) == before


def test_runtime_refuses_a_database_without_the_version_row(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("DELETE FROM pybatch.schema_version")
    with pytest.raises(errors.SchemaUninitialized):
        pybatch.JobRepository.connect(pg_config)


def test_runtime_connects_at_the_supported_version(pg_config: ConnectionConfig) -> None:
    with pybatch.JobRepository.connect(pg_config, clock=ManualClock()) as repository:
        assert repository.schema_version == migrator.supported_schema_version()


def test_unreachable_server_is_unavailable_without_the_password() -> None:
    config = plaintext_config(
        "host=127.0.0.1 port=1 user=u password=hunter2-secret dbname=x",
        connect_timeout=__import__("datetime").timedelta(seconds=1),
    )
    with pytest.raises(errors.Unavailable) as caught:
        migrator.installed_schema_version(config)
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(caught.value)
    assert caught.value.__cause__ is None
