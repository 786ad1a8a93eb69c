"""Fresh test databases cloned from the template ahead of the tests that will use them.

A small template clones fastest by file copy (`STRATEGY = FILE_COPY` from 15; WAL_LOG is up
to 3x slower). CREATE/DROP DATABASE sleep 100 ms when they find a session, even one whose
backend is still exiting, so the pool first waits for sessions to end; drops use FORCE.
Worker threads keep `depth` clones ready (two clones of one template may run at once);
with `depth` 0 the fixture clones and drops itself.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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


class _Server(Protocol):
    @property
    def maintenance_dsn(self) -> str: ...


def clone_statement(server_version: int) -> Statement:
    """The fastest way to copy a small template on a server of this `server_version_num`."""
    q = load_statements("testing")
    return q.clone_template_by_file_copy if server_version >= _STRATEGY_SINCE else q.clone_template


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
        self._own.wait_until_unused(template, _TEMPLATE_GRACE)
        self._local = threading.local()
        self._admins: list[Admin] = []  # one per worker thread
        self._failed_drops: list[str] = []
        self._clones: collections.deque[Future[str]] = collections.deque()
        self._executor: ThreadPoolExecutor | None = None
        if depth > 0:
            count = min(depth, _MAX_WORKERS) if workers is None else max(1, workers)
            self._executor = ThreadPoolExecutor(count, thread_name_prefix="pybatch-clones")
            self._clones.extend(self._executor.submit(self._clone) for _ in range(depth))

    def _admin(self) -> Admin:
        """The worker thread's own connection."""
        admin: Admin | None = getattr(self._local, "admin", None)
        if admin is None:
            admin = self._local.admin = Admin(self._dsn)
            self._admins.append(admin)
        return admin

    def _clone(self) -> str:
        return self._admin().clone(self._template)  # a failure goes to the test that takes it

    def _drop(self, name: str) -> None:
        try:
            self._admin().drop(name)
        except Exception:  # retried once more when the pool closes
            self._failed_drops.append(name)

    def take(self, *, timeout: float = 600.0) -> str:
        """A fresh database name; the caller gives it back with `give_back`."""
        if self._executor is None:
            return self._own.clone(self._template)
        self._clones.append(self._executor.submit(self._clone))  # keep `depth` in flight
        return self._clones.popleft().result(timeout)

    def give_back(self, name: str) -> None:
        """Drop a used database (in the background when prefetching)."""
        if self._executor is None:
            self._own.drop(name)
        else:
            self._executor.submit(self._drop, name)

    def close(self) -> None:
        """Finish the queued work, then drop the clones no test took."""
        try:
            if self._executor is not None:
                self._executor.shutdown()  # the queued clones and drops run first
                self._executor = None  # a closed pool clones and drops in the caller's thread
            for admin in self._admins:
                admin.close()
            unused = [clone.result() for clone in self._clones if clone.exception() is None]
            self._clones.clear()
            failed, self._failed_drops = self._failed_drops, []
            for name in (*failed, *unused):
                self._own.drop(name)
        finally:
            self._own.close()
