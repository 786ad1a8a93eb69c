"""The one transaction primitive: lease a connection, COMMIT with a classified outcome, release.

Every transaction (unit of work, read, chunk, retry reservation) leases and ends its pooled
connection here, the only module touching the pool. `isolation_level` makes every BEGIN READ
COMMITTED. The timeouts and UTC (`Pooler`) travel in the startup `options` and are read back
once per connection; behind PgBouncer they are set once per connection (session mode) or by
the first statement of every transaction (transaction mode, where nothing is prepared).
COMMIT outcomes (docs/tables.md 5) are raised from the caller's `CommitErrors`; a connection
that can no longer be trusted is discarded.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import attrs
import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus
from psycopg.types.array import ListBinaryDumper

from pybatch import _sqlstate
from pybatch._codecs._jsonb import install_strict_json_loads
from pybatch._config import ConnectionConfig, Pooler
from pybatch._connect import CaFile, check_idle_connection, probe_connection, watch_for_termination
from pybatch._statements import Connection, Row, Statement, load_statements
from pybatch.errors import PyBatchError, SettingsNotApplied, Unavailable

#: Run once on every new pooled connection, leaving it idle: the refusal to raise when the
#: connection is leased, or None (the clock-skew check of JobRepository.connect).
ConnectionCheck = Callable[[Connection], PyBatchError | None]


@attrs.frozen
class CommitErrors:
    """What a failed COMMIT raises: `aborted`, `refused` (nothing committed) or `unknown`."""

    aborted: Callable[[], PyBatchError]
    refused: Callable[[psycopg.Error], PyBatchError]
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
        return self._conn is not None

    @property
    def connection(self) -> Connection | None:
        """The leased connection, or None once it went back to the pool."""
        return self._conn

    @property
    def read_only(self) -> bool:
        """Whether the lease's transaction is READ ONLY."""
        return self._read_only

    def begin(self) -> None:
        """Start the next transaction of a kept connection with pybatch's settings.

        Only behind a transaction-mode pooler, and only when no transaction is open: there
        each transaction may run on another server connection, so it sets them for itself.
        Raises Unavailable (the connection is then discarded).
        """
        conn = self._conn
        if (
            self._source.per_transaction
            and conn is not None
            and conn.pgconn.transaction_status == TransactionStatus.IDLE
        ):
            try:
                self._source.apply_settings(conn, transaction_only=True)
            except psycopg.Error as error:
                self.discard()
                raise Unavailable(sqlstate=_sqlstate.sqlstate_of(error)) from None

    def commit(self, errors: CommitErrors) -> None:
        """COMMIT and give the connection back; raise the family's error unless durable."""
        conn = self._conn
        if conn is None:
            raise errors.aborted()
        if conn.pgconn.transaction_status == TransactionStatus.INERROR:
            self.rollback()
            raise errors.aborted()
        try:
            conn.commit()
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                self.discard()
                raise errors.unknown() from None
            self.rollback()
            raise errors.refused(error) from None
        self._release(discard=False)

    def commit_alone(
        self,
        statements: Sequence[tuple[Statement, Mapping[str, object]]],
        errors: CommitErrors,
        *,
        wait_for_flush: bool = True,
    ) -> Sequence[Row | None]:
        """Run `statements` as the whole transaction, in one round trip; their first rows.

        In autocommit, READ COMMITTED by the startup options: several are pipelined with one Sync,
        one implicit transaction. Behind a pooler (no default), BEGIN READ COMMITTED, the settings
        (transaction mode), the statements and COMMIT. An error skips the rest: a refused
        statement or COMMIT commits nothing (`errors.refused`); a connection lost once it was
        sent may have committed (`errors.unknown`). The connection goes back to the pool.
        Without `wait_for_flush`, short_transaction_settings goes first: COMMIT returns before
        its WAL is flushed (docs/contract.md, Durability of commits, lists which commits may),
        and the statements run their generic plans from their first execution.
        """
        conn = self._conn
        if conn is None or conn.pgconn.transaction_status != TransactionStatus.IDLE:
            raise errors.aborted()
        q = load_statements()
        try:
            conn.autocommit = True
            pooled = self._source.pooled
            pipelined = pooled or len(statements) > 1 or not wait_for_flush
            with conn.pipeline() if pipelined else nullcontext():
                if pooled:
                    q.begin_read_committed.send(conn)
                    if self._source.per_transaction:
                        self._source.apply_settings(conn, transaction_only=True, send=True)
                if not wait_for_flush:
                    q.short_transaction_settings.send(conn)
                cursors = [statement.send(conn, **params) for statement, params in statements]
                if pooled:
                    q.commit_transaction.send(conn)
            rows = [cursor.fetchone() for cursor in cursors]
            conn.autocommit = False
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                self.discard()
                raise errors.unknown() from None
            if self.rollback(keep=True):
                conn.autocommit = False
                self._release(discard=False)
            raise errors.refused(error) from None
        except BaseException:
            self.discard()  # interrupted mid-pipeline: nothing tells what the server did
            raise
        self._release(discard=False)
        return rows

    def rollback(self, *, keep: bool = False) -> bool:
        """ROLLBACK and give the connection back (kept leased with `keep`); False if discarded.

        A READ ONLY transaction that has not failed ends with COMMIT instead: it changed
        nothing, and psycopg answers a ROLLBACK by forgetting every prepared statement of the
        connection (and sending DEALLOCATE ALL), so each would be parsed and planned again.
        """
        conn = self._conn
        if conn is None:
            return True
        if conn.broken or conn.closed:
            self.discard()
            return False
        try:
            if self._read_only and conn.pgconn.transaction_status == TransactionStatus.INTRANS:
                conn.commit()
            else:
                conn.rollback()
        except psycopg.Error:
            self.discard()
            return False
        if not keep:
            self._release(discard=False)
        return True

    def discard(self) -> None:
        self._release(discard=True)

    def _release(self, *, discard: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not discard and self._read_only:
            try:
                conn.read_only = False  # idle after the transaction: no round trip
            except psycopg.Error:
                discard = True
        self._source._release(conn, discard=discard)


class TransactionSource:
    """The bounded pool of a repository, handing out leases; owns the CA file too."""

    def __init__(
        self, config: ConnectionConfig, *, check: ConnectionCheck | None = None, probe: bool = True
    ) -> None:
        self._config = config
        # New connections that `check` refused; a lease of one raises the refusal.
        self._refused = weakref.WeakKeyDictionary[Connection, PyBatchError]()
        self._check = check
        #: Behind a transaction-mode pooler: every transaction sets the settings itself.
        self.per_transaction = config.pooler is Pooler.TRANSACTION
        #: Behind a pooler, which carries no startup options.
        self.pooled = config.pooler is not Pooler.NONE
        self._settings = config.session_settings()
        self._ca_file = CaFile(config)
        try:
            # A wrong password or database fails here at once, not after the acquire timeout.
            if probe:
                probe_connection(config, self._ca_file)
            self._pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
                kwargs=config.connection_kwargs(ca_file=self._ca_file.path),
                min_size=0,
                max_size=config.pool_size,
                timeout=config.acquire_timeout.total_seconds(),
                max_idle=config.connection_idle_timeout.total_seconds(),
                max_lifetime=config.connection_max_lifetime.total_seconds(),
                reconnect_timeout=config.connect_timeout.total_seconds(),
                configure=self._configure,
                open=False,
                name="pybatch",
            )
            self._pool.open(wait=False)
        except BaseException:
            self._ca_file.close()
            raise

    def _configure(self, conn: Connection) -> None:
        # Client-side only: BEGIN then says READ COMMITTED whatever the database default.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        # Array parameters (`CAST(:ids AS BIGINT[])`) go in binary: psycopg's default text
        # dumper quotes-checks every element with a regular expression, about five times
        # the client time per array (a purge batch binds arrays of 1000 ids).
        conn.adapters.register_dumper(list, ListBinaryDumper)
        install_strict_json_loads(conn)
        watch_for_termination(conn)
        pooler = self._config.pooler
        if pooler is Pooler.TRANSACTION:
            # A named prepared statement lives on one server connection; the pooler hands
            # the next transaction another (`prepared statement "_pg3_0" already exists`).
            conn.prepare_threshold = None
        elif pooler is Pooler.SESSION:
            self.apply_settings(conn, transaction_only=False)
            conn.commit()
        elif (dropped := self._dropped_setting(conn)) is not None:
            self._refused[conn] = dropped
            return
        if self._check is not None and (refusal := self._check(conn)) is not None:
            self._refused[conn] = refusal

    def apply_settings(
        self, conn: Connection, *, transaction_only: bool, send: bool = False
    ) -> None:
        """Set the timeouts and UTC by statement behind a pooler (`Pooler`); `send` queues it."""
        settings = self._settings
        statement = load_statements().apply_pooled_settings
        (statement.send if send else statement.one)(
            conn,
            statement_timeout=settings["statement_timeout"],
            lock_timeout=settings["lock_timeout"],
            idle_in_transaction_session_timeout=settings["idle_in_transaction_session_timeout"],
            time_zone=settings["TimeZone"],
            transaction_only=transaction_only,
        )

    def _dropped_setting(self, conn: Connection) -> SettingsNotApplied | None:
        """The refusal when the server does not run a setting the startup options carried."""
        rows = load_statements().read_session_settings.many(conn)
        conn.rollback()
        running = {row["name"]: row["setting"] for row in rows}
        for name, expected in self._settings.items():
            found = running.get(name)
            if found != expected:
                return SettingsNotApplied(setting=name, expected=expected, found=str(found))
        return None

    def lease(self, *, read_only: bool = False, begin: bool = True) -> Lease:
        """Lease a pooled connection for one transaction (READ ONLY when asked).

        Without `begin`, the holder calls `Lease.begin` before its first statement.
        A connection the server ended while idle is swapped at checkout, so a run pausing
        between chunks does not fail on it; one refused when opened (clock skew) is measured
        again. Raises Unavailable (no connection in time) or ClockSkewExceeded.
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
            refusal = probe_connection(self._config, self._ca_file)
            raise refusal if isinstance(refusal, Unavailable) else Unavailable()
        if conn in self._refused:
            self._check_again(conn)
        if read_only:
            conn.read_only = True
        lease = Lease(self, conn, read_only=read_only)
        if begin:
            lease.begin()
        return lease

    def _check_again(self, conn: Connection) -> None:
        """Measure a refused connection again (the clock may be fixed); else drop it, raise.

        A connection whose server dropped pybatch's settings is never taken: they stay dropped.
        """
        refusal: PyBatchError | None = self._refused[conn]
        if not isinstance(refusal, SettingsNotApplied):
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

        Refused ones are handed back and the next tried at once: the pool's own checkout
        check backs off 1 s, 2 s, 4 s..., which could hold a lease renewal past a short lease.
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
        """A READ ONLY transaction ended by `Lease.rollback`; errors mapped (`schema_probe`)."""
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
