"""The job repository: a bounded connection pool handing out units of work.

See docs/contract.md, Repository operations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TypeVar

from pybatch._statements import Connection, Statements, load_statements
from pybatch._transaction import ConnectionCheck, TransactionSource
from pybatch.clock import Clock, SystemClock, is_simulated, measured_skew
from pybatch.codecs._primitives import DecodeError
from pybatch.config import ConnectionConfig
from pybatch.errors import (
    ClockSkewExceeded,
    MigrationRequired,
    NewerSchema,
    RetryableConflict,
    SchemaUninitialized,
    Unavailable,
)
from pybatch.migrator import supported_schema_version
from pybatch.repository import recovery
from pybatch.unit_of_work import UnitOfWork
from pybatch.values.capabilities import RepositoryCapability, RepositoryDescriptor
from pybatch.values.ownership import OwnerToken
from pybatch.values.recovery import RecoverySnapshot

__all__ = ["JobRepository"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _clock_skew_check(config: ConnectionConfig, clock: Clock) -> ConnectionCheck:
    """Measure `clock` against the server's on a new connection; the refusal, or None.

    The stamps a repository writes come from its clock; the decisions made on them (the
    retention, unresolved and stale cutoffs, lease expiry) use the server's. Bounding the
    distance keeps the two comparable at the cost of one statement per new connection, not
    per statement. Two client readings bracket the server read, so a slow round trip is
    never mistaken for skew. The connection is left idle, as the pool requires.
    """
    statements = load_statements()
    bound_ms = int(config.max_clock_skew / timedelta(milliseconds=1))

    def check(conn: Connection) -> ClockSkewExceeded | None:
        before = clock.now()
        server = statements.read_server_clock.scalar(conn)
        after = clock.now()
        conn.rollback()
        if not isinstance(server, datetime):
            raise Unavailable()
        skew = measured_skew(before, server, after)
        if abs(skew) <= config.max_clock_skew:
            return None
        milliseconds = int(abs(skew) / timedelta(milliseconds=1))
        direction = "ahead of" if skew > timedelta(0) else "behind"
        logger.error(
            "pybatch: refusing the connection: this host's clock is %s ms %s the database "
            "server's (at most %s ms allowed); synchronise it (NTP)",
            milliseconds,
            direction,
            bound_ms,
        )
        return ClockSkewExceeded(skew_ms=milliseconds, direction=direction, bound_ms=bound_ms)

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

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def connect(cls, config: ConnectionConfig, *, clock: Clock | None = None) -> JobRepository:
        """Build the pool and verify the installed schema version; never migrates.

        Raises:
            SchemaUninitialized: no pybatch schema or version row.
            MigrationRequired: the schema is older than this package.
            NewerSchema: the schema is newer than this package.
            ClockSkewExceeded: the clock is further than `config.max_clock_skew` from the
                server's (a clock marked `simulated`, a test double, is not measured). The
                same check runs on every new pooled connection, so a later lease raises it
                too once the clock has drifted or jumped.
            Unavailable: the server cannot be reached (details redacted).
        """
        clock = clock or SystemClock()
        check = None if is_simulated(clock) else _clock_skew_check(config, clock)
        transactions = TransactionSource(config, check=check)
        try:
            repository = cls(config, transactions, clock, 0)
            repository.schema_version = repository._verify_schema_version()
        except BaseException:
            transactions.close(0)
            raise
        return repository

    def _verify_schema_version(self) -> int:
        supported = supported_schema_version()
        with self.transactions.read_only(schema_probe=True) as conn:
            installed = self.statements.read_schema_version.scalar(conn)
        if installed is None:
            raise SchemaUninitialized()
        if type(installed) is not int:
            raise Unavailable()
        if installed < supported:
            raise MigrationRequired(current=installed, supported=supported)
        if installed > supported:
            raise NewerSchema(current=installed, supported=supported)
        return installed

    def close(self) -> None:
        """Close the pool within the configured close timeout."""
        self.transactions.close(self.config.pool_close_timeout.total_seconds())

    def __enter__(self) -> JobRepository:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ units of work

    def begin(self) -> UnitOfWork:
        """Open a unit of work: READ COMMITTED with the configured timeouts.

        Raises:
            Unavailable: no connection could be leased.
        """
        return UnitOfWork(self.transactions.lease(), self.statements, self.clock)

    def read_transaction(self) -> AbstractContextManager[Connection]:
        """A READ ONLY, READ COMMITTED transaction with the configured timeouts, always rolled back.

        For reads that must not join a unit of work (committed chunk state, reports).
        """
        return self.transactions.read_only()

    def run_in_unit_of_work(self, work: Callable[[UnitOfWork], T]) -> T:
        """Run `work` in a unit of work and commit; re-run it on RetryableConflict only.

        At most `config.unit_of_work_attempts` attempts; CommitOutcomeUnknown and every
        other error propagate at once, because re-running could apply the work twice.
        """
        attempt = 1
        while True:
            with self.begin() as uow:
                try:
                    result = work(uow)
                    uow.commit()
                except RetryableConflict:
                    if attempt >= self.config.unit_of_work_attempts:
                        raise
                    attempt += 1
                    continue
                return result

    def recovery_snapshot(
        self, execution_id: int, current_owner: OwnerToken | None = None
    ) -> RecoverySnapshot:
        """Observe one execution for a recovery decision, in its own read-only transaction.

        Raises:
            JobExecutionNotFound: no such execution.
            Unavailable: the server failed, or a row could not be decoded.
        """
        with self.read_transaction() as conn:
            try:
                return recovery.recovery_snapshot(
                    self.statements, conn, execution_id, current_owner
                )
            except DecodeError:
                raise Unavailable() from None

    # ------------------------------------------------------------------ negotiation

    def descriptor(self) -> RepositoryDescriptor:
        """What this repository implements: every capability, at its schema version."""
        return RepositoryDescriptor(
            RepositoryDescriptor.CURRENT_VERSION,
            self.schema_version,
            frozenset(RepositoryCapability),
        )

    def connection_capacity(self) -> int:
        """How many connections the pool may open (throughput, not a capability)."""
        return self.config.pool_size
