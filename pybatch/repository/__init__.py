"""The job repository: a bounded connection pool handing out units of work (behaviour.md 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from pybatch import _sqlstate
from pybatch._connect import (
    CaFile,
    check_idle_connection,
    connect_or_raise,
    connection_kwargs,
    probe_connection,
)
from pybatch._statements import Statements, load_statements
from pybatch.clock import Clock, SystemClock
from pybatch.codecs._jsonb import install_strict_json_loads
from pybatch.config import ConnectionConfig
from pybatch.errors import (
    MigrationRequired,
    NewerSchema,
    RetryableConflict,
    SchemaUninitialized,
    Unavailable,
)
from pybatch.migrator import supported_schema_version
from pybatch.unit_of_work import UnitOfWork
from pybatch.values.capabilities import RepositoryCapability, RepositoryDescriptor

__all__ = ["JobRepository"]

T = TypeVar("T")


class JobRepository:
    """PostgreSQL job repository; create it with `JobRepository.connect(config)`."""

    def __init__(
        self,
        config: ConnectionConfig,
        pool: psycopg_pool.ConnectionPool[Any],
        ca_file: CaFile,
        clock: Clock,
        schema_version: int,
    ) -> None:
        self.config = config
        self.clock = clock
        self.statements: Statements = load_statements()
        self.schema_version = schema_version
        self._pool = pool
        self._ca_file = ca_file

    def __repr__(self) -> str:
        return f"JobRepository(schema_version={self.schema_version}, config={self.config!r})"

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def connect(cls, config: ConnectionConfig, *, clock: Clock | None = None) -> JobRepository:
        """Build the pool and verify the installed schema version; never migrates.

        Raises:
            SchemaUninitialized: no pybatch schema or version row.
            MigrationRequired: the schema is older than this package.
            NewerSchema: the schema is newer than this package.
            Unavailable: the server cannot be reached (details redacted).
        """
        statements = load_statements()
        ca_file = CaFile(config)
        try:
            probe_connection(config, ca_file)
        except BaseException:
            ca_file.close()
            raise

        def configure(conn: psycopg.Connection[Any]) -> None:
            install_strict_json_loads(conn)
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            statements.set_session_time_zone(conn)
            conn.commit()

        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            kwargs=connection_kwargs(config, ca_file, session_timeouts=True),
            min_size=0,
            max_size=config.pool_size,
            timeout=config.acquire_timeout.total_seconds(),
            max_idle=config.connection_idle_timeout.total_seconds(),
            max_lifetime=config.connection_max_lifetime.total_seconds(),
            reconnect_timeout=config.connect_timeout.total_seconds(),
            configure=configure,
            check=check_idle_connection,
            open=False,
            name="pybatch",
        )
        try:
            pool.open(wait=False)
            repository = cls(config, pool, ca_file, clock or SystemClock(), 0)
            repository.schema_version = repository._verify_schema_version()
        except BaseException:
            pool.close(timeout=0)
            ca_file.close()
            raise
        return repository

    def _verify_schema_version(self) -> int:
        supported = supported_schema_version()
        conn = self._acquire()
        installed: Any = None
        try:
            with conn.transaction():
                installed = self.statements.read_schema_version(conn)
        except psycopg.Error as error:
            self._release(conn, discard=_sqlstate.is_connection_loss(error, conn))
            raise _sqlstate.translate(error, schema_probe=True) from None
        self._release(conn, discard=False)
        if installed is None:
            raise SchemaUninitialized()
        if installed < supported:
            raise MigrationRequired(current=installed, supported=supported)
        if installed > supported:
            raise NewerSchema(current=installed, supported=supported)
        return int(installed)

    def close(self) -> None:
        """Close the pool within the configured close timeout."""
        try:
            self._pool.close(timeout=self.config.pool_close_timeout.total_seconds())
        finally:
            self._ca_file.close()

    def __enter__(self) -> JobRepository:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ units of work

    def _acquire(self) -> psycopg.Connection[Any]:
        try:
            conn: psycopg.Connection[Any] = self._pool.getconn(
                timeout=self.config.acquire_timeout.total_seconds()
            )
            return conn
        except psycopg_pool.PoolTimeout:
            pass
        except psycopg.Error as error:
            raise Unavailable(sqlstate=_sqlstate.sqlstate_of(error)) from None
        # Why could the pool not connect? A permanent refusal (the password was changed, the
        # database dropped) is reported as itself; anything else stays Unavailable.
        probe_connection(self.config, self._ca_file)
        raise Unavailable()

    def _release(self, conn: psycopg.Connection[Any], *, discard: bool) -> None:
        """Return a connection to the pool, or close it first so the pool drops it."""
        if discard and not conn.closed:
            conn.close()
        self._pool.putconn(conn)

    def dedicated_connection(self) -> psycopg.Connection[Any]:
        """An autocommit connection outside the pool (liveness locks live as long as a run).

        Raises:
            Unavailable: the server cannot be reached (details redacted).
        """
        return connect_or_raise(connection_kwargs(self.config, self._ca_file), autocommit=True)

    def begin(self) -> UnitOfWork:
        """Open a unit of work: READ COMMITTED with the configured transaction timeouts."""
        conn = self._acquire()
        try:
            self.statements.set_transaction_timeouts(
                conn,
                statement_timeout_ms=str(self.config.statement_timeout_ms),
                lock_timeout_ms=str(self.config.lock_timeout_ms),
                idle_transaction_timeout_ms=str(self.config.idle_transaction_timeout_ms),
            )
        except psycopg.Error as error:
            self._release(conn, discard=True)
            raise Unavailable(sqlstate=_sqlstate.sqlstate_of(error)) from None
        return UnitOfWork(self, conn)

    @contextmanager
    def read_transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A READ ONLY, READ COMMITTED transaction with the configured timeouts, always rolled back.

        For reads that must not join a unit of work (committed chunk state, reports).
        """
        conn = self._acquire()
        discard = False
        try:
            conn.read_only = True
            try:
                self.statements.set_transaction_timeouts(
                    conn,
                    statement_timeout_ms=str(self.config.statement_timeout_ms),
                    lock_timeout_ms=str(self.config.lock_timeout_ms),
                    idle_transaction_timeout_ms=str(self.config.idle_transaction_timeout_ms),
                )
                yield conn
            except psycopg.Error as error:
                discard = _sqlstate.is_connection_loss(error, conn)
                raise _sqlstate.translate(error) from None
        finally:
            if not discard and not conn.broken and not conn.closed:
                try:
                    conn.rollback()
                    conn.read_only = False
                except psycopg.Error:
                    discard = True
            self._release(conn, discard=discard or conn.broken)

    def run_in_unit_of_work(self, work: Callable[[UnitOfWork], T]) -> T:
        """Run `work` in a unit of work and commit; re-run it on RetryableConflict only.

        At most `config.unit_of_work_attempts` attempts; CommitOutcomeUnknown and every
        other error propagate at once, because re-running could apply the work twice.
        """
        last: RetryableConflict | None = None
        for _attempt in range(self.config.unit_of_work_attempts):
            with self.begin() as uow:
                try:
                    result = work(uow)
                    uow.commit()
                except RetryableConflict as conflict:
                    last = conflict
                    continue
                return result
        assert last is not None
        raise last

    # ------------------------------------------------------------------ negotiation

    def descriptor(self) -> RepositoryDescriptor:
        """All six capabilities, with the verified schema version (behaviour.md 2.21)."""
        return RepositoryDescriptor(
            RepositoryDescriptor.CURRENT_VERSION,
            self.schema_version,
            frozenset(RepositoryCapability),
        )

    def connection_capacity(self) -> int:
        """How many connections the pool may open (throughput, not a capability)."""
        return self.config.pool_size
