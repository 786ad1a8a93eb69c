"""Schema migrations: numbered, checksummed files, one transaction each (docs/tables.md 7)."""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch._codecs._primitives import DecodeError, decode_digest, decode_int64
from pybatch._config import ConnectionConfig
from pybatch._connect import open_connection
from pybatch._resources import migrations_dir
from pybatch._statements import load_statements
from pybatch.errors import (
    MigrationChecksumMismatch,
    MigrationHistoryInvalid,
    MigrationLockTimeout,
    NewerSchema,
    PyBatchError,
    Unavailable,
)

_T = TypeVar("_T")
_P = ParamSpec("_P")

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


def shipped_migrations() -> list[Migration]:
    """Every migration file shipped with this package, in version order, contiguous from 1."""
    found: list[Migration] = []
    for path in sorted(migrations_dir().glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
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
            raise Unavailable() from None
    if mapped.__class__.__name__ == "SchemaUninitialized":
        return None
    raise mapped


def _driver_errors_mapped(operation: Callable[_P, _T]) -> Callable[_P, _T]:
    """Every driver error leaves as a pybatch error raised outside `except` (no driver text)."""

    @functools.wraps(operation)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        mapped: PyBatchError | None = None
        try:
            return operation(*args, **kwargs)
        except psycopg.Error as error:
            mapped = _sqlstate.translate(error)
        raise mapped

    return run


@_driver_errors_mapped
def installed_schema_version(config: ConnectionConfig) -> int | None:
    """Read the installed schema version: no lock, no DDL, fine for a read-only role."""
    with open_connection(config, autocommit=True) as conn:
        return _read_version(conn)


def _lock_migrations(conn: psycopg.Connection[Any]) -> bool:
    """Serialize migrators for this transaction (within lock_timeout); True if locked.

    The lock is a table lock on the history, which a role that may not write it cannot hold
    against us (an advisory key could be held by anyone). A first install takes none: the
    catalogue settles concurrent ones (the loser's CREATE collides and retries, `migrate`).
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
    try:
        history = [
            (
                decode_int64(row["version"], column="version", minimum=1),
                decode_digest(row["checksum"], column="checksum"),
            )
            for row in statements.list_schema_migrations.many(conn)
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


def _pending(conn: psycopg.Connection[Any], shipped: list[Migration]) -> list[Migration]:
    """The shipped files not applied yet; a newer schema, then a changed history, is refused."""
    installed = _read_version(conn)
    current = installed or 0
    supported = shipped[-1].version
    if current > supported:
        raise NewerSchema(current=current, supported=supported)
    _verify_history(conn, installed, shipped)
    return [migration for migration in shipped if migration.version > current]


@_driver_errors_mapped
def migration_sql(config: ConnectionConfig) -> str:
    """The exact SQL `migrate` would run now (same refusals), for a DBA to review or run by hand."""
    statements = load_statements()
    shipped = shipped_migrations()
    with open_connection(config, autocommit=True) as conn:
        pending = _pending(conn, shipped)
        cursor = psycopg.ClientCursor(conn)
        parts = [cursor.mogrify(statements.create_pybatch_schema.query) + "\n"]
        for m in pending:
            row = {"version": m.version, "name": m.name, "checksum": m.checksum, "execution_ms": 0}
            insert = cursor.mogrify(statements.insert_schema_migration.query, row)
            update = cursor.mogrify(statements.update_schema_version.query, {"version": m.version})
            parts.append(
                f"BEGIN ISOLATION LEVEL READ COMMITTED;\n{m.text()}\n{insert}\n{update}\nCOMMIT;\n"
            )
    return "\n".join(parts)


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


@_driver_errors_mapped
def migrate(config: ConnectionConfig, *, dry_run: bool = False) -> list[Migration]:
    """Bring the schema to the supported version; return the files applied (or pending).

    Safe when several processes run it at once: each file runs in its own transaction that
    takes the migrator lock and re-reads the installed version, so later migrators find
    nothing pending. No lock another role could hold is waited on: a first install takes
    none, and one colliding with a concurrent first install rolls back and looks again
    (then under the history lock). A newer schema or changed checksum is refused first.
    """
    shipped = shipped_migrations()
    applied: list[Migration] = []
    races = 0
    with open_connection(config, autocommit=True) as conn:
        while True:
            locked = False
            try:
                with conn.transaction():
                    locked = _lock_migrations(conn)
                    pending = _pending(conn, shipped)
                    if dry_run:
                        return pending
                    if not pending:
                        break
                    load_statements().create_pybatch_schema.affected(conn)
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
