"""Schema migrations: numbered, checksummed files, one transaction each (docs/tables.md 7)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import random
import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch import errors as e
from pybatch._codecs._primitives import DecodeError, decode_digest, decode_int64
from pybatch._config import ConnectionConfig
from pybatch._connect import open_connection
from pybatch._statements import load_statements, migrations_dir

_T = TypeVar("_T")
_P = ParamSpec("_P")

logger = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: No statement timeout: a cancelled migration only wastes its work; the lock timeout is what
#: keeps it from stalling the jobs queued behind its locks.
_STATEMENT_TIMEOUT = "0"
#: Tries of one migration whose statement waits past the lock timeout (55P03) or is chosen as a
#: deadlock victim (40P01), and the first pause (doubled with jitter, capped): a short report or
#: `pg_dump` ends within the window.
_LOCK_WAIT_ATTEMPTS = 5
#: The lock failures that roll a file back whole and leave it worth another try. A deadlock can
#: involve another first install: it takes no history lock, so it is not serialized with us.
_LOCK_WAIT_STATES = {"55P03": "waited its lock timeout ({timeout}) for", "40P01": "deadlocked on"}
_LOCK_WAIT_PAUSE = timedelta(milliseconds=100)
_LOCK_WAIT_PAUSE_MAX = timedelta(seconds=2)


@attrs.frozen
class Migration:
    """One shipped migration file."""

    version: int
    name: str
    path: Path = attrs.field(repr=False)
    checksum: bytes = attrs.field(repr=False)

    def text(self) -> str:
        """The file's SQL, exactly as shipped."""
        return self.path.read_text(encoding="utf-8")


def shipped_migrations() -> list[Migration]:
    """Every migration file shipped with this package, in version order, contiguous from 1."""
    found: list[Migration] = []
    for path in sorted(migrations_dir().glob("*.sql")):
        if (match := _FILE_NAME.match(path.name)) is None:
            raise ValueError(f"migration file {path.name} is not named NNNN_description.sql")
        checksum = hashlib.sha256(path.read_bytes()).digest()
        found.append(Migration(int(match.group(1)), match.group(2), path, checksum))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise ValueError(f"migration files are not contiguous at {migration.version}")
    return found


def supported_schema_version() -> int:
    """The schema version this package runs against (the highest shipped migration)."""
    return shipped_migrations()[-1].version


def _read_version(conn: psycopg.Connection[Any]) -> int | None:
    """Installed version, or None when the schema, the table or the row is missing."""
    try:
        with conn.transaction():
            version = load_statements().read_schema_version.scalar(conn)
    except psycopg.Error as error:
        mapped = _sqlstate.translate(error, schema_probe=True)
    else:
        if version is None:
            return None
        try:
            return decode_int64(version, column="version", minimum=0)
        except DecodeError:
            raise e.Unavailable() from None
    if isinstance(mapped, e.SchemaUninitialized):
        return None
    raise mapped


def _driver_errors_mapped(operation: Callable[_P, _T]) -> Callable[_P, _T]:
    """Every driver error leaves as a pybatch error raised outside `except` (no driver text)."""

    @functools.wraps(operation)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return operation(*args, **kwargs)
        except psycopg.Error as error:
            mapped = _sqlstate.translate(error)
        raise mapped

    return run


@_driver_errors_mapped
def installed_schema_version(config: ConnectionConfig) -> int | None:
    """Read the installed schema version: no lock, no DDL, fine for a read-only role."""
    with _migrator_connection(config) as conn:
        return _read_version(conn)


def _lock_migrations(conn: psycopg.Connection[Any]) -> bool:
    """Lock the history table, not an advisory key anyone could hold; a first install has none."""
    statements = load_statements()
    try:
        if statements.find_schema_migration_table.scalar(conn):
            statements.lock_schema_migration_history.affected(conn)
            return True
    except psycopg.errors.LockNotAvailable:
        raise e.MigrationLockTimeout() from None
    return False


#: SQLSTATEs of a first install that lost the race to a concurrent one (duplicate object,
#: unique key, deadlock, lock timeout): it rolls back and looks again, this many times.
_FIRST_INSTALL_RACE = frozenset({"42P06", "42P07", "42710", "23505", "40P01", "55P03"})
_FIRST_INSTALL_ATTEMPTS = 5


def _verify_history(
    conn: psycopg.Connection[Any], installed: int | None, shipped: list[Migration]
) -> None:
    """Refuse a history that is not a prefix of the shipped files, byte for byte."""
    statements = load_statements()
    if installed is None:
        return
    if not statements.find_schema_migration_table.scalar(conn):
        raise e.MigrationHistoryInvalid(version=installed)
    try:
        history = [
            (
                decode_int64(row["version"], column="version", minimum=1),
                decode_digest(row["checksum"], column="checksum"),
            )
            for row in statements.list_schema_migrations.many(conn)
        ]
    except DecodeError:
        raise e.MigrationHistoryInvalid(version=installed) from None
    if [version for version, _ in history] != list(range(1, installed + 1)):
        raise e.MigrationHistoryInvalid(version=installed)
    # Both count from 1; a version past the shipped ones was refused as NewerSchema before.
    for (version, checksum), migration in zip(history, shipped, strict=False):
        if checksum != migration.checksum:
            raise e.MigrationChecksumMismatch(version=version)


def _pending(conn: psycopg.Connection[Any], shipped: list[Migration]) -> list[Migration]:
    """The shipped files not applied yet; a newer schema, then a changed history, is refused."""
    installed = _read_version(conn)
    current = installed or 0
    supported = shipped[-1].version
    if current > supported:
        raise e.NewerSchema(current=current, supported=supported)
    _verify_history(conn, installed, shipped)
    return [migration for migration in shipped if migration.version > current]


def _setting_ms(value: timedelta) -> str:
    """A duration as a setting: whole milliseconds, rounded up, never 0 (which means none)."""
    return f"{max(1, math.ceil(value / timedelta(milliseconds=1)))}ms"


def _transaction_settings(config: ConnectionConfig) -> dict[str, str]:
    """The values of `set_migrator_transaction_settings`: the migrator's, not the role's."""
    return {
        "statement_timeout": _STATEMENT_TIMEOUT,
        "lock_timeout": _setting_ms(config.lock_timeout),
        "idle_in_transaction_session_timeout": _setting_ms(config.idle_transaction_timeout),
        "time_zone": "UTC",
    }


@contextlib.contextmanager
def _migrator_transaction(
    conn: psycopg.Connection[Any], config: ConnectionConfig
) -> Iterator[None]:
    """One transaction that first sets the migrator's bounds, whatever role or pooler bring."""
    with conn.transaction():
        load_statements().set_migrator_transaction_settings.one(
            conn, **_transaction_settings(config)
        )
        yield


@contextlib.contextmanager
def _migrator_connection(
    config: ConnectionConfig, *, read_write: bool = False
) -> Iterator[psycopg.Connection[Any]]:
    """Autocommit, nothing prepared (transaction pooler); `read_write` beats a read-only role."""
    with open_connection(config, autocommit=True) as conn:
        conn.prepare_threshold = None
        if read_write:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            conn.read_only = False
        yield conn


@_driver_errors_mapped
def migration_sql(config: ConnectionConfig) -> str:
    """The exact SQL `migrate` would run now, settings included, for a DBA to run by hand."""
    statements = load_statements()
    shipped = shipped_migrations()
    with _migrator_connection(config) as conn:
        with _migrator_transaction(conn, config):
            pending = _pending(conn, shipped)
        cursor = psycopg.ClientCursor(conn)
        bounds = cursor.mogrify(
            statements.set_migrator_transaction_settings.query, _transaction_settings(config)
        )

        def block(body: str) -> str:  # BEGIN as a `read_write` connection sends it
            return f"BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;\n{bounds}\n{body}\nCOMMIT;\n"

        parts = [block(cursor.mogrify(statements.create_pybatch_schema.query))]
        for m in pending:
            row = {"version": m.version, "name": m.name, "checksum": m.checksum, "execution_ms": 0}
            insert = cursor.mogrify(statements.insert_schema_migration.query, row)
            update = cursor.mogrify(statements.update_schema_version.query, {"version": m.version})
            parts.append(block(f"{m.text()}\n{insert}\n{update}"))
    return "\n".join(parts)


def _pause_for_lock(
    config: ConnectionConfig, migration: Migration, state: str, attempt: int
) -> None:
    """Log the lock wait given up on, then back off so the holder can finish."""
    backoff = min(_LOCK_WAIT_PAUSE * 2 ** (attempt - 1), _LOCK_WAIT_PAUSE_MAX)
    pause = backoff * random.uniform(0.5, 1.0)  # jitter: concurrent migrators spread out
    logger.info(
        "migration %04d (%s) %s a lock another transaction holds on a table it changes;"
        " attempt %d of %d rolled back, next in %d ms",
        migration.version,
        migration.name,
        _LOCK_WAIT_STATES[state].format(timeout=_setting_ms(config.lock_timeout)),
        attempt,
        _LOCK_WAIT_ATTEMPTS,
        pause / timedelta(milliseconds=1),
    )
    time.sleep(pause.total_seconds())


def _apply(conn: psycopg.Connection[Any], migration: Migration) -> None:
    statements = load_statements()
    started = time.monotonic()
    with conn.transaction():
        conn.execute(migration.text().encode("utf-8"))
        statements.insert_schema_migration.affected(
            conn,
            version=migration.version,
            name=migration.name,
            checksum=migration.checksum,
            execution_ms=int((time.monotonic() - started) * 1000),
        )
        if statements.update_schema_version.affected(conn, version=migration.version) != 1:
            raise e.MigrationHistoryInvalid(version=migration.version)


@_driver_errors_mapped
def migrate(config: ConnectionConfig, *, dry_run: bool = False) -> list[Migration]:
    """Bring the schema to the supported version; return the files applied (or pending).

    Concurrent migrators are safe: each file is one transaction under the history lock that
    re-reads the version; a first install (no history to lock) applies only the first file,
    and one that races another rolls back and looks again. A file whose table locks time out
    or deadlock is retried whole; after the last try a timeout is MigrationTableLockTimeout
    and a deadlock its driver error, mapped.
    """
    shipped = shipped_migrations()
    applied: list[Migration] = []
    races = lock_waits = 0
    with _migrator_connection(config, read_write=True) as conn:
        while True:
            locked = False
            migration: Migration | None = None
            exhausted: Migration | None = None
            try:
                with _migrator_transaction(conn, config):
                    locked = _lock_migrations(conn)
                    pending = _pending(conn, shipped)
                    if dry_run:
                        return pending
                    if not pending:
                        break
                    migration = pending[0]
                    if not locked and migration.version != 1:
                        continue  # another install created the history meanwhile: lock it first
                    load_statements().create_pybatch_schema.affected(conn)
                    _apply(conn, migration)
                    applied.append(migration)
                lock_waits = 0  # each file has its own attempts
            except psycopg.Error as error:
                state = _sqlstate.sqlstate_of(error)
                lock_failure = state in _LOCK_WAIT_STATES and not conn.broken
                if locked and migration is not None and state is not None and lock_failure:
                    lock_waits += 1
                    if lock_waits < _LOCK_WAIT_ATTEMPTS:
                        _pause_for_lock(config, migration, state, lock_waits)
                        continue
                    if state != "55P03":
                        raise
                    exhausted = migration
                else:
                    races += 1
                    if locked or state not in _FIRST_INSTALL_RACE or conn.broken:
                        raise
                    if races >= _FIRST_INSTALL_ATTEMPTS:
                        raise e.MigrationLockTimeout() from None
            if exhausted is not None:  # raised outside `except`: no driver error attached
                raise e.MigrationTableLockTimeout(version=exhausted.version, attempts=lock_waits)
        with _migrator_transaction(conn, config):
            final = _read_version(conn)
        if final != shipped[-1].version:
            raise e.MigrationHistoryInvalid(version=final or 0)
        return applied
