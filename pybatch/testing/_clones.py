"""Fresh test databases cloned from the template ahead of the tests that will use them.

A small template clones fastest by file copy (`STRATEGY = FILE_COPY` from 15; WAL_LOG is up
to 3x slower). CREATE/DROP DATABASE sleep 100 ms when they find a session, even one whose
backend is still exiting, so the pool first waits for sessions to end; drops use FORCE.
Worker threads keep `depth` clones ready (two clones of one template may run at once);
with `depth` 0 the fixture clones and drops itself.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import psycopg

from pybatch._statements import Statement, load_statements

#: The name of every database the pool creates starts with it.
CLONE_PREFIX = "pybatch_test_"
#: The first server version (`server_version_num`) with CREATE DATABASE ... STRATEGY.
_STRATEGY_SINCE = 150000
#: Threads that clone and drop when prefetching (never more than the depth).
_MAX_WORKERS = 2
#: Seconds to wait for a database's sessions to end on their own (then FORCE).
_TEMPLATE_GRACE = 5.0
_TEST_GRACE = 0.2
_POLL = 0.002
_STOP = "stop"
_CLONE = "clone"
_DROP = "drop"


class _Server(Protocol):
    @property
    def maintenance_dsn(self) -> str: ...


def clone_statement(server_version: int) -> Statement:
    """The fastest way to copy a small template on a server of this `server_version_num`."""
    statements = load_statements("testing")
    if server_version >= _STRATEGY_SINCE:
        return statements.clone_template_by_file_copy
    return statements.clone_template


class Admin:
    """One thread's autocommit connection to the maintenance database, reopened on failure."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, opened if needed; closed when the block fails."""
        if self._conn is None:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
        try:
            yield self._conn
        except BaseException:
            self.close()
            raise

    def wait_until_unused(self, name: str, grace: float) -> None:
        """Wait up to `grace` seconds for the sessions of database `name` to end."""
        count = load_statements("testing").count_database_sessions
        deadline = time.monotonic() + grace
        with self._connection() as conn:
            while count.scalar(conn, datname=name) and time.monotonic() < deadline:
                time.sleep(_POLL)

    def clone(self, template: str, prefix: str = CLONE_PREFIX) -> str:
        name = f"{prefix}{uuid.uuid4().hex[:16]}"
        with self._connection() as conn:
            clone_statement(conn.info.server_version).run_with_identifiers(
                conn, database=name, template=template
            )
        return name

    def drop(self, name: str) -> None:
        self.wait_until_unused(name, _TEST_GRACE)
        with self._connection() as conn:
            load_statements("testing").drop_test_database.run_with_identifiers(conn, database=name)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class ClonePool:
    """Hands out fresh clones of `template` and drops them when they are given back."""

    def __init__(
        self, server: _Server, template: str, *, depth: int, workers: int | None = None
    ) -> None:
        self._dsn = server.maintenance_dsn
        self._template = template
        self._own = Admin(self._dsn)  # the caller's thread: depth 0, start and close
        self._ready: queue.Queue[tuple[str | None, BaseException | None]] = queue.Queue()
        self._tasks: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._failed_drops: list[str] = []
        self._own.wait_until_unused(template, _TEMPLATE_GRACE)
        if depth <= 0:
            return
        count = min(depth, _MAX_WORKERS) if workers is None else max(1, workers)
        for index in range(count):
            thread = threading.Thread(
                target=self._work, name=f"pybatch-clones-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        for _ in range(depth):
            self._tasks.put((_CLONE, None))

    @property
    def workers(self) -> int:
        """How many threads clone and drop (0: the fixture does)."""
        return len(self._threads)

    def _work(self) -> None:
        admin = Admin(self._dsn)
        try:
            while True:
                kind, name = self._tasks.get()
                if kind == _STOP:
                    return
                if kind == _CLONE:
                    try:
                        self._ready.put((admin.clone(self._template), None))
                    except BaseException as error:  # handed to the test that takes it
                        self._ready.put((None, error))
                elif name is not None:
                    try:
                        admin.drop(name)
                    except Exception:  # retried once more when the session ends
                        self._failed_drops.append(name)
        finally:
            admin.close()

    def take(self, *, timeout: float = 600.0) -> str:
        """A fresh database name; the caller gives it back with `give_back`."""
        if not self._threads:
            return self._own.clone(self._template)
        self._tasks.put((_CLONE, None))  # keep `depth` clones ready or in flight
        name, error = self._ready.get(timeout=timeout)
        if error is not None:
            raise error
        if name is None:
            raise RuntimeError("the clone thread returned no database")
        return name

    def give_back(self, name: str) -> None:
        """Drop a used database (in the background when prefetching)."""
        if self._threads:
            self._tasks.put((_DROP, name))
        else:
            self._own.drop(name)

    def close(self) -> None:
        """Finish the queued work, then drop the clones no test took."""
        try:
            for _ in self._threads:
                self._tasks.put((_STOP, None))
            for thread in self._threads:
                thread.join()
            self._threads = []
            failed, self._failed_drops = self._failed_drops, []
            for name in failed:
                self._own.drop(name)
            while True:
                try:
                    unused, _error = self._ready.get_nowait()
                except queue.Empty:
                    return
                if unused is not None:
                    self._own.drop(unused)
        finally:
            self._own.close()
