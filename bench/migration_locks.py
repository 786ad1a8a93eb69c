"""How long each shipped migration holds its locks on a loaded repository.

Why: a migration runs in one transaction, so every lock it takes is held until its COMMIT;
a DBA planning an upgrade needs to know, per file, which tables it blocks, in which mode,
and for how long at their table sizes. This program installs 0001 into a scratch database,
loads `--rows` completed executions (an instance, an execution and a step each), and then
applies 0002, 0003, ... one transaction each, exactly as the migrator does, printing per file:

* the strongest lock it held on each pybatch table (read from pg_locks just before COMMIT);
* its lock window: the seconds from its first statement to its COMMIT, an upper bound on
  how long any of those locks blocked others.

    python -m bench.migration_locks [--dsn DSN] [--rows 1000000 [10000000 ...]]

Method (docs/dba.md, "Migration lock windows"): rows are generated server-side by one
INSERT ... SELECT generate_series (bench.launch's history loader), then VACUUM ANALYZE and a
CHECKPOINT, so each window measures the migration, not leftover writes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from bench._server import admin_connect, postgres_server, scratch_database
from bench.launch import HISTORY_SQL, JOB, history_parameters
from pybatch._migrator import Migration, shipped_migrations
from pybatch.values.definitions import DefinitionIdentity

#: The last migration measured: those after it are not shipped yet.
LAST_SHIPPED = 8
#: Lock modes that block other sessions' writes (or reads, for ACCESS EXCLUSIVE), strongest
#: first; weaker modes (ROW EXCLUSIVE, SHARE UPDATE EXCLUSIVE) do not stop a running job.
BLOCKING_MODES = (
    "AccessExclusiveLock",
    "ExclusiveLock",
    "ShareRowExclusiveLock",
    "ShareLock",
)

DEFINITION_SQL = b"""
INSERT INTO pybatch.job_definition (
    job_name, definition_revision, manifest_format, manifest_digest, manifest, registered_at
)
VALUES (%(job_name)s, %(revision)s, 1, sha256(convert_to(%(job_name)s, 'UTF8')), '{}', now())
"""

LOCKS_SQL = b"""
SELECT c.relname, l.mode
FROM pg_catalog.pg_locks AS l
JOIN pg_catalog.pg_class AS c ON c.oid = l.relation
WHERE l.pid = pg_catalog.pg_backend_pid()
  AND c.relnamespace = 'pybatch'::regnamespace
  AND c.relkind IN ('r', 'p')
  AND l.granted
"""


def _apply(conn: psycopg.Connection[Any], migration: Migration) -> tuple[float, dict[str, str]]:
    """Run one file in one transaction; its window in seconds and its strongest table locks."""
    began = time.monotonic()
    with conn.transaction():
        conn.execute(migration.text().encode("utf-8"))
        strongest: dict[str, str] = {}
        for table, mode in conn.execute(LOCKS_SQL).fetchall():
            if mode not in BLOCKING_MODES:
                continue
            held = strongest.get(table)
            if held is None or BLOCKING_MODES.index(mode) < BLOCKING_MODES.index(held):
                strongest[table] = mode
    return time.monotonic() - began, strongest


def measure(server_dsn: str, rows: int) -> list[tuple[Migration, float, dict[str, str]]]:
    """Every shipped migration after 0001, applied over `rows` loaded executions."""
    first, *later = [m for m in shipped_migrations() if m.version <= LAST_SHIPPED]
    with (
        scratch_database(server_dsn, "migration_locks") as dsn,
        admin_connect(dsn, autocommit=False) as conn,
    ):
        with conn.transaction():
            conn.execute("CREATE SCHEMA pybatch")  # what the migrator does before 0001
        _apply(conn, first)
        revision = DefinitionIdentity.LEGACY.revision.value
        loading = time.monotonic()
        with conn.transaction():
            conn.execute(DEFINITION_SQL, {"job_name": JOB.value, "revision": revision})
            origin = dt.datetime.now(dt.UTC) - dt.timedelta(days=400)
            conn.execute(HISTORY_SQL, history_parameters(JOB.value, rows, origin))
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        conn.autocommit = False
        print(f"loaded {rows:,} executions in {time.monotonic() - loading:.1f} s", flush=True)
        results = []
        for migration in later:
            window, locks = _apply(conn, migration)
            print(f"  {migration.version:04d} {window:8.2f} s", flush=True)
            results.append((migration, window, locks))
        return results


def _lock_summary(locks: dict[str, str]) -> str:
    by_mode: dict[str, list[str]] = {}
    for table, mode in sorted(locks.items()):
        by_mode.setdefault(mode.removesuffix("Lock"), []).append(table)
    return "; ".join(f"{mode}: {', '.join(tables)}" for mode, tables in by_mode.items()) or "-"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options; the default is the documented 1,000,000 rows."""
    parser = argparse.ArgumentParser(prog="python -m bench.migration_locks", description=__doc__)
    parser.add_argument(
        "--dsn",
        help="a server to use instead of an embedded one; its role needs CREATEDB (one"
        " scratch database per size is created and dropped) and it must accept plaintext",
    )
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[1_000_000], help="executions to load, per run"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with postgres_server(args.dsn) as server_dsn:
        runs = {rows: measure(server_dsn, rows) for rows in args.rows}
    header = "migration".ljust(44) + "".join(f"{rows:>14,}" for rows in runs)
    print(f"\nlock window (s, first statement to COMMIT) per loaded executions\n{header}")
    first_run = next(iter(runs.values()))
    for index, (migration, _, locks) in enumerate(first_run):
        label = f"{migration.version:04d}_{migration.name}"[:43].ljust(44)
        windows = "".join(f"{run[index][1]:>14.2f}" for run in runs.values())
        print(f"{label}{windows}\n    blocks: {_lock_summary(locks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
