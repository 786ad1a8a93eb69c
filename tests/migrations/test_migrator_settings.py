"""The migrator's own transaction settings, whatever the role, the database or a held lock say.

Each test arranges a database at schema version 8 (or empty), makes the migrating role hostile
with `ALTER ROLE ... IN DATABASE ... SET` (scoped to the throwaway database) and migrates.
Migrations 0009 and 0010 alter `pybatch.job_execution`; a planted event trigger makes each of
their ALTER TABLE statements slow and records the settings it ran under.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pybatch import Pooler, errors
from pybatch import _migrator as migrator
from pybatch._config import ConnectionConfig
from pybatch._connect import open_connection
from tests.conftest import plaintext_config
from tests.support.pgbouncer import pgbouncer

LATEST = migrator.supported_schema_version()
#: The last version installed by hand: the files after it (0009, 0010) alter job_execution.
BEFORE_FAILURE_REASONS = 8
LOCK_TIMEOUT = timedelta(milliseconds=200)


def _install_up_to(dsn: str, version: int) -> None:
    """Apply the shipped migrations 1..version by hand, as an older pybatch did."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS pybatch")
        for migration in migrator.shipped_migrations()[:version]:
            migrator._apply(conn, migration)


def _set_for_role_in_database(dsn: str, setting: str, value: str) -> None:
    """`ALTER ROLE me IN DATABASE this SET setting = value`: every later session inherits it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
                sql.Identifier(conn.info.user),
                sql.Identifier(conn.info.dbname),
                sql.Identifier(setting),
                sql.Literal(value),
            )
        )
    with psycopg.connect(dsn) as conn:  # the arrangement holds for a new session
        shown = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
        assert shown == (value,)


def _plant_slow_alter_table(dsn: str) -> None:
    """Every ALTER TABLE takes 100 ms more and records the settings of its transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.observed_settings ("
            " statement_timeout text, lock_timeout text, idle_timeout text,"
            " time_zone text, read_only text)"
        )
        conn.execute(
            "CREATE FUNCTION public.slow_alter_table() RETURNS event_trigger"
            " LANGUAGE plpgsql AS $$ BEGIN"
            " INSERT INTO public.observed_settings VALUES ("
            " current_setting('statement_timeout'), current_setting('lock_timeout'),"
            " current_setting('idle_in_transaction_session_timeout'),"
            " current_setting('TimeZone'), current_setting('transaction_read_only'));"
            " PERFORM pg_sleep(0.1);"
            " END $$"
        )
        conn.execute(
            "CREATE EVENT TRIGGER slow_alter_table ON ddl_command_end"
            " WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION public.slow_alter_table()"
        )


def _observed_settings(dsn: str) -> set[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT * FROM public.observed_settings").fetchall())


@pytest.fixture
def at_version_8(blank_database: str) -> str:
    _install_up_to(blank_database, BEFORE_FAILURE_REASONS)
    return blank_database


def test_a_role_statement_timeout_does_not_cancel_a_long_migration(at_version_8: str) -> None:
    _plant_slow_alter_table(at_version_8)
    _set_for_role_in_database(at_version_8, "statement_timeout", "50ms")
    _set_for_role_in_database(at_version_8, "TimeZone", "Pacific/Kiritimati")
    config = plaintext_config(
        at_version_8,
        lock_timeout=timedelta(seconds=3),
        idle_transaction_timeout=timedelta(seconds=90),
    )
    applied = migrator.migrate(config)
    assert [m.version for m in applied] == list(range(BEFORE_FAILURE_REASONS + 1, LATEST + 1))
    assert migrator.installed_schema_version(config) == LATEST
    # Every slow ALTER TABLE ran without a statement timeout, under the configured bounds.
    assert _observed_settings(at_version_8) == {("0", "3s", "90s", "UTC", "off")}


def test_a_role_that_defaults_to_read_only_transactions_migrates(blank_database: str) -> None:
    _set_for_role_in_database(blank_database, "default_transaction_read_only", "on")
    config = plaintext_config(blank_database)
    applied = migrator.migrate(config)
    assert [m.version for m in applied] == list(range(1, LATEST + 1))
    assert migrator.installed_schema_version(config) == LATEST


@pytest.fixture
def job_execution_reader(at_version_8: str) -> Iterator[psycopg.Connection[Any]]:
    """A long read transaction: it holds ACCESS SHARE on job_execution until it ends."""
    with psycopg.connect(at_version_8) as conn:
        conn.execute("SELECT count(*) FROM pybatch.job_execution")
        yield conn
        conn.rollback()


class _RetryWatcher(logging.Handler):
    """Sets `retried` when the migrator logs its first lock-wait retry."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.retried = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "attempt 1 of" in record.getMessage():
            self.retried.set()


@pytest.fixture
def retry_watcher(caplog: pytest.LogCaptureFixture) -> Iterator[_RetryWatcher]:
    caplog.set_level(logging.INFO, logger=migrator.__name__)
    watcher = _RetryWatcher()
    logging.getLogger(migrator.__name__).addHandler(watcher)
    yield watcher
    logging.getLogger(migrator.__name__).removeHandler(watcher)


def _retry_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == migrator.__name__ and r.levelno == logging.INFO
    ]


def test_a_migration_blocked_by_a_reader_retries_and_applies_once_it_ends(
    at_version_8: str,
    job_execution_reader: psycopg.Connection[Any],
    retry_watcher: _RetryWatcher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def end_the_reader_after_the_first_retry() -> None:
        if retry_watcher.retried.wait(30):
            job_execution_reader.rollback()

    releaser = threading.Thread(target=end_the_reader_after_the_first_retry)
    releaser.start()
    try:
        applied = migrator.migrate(plaintext_config(at_version_8, lock_timeout=LOCK_TIMEOUT))
    finally:
        retry_watcher.retried.set()
        releaser.join(30)
    assert [m.version for m in applied] == list(range(BEFORE_FAILURE_REASONS + 1, LATEST + 1))
    messages = _retry_messages(caplog)
    assert messages and all("migration 0009 (failure_reasons)" in m for m in messages)
    assert "waited its lock timeout (200ms)" in messages[0]
    assert "attempt 1 of 5 rolled back" in messages[0]


def test_a_migration_blocked_for_every_attempt_fails_typed_and_changes_nothing(
    at_version_8: str,
    job_execution_reader: psycopg.Connection[Any],
    retry_watcher: _RetryWatcher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = plaintext_config(at_version_8, lock_timeout=LOCK_TIMEOUT)
    with pytest.raises(errors.MigrationTableLockTimeout) as caught:
        migrator.migrate(config)
    assert (caught.value.version, caught.value.attempts) == (BEFORE_FAILURE_REASONS + 1, 5)
    assert caught.value.__context__ is None and caught.value.__cause__ is None  # no driver text
    attempts = re.findall(r"attempt (\d) of 5", "\n".join(_retry_messages(caplog)))
    assert attempts == ["1", "2", "3", "4"]  # logged before each retry, not after the last
    job_execution_reader.rollback()
    assert migrator.installed_schema_version(config) == BEFORE_FAILURE_REASONS
    with psycopg.connect(at_version_8) as conn:
        columns = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_schema = 'pybatch' AND column_name = 'failure_error_class'"
        ).fetchone()
    assert columns == (0,)


def test_a_migration_chosen_as_deadlock_victim_retries_and_applies_once_the_other_ends(
    at_version_8: str,
    job_execution_reader: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reader holds job_execution, which 0009 alters, then asks for the history lock the
    migrator holds: a cycle. The reader never runs the deadlock check (its deadlock_timeout is
    an hour), so the migrator is the victim; its file rolls back whole and is tried again."""
    caplog.set_level(logging.INFO, logger=migrator.__name__)
    job_execution_reader.execute("SET deadlock_timeout = '1h'")
    reader_pid = job_execution_reader.info.backend_pid
    closed: list[BaseException] = []

    def close_the_cycle() -> None:
        try:
            with psycopg.connect(at_version_8, autocommit=True) as watcher:
                while not watcher.execute(
                    "SELECT EXISTS (SELECT FROM pg_catalog.pg_locks AS l"
                    " WHERE NOT l.granted AND l.relation = 'pybatch.job_execution'::regclass"
                    " AND l.pid <> %s)",
                    (reader_pid,),
                ).fetchone() == (True,):
                    time.sleep(0.005)
            # Waits until the migrator's deadlock check rolls it back, then lets it retry.
            job_execution_reader.execute("LOCK TABLE pybatch.schema_migration IN ROW SHARE MODE")
            job_execution_reader.rollback()
        except BaseException as error:  # reported by the assertion below
            closed.append(error)

    closer = threading.Thread(target=close_the_cycle)
    closer.start()
    try:
        applied = migrator.migrate(
            plaintext_config(at_version_8, lock_timeout=timedelta(seconds=20))
        )
    finally:
        closer.join(30)
    assert closed == []
    assert [m.version for m in applied] == list(range(BEFORE_FAILURE_REASONS + 1, LATEST + 1))
    messages = _retry_messages(caplog)
    assert len(messages) == 1, messages
    assert messages[0].startswith("migration 0009 (failure_reasons) deadlocked on a lock")
    assert "attempt 1 of 5 rolled back" in messages[0]


def test_printed_sql_sets_the_migrator_bounds_in_every_transaction(at_version_8: str) -> None:
    config = plaintext_config(
        at_version_8,
        lock_timeout=timedelta(seconds=3),
        idle_transaction_timeout=timedelta(seconds=90),
    )
    script = migrator.migration_sql(config)
    blocks = script.split("COMMIT;")[:-1]
    assert len(blocks) == 1 + LATEST - BEFORE_FAILURE_REASONS  # the schema, then each file
    for block in blocks:
        # Each block opens READ WRITE and sets the bounds before its first other statement.
        begin, _, rest = block.strip().partition("\n")
        assert begin == "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;"
        assert rest.startswith("-- pybatch schema.sql set_migrator_transaction_settings\n")
        settings = re.sub(r"\s+", "", rest[: rest.index("AS time_zone;")])
        assert "SET_CONFIG('statement_timeout','0',TRUE)" in settings
        assert "SET_CONFIG('lock_timeout','3000ms',TRUE)" in settings
        assert "SET_CONFIG('idle_in_transaction_session_timeout','90000ms',TRUE)" in settings
        assert "SET_CONFIG('TimeZone','UTC',TRUE)" in settings


def test_printed_sql_run_by_hand_holds_against_a_hostile_role(at_version_8: str) -> None:
    _plant_slow_alter_table(at_version_8)
    script = migrator.migration_sql(plaintext_config(at_version_8))
    _set_for_role_in_database(at_version_8, "statement_timeout", "50ms")
    _set_for_role_in_database(at_version_8, "default_transaction_read_only", "on")
    with psycopg.connect(at_version_8, autocommit=True) as conn:
        conn.execute(script.encode())
    assert migrator.installed_schema_version(plaintext_config(at_version_8)) == LATEST
    assert {row[0] for row in _observed_settings(at_version_8)} == {"0"}


def test_the_migrator_prepares_nothing_on_the_server(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a transaction-mode pooler the next transaction may run on another server
    connection, where a statement prepared by this one does not exist.

    The package is cut to files 0001..0008: psycopg forgets its prepared statements after an
    ALTER, which 0009 and 0010 end with, and would hide the ones prepared before.
    """
    prepared: list[int] = []

    @contextlib.contextmanager
    def observed(config: ConnectionConfig, *, autocommit: bool) -> Iterator[Any]:
        with open_connection(config, autocommit=autocommit) as conn:
            yield conn
            row = conn.execute("SELECT count(*) FROM pg_catalog.pg_prepared_statements")
            prepared.append(row.fetchone()[0])  # type: ignore[index]

    shipped = migrator.shipped_migrations()[:BEFORE_FAILURE_REASONS]
    monkeypatch.setattr(migrator, "shipped_migrations", lambda: shipped)
    monkeypatch.setattr(migrator, "open_connection", observed)
    applied = migrator.migrate(plaintext_config(blank_database))
    assert len(applied) == BEFORE_FAILURE_REASONS  # one transaction per file, one connection
    assert prepared == [0]


def test_migrate_through_a_transaction_pooler_keeps_its_own_bounds(
    at_version_8: str, postgresql_proc: Any
) -> None:
    """PgBouncer in transaction mode drops startup options: the bounds come from each
    transaction, and the server's defaults (no lock timeout here) never apply."""
    _plant_slow_alter_table(at_version_8)
    _set_for_role_in_database(at_version_8, "statement_timeout", "50ms")
    dbname = psycopg.conninfo.conninfo_to_dict(at_version_8)["dbname"]
    with pgbouncer(
        server_port=postgresql_proc.port, user=postgresql_proc.user, pool_mode="transaction"
    ) as bouncer:
        config = plaintext_config(
            bouncer.dsn(user=postgresql_proc.user, dbname=str(dbname)),
            pooler=Pooler.TRANSACTION,
            lock_timeout=timedelta(seconds=3),
            idle_transaction_timeout=timedelta(seconds=90),
        )
        applied = migrator.migrate(config)
    assert [m.version for m in applied] == list(range(BEFORE_FAILURE_REASONS + 1, LATEST + 1))
    assert _observed_settings(at_version_8) == {("0", "3s", "90s", "UTC", "off")}
