"""Where a benchmark's PostgreSQL comes from: a throwaway embedded server, or `--dsn`.

A benchmark must run with one command on a developer machine (no server to set up), and
also against a real server when the figures should describe one. Either way it works in
scratch databases it creates and drops, so its rows never mix with anything else and two
databases on one server can be measured alternately, sharing the same machine noise.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pybatch._demo.embedded import EmbeddedPostgres

__all__ = [
    "ADMIN_APPLICATION",
    "admin_connect",
    "pin_apart",
    "postgres_server",
    "scratch_database",
    "wait_for_sessions",
]

#: application_name of the benchmark's own connections, told apart from pybatch's.
ADMIN_APPLICATION = "pybatch-bench"


@contextlib.contextmanager
def postgres_server(dsn: str | None, *, fsync: bool = True, pin: bool = False) -> Iterator[str]:
    """Yield `dsn` as it is, or start an EmbeddedPostgres and yield its DSN.

    `fsync` applies to the embedded server only; on (the default) so that COMMIT costs
    what it costs in production. With `pin` (embedded server only), the server's
    processes run on the last CPU and this process on the others, so neither side's CPU
    time includes sharing a core with the other (a diagnostic: a production client and its
    server rarely share a core).
    """
    if dsn is not None:
        yield dsn
        return
    with EmbeddedPostgres(durable=fsync) as server:
        if pin and server.pid is not None:
            pin_apart(server.pid)
        yield server.dsn


def pin_apart(postmaster: int) -> None:
    """Put the postmaster and its children on the last CPU, this process on the others.

    Backends forked later inherit the postmaster's CPU. Raises RuntimeError on a machine
    with one CPU.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("pinning needs at least two CPUs")
    server_cpu, client_cpus = {cpus[-1]}, set(cpus[:-1])
    for pid in (postmaster, *_children(postmaster)):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(pid, server_cpu)
    os.sched_setaffinity(0, client_cpus)


def _children(parent: int) -> list[int]:
    """The pids whose parent is `parent` (from /proc/<pid>/stat)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            children.append(int(entry.name))
    return children


def admin_connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[tuple[Any, ...]]:
    """A plain psycopg connection for setup and inspection, never timed.

    No automatic server-side preparation: the benchmark prepares and deallocates its own
    statements for EXPLAIN, and psycopg's would get in the way.
    """
    return psycopg.connect(
        dsn, autocommit=autocommit, application_name=ADMIN_APPLICATION, prepare_threshold=None
    )


@contextlib.contextmanager
def scratch_database(server_dsn: str, label: str) -> Iterator[str]:
    """Create a uniquely named database, yield its DSN, and drop it afterwards.

    The role of `server_dsn` needs CREATEDB. The drop forces out leftover sessions
    (PostgreSQL 13+), so an interrupted benchmark still cleans up.
    """
    name = f"pybatch_bench_{label}_{secrets.token_hex(4)}"
    with admin_connect(server_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with admin_connect(server_dsn) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
            if conn.info.server_version >= 130000:
                drop = drop + sql.SQL(" WITH (FORCE)")
            conn.execute(drop)


def wait_for_sessions(dsn: str, *, timeout: float = 10.0) -> None:
    """Wait until no other session is left in the database of `dsn`.

    A backend reports its last statistics when it exits, so cumulative counters read
    before that would miss the end of its work.
    """
    deadline = time.monotonic() + timeout
    with admin_connect(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
    time.sleep(0.6)  # PostgreSQL < 15 forwards statistics through a collector every 500 ms
