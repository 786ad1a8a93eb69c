"""A primary with a streaming hot standby, on loopback, for the topology tests (tests/topology).

The pair is its own two servers, never the suite's shared one: the failover test kills its
primary, and the shared server runs with fsync off and serves every other test. The primary
is initialised by initdb (whose pg_hba.conf already trusts replication from loopback, and
whose defaults give `wal_level=replica` and ten WAL senders); the standby is
`pg_basebackup -R` of it, so it streams from the primary and accepts read-only queries.

Servers run as the user tools/pg_ctl_wrapper picks (PG_RUN_AS, default postgres, when the
tests run as root: initdb and postgres refuse root), from the binaries in PG_BINDIR.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg

from tests.support.pg_harness import default_pg_ctl

DBNAME = "pybatch_topology"
USER = "postgres"
#: Speed over durability against an OS crash: the tests kill servers, never the machine.
SERVER_OPTIONS = "-c fsync=off -c full_page_writes=off -c unix_socket_directories=''"
TIMEOUT_S = 60.0


def _bindir() -> Path:
    return Path(os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    """A loopback TCP port nobody listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _pg_ctl(*args: str) -> None:
    subprocess.run([default_pg_ctl(), *args], check=True, capture_output=True, timeout=TIMEOUT_S)


@attrs.frozen
class Server:
    """One PostgreSQL server of the pair: its data directory, port and log file."""

    data_dir: Path
    port: int
    log: Path

    def dsn(self, dbname: str = DBNAME) -> str:
        return f"host=127.0.0.1 port={self.port} user={USER} dbname={dbname}"

    def connect(self, dbname: str = DBNAME) -> psycopg.Connection[Any]:
        """An autocommit admin connection, for arranging and inspecting behind pybatch."""
        return psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=5)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 {SERVER_OPTIONS}"
        _pg_ctl("start", "-w", "-D", str(self.data_dir), "-l", str(self.log), "-o", options)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; `immediate` is a crash (no shutdown checkpoint, clients cut off)."""
        if self.running():
            _pg_ctl("stop", "-w", "-D", str(self.data_dir), "-m", mode)

    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()


@attrs.frozen
class StreamingPair:
    """A primary and its streaming hot standby; `close` stops whichever still runs."""

    primary: Server
    standby: Server

    def failover_dsn(self, dbname: str = DBNAME, target: str = "read-write") -> str:
        """Both servers in one DSN, primary first: libpq takes the first matching `target`."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port}"
            f" user={USER} dbname={dbname} target_session_attrs={target}"
        )

    def wait_for_replay(self, timeout: float = TIMEOUT_S) -> None:
        """Return once the standby has replayed everything the primary has written so far."""
        with self.primary.connect() as primary:
            row = primary.execute("SELECT pg_catalog.pg_current_wal_lsn()").fetchone()
        assert row is not None
        with self.standby.connect() as standby:
            _poll(
                standby,
                "SELECT pg_catalog.pg_last_wal_replay_lsn() >= %s::pg_lsn",
                (row[0],),
                timeout,
                "the standby did not replay the primary's WAL",
            )

    def make_synchronous(self) -> None:
        """Commits wait until the standby has flushed them: an acknowledged commit survives
        promotion. Set once the standby streams, else every commit would wait for it."""
        with self.primary.connect() as primary:
            _poll(
                primary,
                "SELECT COUNT(*) > 0 FROM pg_catalog.pg_stat_replication WHERE state = 'streaming'",
                None,
                TIMEOUT_S,
                "the standby never started streaming",
            )
            primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.execute("SELECT pg_catalog.pg_reload_conf()")
            _poll(
                primary,
                "SELECT sync_state = 'sync' FROM pg_catalog.pg_stat_replication",
                None,
                TIMEOUT_S,
                "the standby did not become synchronous",
            )

    def promote(self) -> None:
        """Promote the standby to a primary and wait until it accepts writes."""
        with self.standby.connect() as standby:
            row = standby.execute("SELECT pg_catalog.pg_promote(true, 60)").fetchone()
            assert row == (True,), "the standby was not promoted within 60 s"

    def close(self) -> None:
        for server in (self.standby, self.primary):
            with contextlib.suppress(subprocess.SubprocessError):
                server.stop("immediate")


def _poll(
    conn: psycopg.Connection[Any],
    query: str,
    params: tuple[Any, ...] | None,
    timeout: float,
    failure: str,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(query, params).fetchone()
        if row is not None and row[0]:
            return
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)


def _run_as_server_user(args: list[str]) -> None:
    """pg_basebackup writes a data directory the server user must own (root cannot run it)."""
    if os.geteuid() == 0:
        args = ["runuser", "-u", os.environ.get("PG_RUN_AS", USER), "--", *args]
    subprocess.run(args, check=True, capture_output=True, timeout=TIMEOUT_S)


@contextlib.contextmanager
def streaming_pair(base: Path) -> Iterator[StreamingPair]:
    """Start a primary with database DBNAME and a hot standby streaming from it, under `base`.

    Both servers are stopped (immediately) when the block ends, whatever happened in it.
    """
    base.mkdir(parents=True, exist_ok=True)
    primary = Server(base / "primary", free_port(), base / "primary.log")
    standby = Server(base / "standby", free_port(), base / "standby.log")
    pair = StreamingPair(primary, standby)
    try:
        _pg_ctl(
            "init",
            "-D",
            str(primary.data_dir),
            "-o",
            f"--auth=trust --username={USER} --encoding=UTF8 --locale=C.UTF-8",
        )
        primary.start()
        with primary.connect("postgres") as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
        # The wrapper handed `base` to the server user when it started the primary.
        _run_as_server_user(
            [
                str(_bindir() / "pg_basebackup"),
                *("-h", "127.0.0.1", "-p", str(primary.port), "-U", USER),
                *("-D", str(standby.data_dir), "-R", "-X", "stream", "-c", "fast"),
            ]
        )
        standby.start()
        yield pair
    finally:
        pair.close()
        shutil.rmtree(base, ignore_errors=True)
