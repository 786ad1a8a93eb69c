"""The one transaction primitive: lease a connection, COMMIT with a classified outcome, release.

Every kind of transaction pybatch runs (a unit of work, a read-only read, a chunk, a retry
reservation) leases its pooled connection here and ends it here; this is the only module
that touches the pool. Settings are applied by one mechanism, once per connection: the
libpq startup `options` carry the configured statement, lock and idle-in-transaction
timeouts and `TimeZone=UTC` as session defaults (they outrank `ALTER DATABASE/ROLE ... SET`),
and psycopg's `isolation_level` makes every BEGIN `BEGIN ISOLATION LEVEL READ COMMITTED`.
So no transaction spends a round trip on settings (docs/architecture.md, "Transactions").

COMMIT outcomes follow docs/tables.md 5, parameterised by the caller's error family
(`CommitErrors`): a transaction the server already failed is `aborted`, a refused COMMIT is
`refused`, a lost acknowledgement is `unknown`, and the connection is discarded whenever it
can no longer be trusted.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus
from psycopg.types.array import ListBinaryDumper

from pybatch import _sqlstate
from pybatch._connect import (
    CaFile,
    check_idle_connection,
    connection_kwargs,
    probe_connection,
    watch_for_termination,
)
from pybatch._statements import Connection
from pybatch.codecs._jsonb import install_strict_json_loads
from pybatch.config import ConnectionConfig
from pybatch.errors import PyBatchError, Unavailable

__all__ = ["CommitErrors", "ConnectionCheck", "Lease", "TransactionSource"]

#: Run once on every new pooled connection, leaving it idle: the refusal to raise when the
#: connection is leased, or None (the clock-skew check of JobRepository.connect).
ConnectionCheck = Callable[[Connection], PyBatchError | None]


@attrs.frozen
class CommitErrors:
    """What each failed COMMIT outcome raises, for one error family."""

    #: The transaction had already failed; nothing was committed.
    aborted: Callable[[], PyBatchError]
    #: The server refused the COMMIT; nothing was committed.
    refused: Callable[[psycopg.Error], PyBatchError]
    #: The acknowledgement was lost; the transaction may or may not be durable.
    unknown: Callable[[], PyBatchError]


class Lease:
    """One pooled connection leased for one transaction; it goes back exactly once."""

    __slots__ = ("_conn", "_read_only", "_source")

    def __init__(self, source: TransactionSource, conn: Connection, *, read_only: bool) -> None:
        self._source = source
        self._conn: Connection | None = conn
        self._read_only = read_only

    @property
    def is_open(self) -> bool:
        """Whether the connection is still leased (not committed, rolled back or discarded)."""
        return self._conn is not None

    @property
    def connection(self) -> Connection | None:
        """The leased connection, or None once it went back to the pool."""
        return self._conn

    def commit(self, errors: CommitErrors, *, keep: bool = False) -> None:
        """COMMIT and give the connection back; raise the family's error unless it is durable.

        With `keep`, a connection that is still sound stays leased for the next transaction
        (a step holds one for all its chunks); one that failed is discarded all the same.
        """
        conn = self._conn
        if conn is None:
            raise errors.aborted()
        if conn.pgconn.transaction_status == TransactionStatus.INERROR:
            self.rollback(keep=keep)
            raise errors.aborted()
        try:
            conn.commit()
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                self.discard()
                raise errors.unknown() from None
            self.rollback(keep=keep)
            raise errors.refused(error) from None
        if not keep:
            self._release(discard=False)

    def rollback(self, *, keep: bool = False) -> bool:
        """ROLLBACK and give the connection back; False when it had to be discarded instead.

        With `keep`, the rolled-back connection stays leased (see `commit`).
        """
        conn = self._conn
        if conn is None:
            return True
        if conn.broken or conn.closed:
            self.discard()
            return False
        try:
            conn.rollback()
        except psycopg.Error:
            self.discard()
            return False
        if not keep:
            self._release(discard=False)
        return True

    def discard(self) -> None:
        """Close the connection (it can no longer be trusted) and give it back to the pool."""
        self._release(discard=True)

    def _release(self, *, discard: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not discard and self._read_only:
            try:
                conn.read_only = False  # idle after the rollback: no round trip
            except psycopg.Error:
                discard = True
        self._source._release(conn, discard=discard)


class TransactionSource:
    """The bounded pool of a repository, handing out leases; owns the CA file too."""

    def __init__(self, config: ConnectionConfig, *, check: ConnectionCheck | None = None) -> None:
        self._config = config
        # New connections that `check` refused; a lease of one raises the refusal.
        self._refused: weakref.WeakKeyDictionary[Connection, PyBatchError] = (
            weakref.WeakKeyDictionary()
        )
        self._check = check
        self._ca_file = CaFile(config)
        try:
            # A wrong password or database fails here at once, not after the acquire timeout.
            probe_connection(config, self._ca_file)
        except BaseException:
            self._ca_file.close()
            raise

        def configure(conn: Connection) -> None:
            # Client-side only: BEGIN then says READ COMMITTED whatever the database default.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            # Array parameters (`CAST(:ids AS BIGINT[])`) go in binary: psycopg's default text
            # dumper quotes-checks every element with a regular expression, about five times
            # the client time per array (a purge batch binds arrays of 1000 ids).
            conn.adapters.register_dumper(list, ListBinaryDumper)
            install_strict_json_loads(conn)
            watch_for_termination(conn)
            if check is not None:
                refusal = check(conn)
                if refusal is not None:
                    self._refused[conn] = refusal

        self._pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            kwargs=connection_kwargs(config, self._ca_file),
            min_size=0,
            max_size=config.pool_size,
            timeout=config.acquire_timeout.total_seconds(),
            max_idle=config.connection_idle_timeout.total_seconds(),
            max_lifetime=config.connection_max_lifetime.total_seconds(),
            reconnect_timeout=config.connect_timeout.total_seconds(),
            configure=configure,
            open=False,
            name="pybatch",
        )
        try:
            self._pool.open(wait=False)
        except BaseException:
            self._ca_file.close()
            raise

    def lease(self, *, read_only: bool = False) -> Lease:
        """Lease a pooled connection for one transaction (READ ONLY when asked).

        The pool checks each connection at checkout without a round trip
        (`check_idle_connection`): one whose backend the server ended while it sat idle
        (idle_session_timeout, pg_terminate_backend, a restart) is discarded and another
        taken, so a run that pauses between chunks does not fail on it.

        A connection the repository's check refused when it was opened (its clock skew) is
        measured again: still refused, it is dropped and the refusal raised.

        Raises:
            Unavailable: no connection within the acquire timeout, or the server is down.
            ClockSkewExceeded: the new connection found the clock beyond the skew bound.
        """
        conn: Connection | None
        try:
            conn = self._checked_connection()
        except psycopg_pool.PoolTimeout:
            conn = None
        except psycopg.Error as error:
            raise Unavailable(sqlstate=_sqlstate.sqlstate_of(error)) from None
        if conn is None:
            # Why could the pool not connect? A permanent refusal (the password was changed,
            # the database dropped) is reported as itself; anything else stays Unavailable.
            probe_connection(self._config, self._ca_file)
            raise Unavailable()
        if conn in self._refused:
            self._check_again(conn)
        if read_only:
            conn.read_only = True
        return Lease(self, conn, read_only=read_only)

    def _check_again(self, conn: Connection) -> None:
        """Measure a connection refused when it opened again: the clock may have been fixed.

        Raises:
            ClockSkewExceeded: still beyond the bound (the connection is dropped).
            Unavailable: the measurement failed (the connection is dropped).
        """
        refusal: PyBatchError | None
        try:
            refusal = None if self._check is None else self._check(conn)
        except psycopg.Error as error:
            refusal = Unavailable(sqlstate=_sqlstate.sqlstate_of(error))
        if refusal is None:
            del self._refused[conn]
            return
        conn.close()
        self._pool.putconn(conn)  # a closed connection is dropped; the next one is measured
        raise refusal

    def _checked_connection(self) -> Connection:
        """A pooled connection that passed `check_idle_connection`, within the acquire timeout.

        A refused connection is handed back (the pool drops it and opens a replacement) and
        the next one is tried at once. The pool's own checkout check would wait 1 s, 2 s,
        4 s... between refusals, so a pool whose idle connections were all ended
        (idle_session_timeout) could hold a lease renewal past a short lease.

        Raises:
            PoolTimeout: no healthy connection within the acquire timeout.
        """
        deadline = time.monotonic() + self._config.acquire_timeout.total_seconds()
        while True:
            conn: Connection = self._pool.getconn(timeout=max(deadline - time.monotonic(), 0.0))
            try:
                check_idle_connection(conn)
            except psycopg.OperationalError:  # the check closed it
                self._pool.putconn(conn)  # a closed connection is dropped and replaced
                if time.monotonic() >= deadline:
                    raise psycopg_pool.PoolTimeout() from None
                continue
            return conn

    @contextmanager
    def read_only(self, *, schema_probe: bool = False) -> Iterator[Connection]:
        """A READ ONLY, READ COMMITTED transaction, always rolled back; driver errors mapped.

        With `schema_probe`, a missing schema is SchemaUninitialized (the version check).

        Raises:
            Unavailable: the server cannot be reached, or a statement failed (mapped).
        """
        lease = self.lease(read_only=True)
        conn = lease.connection
        if conn is None:  # a fresh lease always holds its connection
            raise Unavailable()
        try:
            yield conn
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                lease.discard()
            raise _sqlstate.translate(error, schema_probe=schema_probe) from None
        finally:
            lease.rollback()

    def _release(self, conn: Connection, *, discard: bool) -> None:
        if discard and not conn.closed:
            conn.close()
        self._pool.putconn(conn)

    def close(self, timeout_seconds: float) -> None:
        """Close the pool (waiting at most `timeout_seconds`) and remove the CA file."""
        try:
            self._pool.close(timeout=timeout_seconds)
        finally:
            self._ca_file.close()
