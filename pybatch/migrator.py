"""Schema migrations: numbered, checksummed files applied under the migrator lock.

See docs/tables.md 7. Each migration file runs whole in its own transaction; the connection's
lock timeout (a startup setting) bounds the wait for the migration lock.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch._connect import open_connection
from pybatch._resources import migrations_dir
from pybatch._statements import load_statements
from pybatch.codecs._primitives import DecodeError, decode_digest, decode_int64
from pybatch.config import ConnectionConfig
from pybatch.errors import (
    MigrationChecksumMismatch,
    MigrationHistoryInvalid,
    MigrationLockTimeout,
    NewerSchema,
    PyBatchError,
    Unavailable,
)

_T = TypeVar("_T")

__all__ = [
    "Migration",
    "installed_schema_version",
    "migrate",
    "migration_sql",
    "pending_migrations",
    "shipped_migrations",
    "supported_schema_version",
]

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


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


def shipped_migrations(directory: Path | None = None) -> list[Migration]:
    """Every migration file shipped with this package, in version order, contiguous from 1."""
    folder = directory or migrations_dir()
    found: list[Migration] = []
    for path in sorted(folder.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ValueError(f"migration file {path.name} is not named NNNN_description.sql")
        data = path.read_bytes()
        found.append(
            Migration(
                version=int(match.group(1)),
                name=match.group(2),
                path=path,
                checksum=hashlib.sha256(data).digest(),
            )
        )
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
            raise Unavailable() from None
    if mapped.__class__.__name__ == "SchemaUninitialized":
        return None
    raise mapped


def _driver_errors_mapped(operation: Callable[[], _T]) -> _T:
    """Run a migrator operation; every driver error leaves as a redacted pybatch error.

    42501 (the role lacks a privilege) is PermissionDenied; anything else is Unavailable
    with its SQLSTATE. Raised after the `except` block, so the driver's message is neither
    the cause nor the context.
    """
    mapped: PyBatchError | None = None
    try:
        return operation()
    except psycopg.Error as error:
        mapped = _sqlstate.translate(error)
    raise mapped


def installed_schema_version(config: ConnectionConfig) -> int | None:
    """Read the installed schema version: no lock, no DDL, fine for a read-only role."""

    def read() -> int | None:
        with open_connection(config, autocommit=True) as conn:
            return _read_version(conn)

    return _driver_errors_mapped(read)


def _lock_migrations(conn: psycopg.Connection[Any]) -> bool:
    """Serialize migrators for the current transaction, bounded by the session lock_timeout.

    Once the history table exists the lock is a table lock on it, which a role without
    write privileges on pybatch's history cannot take (or hold against us). Before it exists
    (the first install) no lock is taken at all: an advisory key could be held by any role
    that can connect. Concurrent first installs are then settled by the catalogue itself
    (the loser's CREATE collides with the winner's objects and is retried, see `migrate`).
    Returns whether the history lock is held.

    Raises:
        MigrationLockTimeout: the history lock was not granted within the lock timeout.
    """
    statements = load_statements()
    try:
        if statements.find_schema_migration_table.scalar(conn):
            statements.lock_schema_migration_history.affected(conn)
            return True
    except psycopg.errors.LockNotAvailable:
        raise MigrationLockTimeout() from None
    return False


#: SQLSTATEs of a first install that lost the race to a concurrent one: a duplicate schema,
#: table or object, a catalogue unique key, a deadlock between the two, or the wait for the
#: winner's transaction outlasting the lock timeout. The loser rolls back and looks again.
_FIRST_INSTALL_RACE = frozenset({"42P06", "42P07", "42710", "23505", "40P01", "55P03"})
#: How often a first install that lost such a race looks again before giving up.
_FIRST_INSTALL_ATTEMPTS = 5


def _verify_history(
    conn: psycopg.Connection[Any], installed: int | None, shipped: list[Migration]
) -> None:
    """Refuse a history that is not a prefix of the shipped files, byte for byte."""
    statements = load_statements()
    if installed is None:
        return
    if not statements.find_schema_migration_table.scalar(conn):
        raise MigrationHistoryInvalid(version=installed)
    applied = statements.list_schema_migrations.many(conn)
    try:
        history = [
            (
                decode_int64(row["version"], column="version", minimum=1),
                decode_digest(row["checksum"], column="checksum"),
            )
            for row in applied
        ]
    except DecodeError:
        raise MigrationHistoryInvalid(version=installed) from None
    if [version for version, _ in history] != list(range(1, installed + 1)):
        raise MigrationHistoryInvalid(version=installed)
    by_version = {migration.version: migration for migration in shipped}
    for version, checksum in history:
        migration = by_version.get(version)
        if migration is None:
            continue  # newer than this package: reported as NewerSchema before we get here
        if checksum != migration.checksum:
            raise MigrationChecksumMismatch(version=version)


def _pending(installed: int | None, shipped: list[Migration]) -> list[Migration]:
    current = installed or 0
    supported = shipped[-1].version
    if current > supported:
        raise NewerSchema(current=current, supported=supported)
    return [migration for migration in shipped if migration.version > current]


def pending_migrations(config: ConnectionConfig) -> list[Migration]:
    """The files `migrate` would apply now, after the same refusals (read-only)."""
    shipped = shipped_migrations()

    def read() -> list[Migration]:
        with open_connection(config, autocommit=True) as conn:
            installed = _read_version(conn)
            pending = _pending(installed, shipped)
            _verify_history(conn, installed, shipped)
            return pending

    return _driver_errors_mapped(read)


def migration_sql(config: ConnectionConfig) -> str:
    """The exact SQL `migrate` would run now, for a DBA to review or apply by hand."""
    statements = load_statements()
    pending = pending_migrations(config)

    def render() -> list[str]:
        with open_connection(config, autocommit=True) as conn:
            cursor = psycopg.ClientCursor(conn)
            parts = [cursor.mogrify(statements.create_pybatch_schema.query) + "\n"]
            for migration in pending:
                bookkeeping = [
                    cursor.mogrify(
                        statements.insert_schema_migration.query,
                        {
                            "version": migration.version,
                            "name": migration.name,
                            "checksum": migration.checksum,
                            "execution_ms": 0,
                        },
                    ),
                    cursor.mogrify(
                        statements.update_schema_version.query, {"version": migration.version}
                    ),
                ]
                parts.append(
                    "BEGIN ISOLATION LEVEL READ COMMITTED;\n"
                    + migration.text()
                    + "\n"
                    + "\n".join(bookkeeping)
                    + "\nCOMMIT;\n"
                )
        return parts

    return "\n".join(_driver_errors_mapped(render))


def _apply(conn: psycopg.Connection[Any], migration: Migration) -> None:
    statements = load_statements()
    started = time.monotonic()
    with conn.transaction():
        conn.execute(migration.text().encode("utf-8"))
        elapsed_ms = int((time.monotonic() - started) * 1000)
        statements.insert_schema_migration.affected(
            conn,
            version=migration.version,
            name=migration.name,
            checksum=migration.checksum,
            execution_ms=elapsed_ms,
        )
        if statements.update_schema_version.affected(conn, version=migration.version) != 1:
            raise MigrationHistoryInvalid(version=migration.version)


def migrate(config: ConnectionConfig, *, dry_run: bool = False) -> list[Migration]:
    """Bring the schema to the supported version; return the files applied (or pending).

    Safe when several processes run it at once: each migration file runs in its own
    transaction that first takes the migrator lock (`_lock_migrations`) and re-reads the
    installed version, so concurrent migrators serialize and the later ones find nothing
    pending. No lock that another role could hold is ever waited on: a first install
    takes none, and one that collides with a concurrent first install rolls back and
    looks again (then under the history lock). A newer schema or an applied file whose
    checksum changed is refused before anything runs.
    """
    shipped = shipped_migrations()

    def run() -> list[Migration]:
        statements = load_statements()
        applied: list[Migration] = []
        races = 0
        with open_connection(config, autocommit=True) as conn:
            while True:
                locked = False
                try:
                    with conn.transaction():
                        locked = _lock_migrations(conn)
                        installed = _read_version(conn)
                        pending = _pending(installed, shipped)
                        _verify_history(conn, installed, shipped)
                        if dry_run:
                            return pending
                        if not pending:
                            break
                        statements.create_pybatch_schema.affected(conn)
                        _apply(conn, pending[0])
                        applied.append(pending[0])
                except psycopg.Error as error:
                    race = not locked and _sqlstate.sqlstate_of(error) in _FIRST_INSTALL_RACE
                    races += 1
                    if not race or conn.broken:
                        raise
                    if races >= _FIRST_INSTALL_ATTEMPTS:
                        raise MigrationLockTimeout() from None
            final = _read_version(conn)
            if final != shipped[-1].version:
                raise MigrationHistoryInvalid(version=final or 0)
            return applied

    return _driver_errors_mapped(run)
