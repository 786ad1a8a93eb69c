"""The job repository: a bounded connection pool handing out units of work.

See docs/contract.md, Repository operations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TypeVar

from pybatch import errors as e
from pybatch._clock import Clock, SystemClock, is_simulated, measured_skew
from pybatch._codecs._primitives import DecodeError
from pybatch._config import ConnectionConfig
from pybatch._migrator import supported_schema_version
from pybatch._repository import recovery
from pybatch._statements import Connection, Statements, load_statements
from pybatch._transaction import ConnectionCheck, TransactionSource
from pybatch._unit_of_work import UnitOfWork
from pybatch.values.ownership import OwnerToken
from pybatch.values.recovery import RecoverySnapshot

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _clock_skew_check(config: ConnectionConfig, clock: Clock) -> ConnectionCheck:
    """Measure `clock` against the server's on each new connection; the refusal, or None.

    Stamps come from `clock` but cutoffs and lease expiry use the server's, so the distance is
    bounded; two client readings bracket the server's, so a slow round trip is not skew.
    """
    statements = load_statements()
    bound_ms = int(config.max_clock_skew / timedelta(milliseconds=1))

    def check(conn: Connection) -> e.ClockSkewExceeded | None:
        before = clock.now()
        server = statements.read_server_clock.scalar(conn)
        after = clock.now()
        conn.rollback()
        if not isinstance(server, datetime):
            raise e.Unavailable()
        skew = measured_skew(before, server, after)
        if abs(skew) <= config.max_clock_skew:
            return None
        milliseconds = int(abs(skew) / timedelta(milliseconds=1))
        direction = "ahead of" if skew > timedelta(0) else "behind"
        refusal = e.ClockSkewExceeded(skew_ms=milliseconds, direction=direction, bound_ms=bound_ms)
        logger.error("pybatch: refusing the connection: %s", refusal)
        return refusal

    return check


class JobRepository:
    """PostgreSQL job repository; create it with `JobRepository.connect(config)`."""

    def __init__(
        self,
        config: ConnectionConfig,
        transactions: TransactionSource,
        clock: Clock,
        schema_version: int,
    ) -> None:
        self.config = config
        self.clock = clock
        self.statements: Statements = load_statements()
        self.schema_version = schema_version
        self.transactions = transactions

    def __repr__(self) -> str:
        return f"JobRepository(schema_version={self.schema_version}, config={self.config!r})"

    @classmethod
    def connect(cls, config: ConnectionConfig, *, clock: Clock | None = None) -> JobRepository:
        """Build the pool and verify the schema version (never migrates).

        Raises SchemaUninitialized, MigrationRequired (older), NewerSchema, Unavailable, and
        ClockSkewExceeded (also on any later new connection; a `simulated` clock is not measured).
        """
        clock = clock or SystemClock()
        check = None if is_simulated(clock) else _clock_skew_check(config, clock)
        transactions = TransactionSource(config, check=check)
        try:
            repository = cls(config, transactions, clock, 0)
            repository.schema_version = repository._verify_schema_version()
        except BaseException:
            # Wait for the pool's worker threads as `close` does: a zero timeout left them
            # running and psycopg_pool logged "couldn't stop thread" under every refusal.
            transactions.close(config.pool_close_timeout.total_seconds())
            raise
        return repository

    def _verify_schema_version(self) -> int:
        supported = supported_schema_version()
        with self.transactions.read_only(schema_probe=True) as conn:
            installed = self.statements.read_schema_version.scalar(conn)
        if installed is None:
            raise e.SchemaUninitialized()
        if type(installed) is not int:
            raise e.Unavailable()
        if installed < supported:
            raise e.MigrationRequired(current=installed, supported=supported)
        if installed > supported:
            raise e.NewerSchema(current=installed, supported=supported)
        return installed

    def close(self) -> None:
        """Close the pool within the configured close timeout."""
        self.transactions.close(self.config.pool_close_timeout.total_seconds())

    def __enter__(self) -> JobRepository:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def begin(self, *, read_only: bool = False) -> UnitOfWork:
        """Open a READ COMMITTED unit of work (Unavailable when no connection can be leased).

        `read_only`: a READ ONLY one for reads, which ends with COMMIT when it is left without
        one (it changed nothing; a ROLLBACK would drop the connection's prepared statements).
        """
        lease = self.transactions.lease(begin=False, read_only=read_only)
        return UnitOfWork(lease, self.statements, self.clock)

    def read_transaction(self) -> AbstractContextManager[Connection]:
        """A READ ONLY transaction for reads outside any unit of work, ended with COMMIT."""
        return self.transactions.read_only()

    def run_in_unit_of_work(self, work: Callable[[UnitOfWork], T]) -> T:
        """Run `work` and commit; re-run on RetryableConflict only (others could apply it twice)."""
        attempt = 1
        while True:
            with self.begin() as uow:
                try:
                    result = work(uow)
                    uow.commit()
                    return result
                except e.RetryableConflict:
                    if attempt >= self.config.unit_of_work_attempts:
                        raise
            attempt += 1

    def recovery_snapshot(
        self, execution_id: int, current_owner: OwnerToken | None = None
    ) -> RecoverySnapshot:
        """Observe one execution for recovery, read-only (JobExecutionNotFound, Unavailable)."""
        with self.read_transaction() as conn:
            try:
                return recovery.recovery_snapshot(
                    self.statements, conn, execution_id, current_owner
                )
            except DecodeError:
                raise e.Unavailable() from None
