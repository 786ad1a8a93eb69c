"""The job repository: a bounded connection pool handing out units of work (behaviour.md 4).

Statements: schema.sql read_schema_version (the version check at connect).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from pybatch._statements import Connection, Statements, load_statements
from pybatch._transaction import TransactionSource
from pybatch.clock import Clock, SystemClock
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
            Unavailable: the server cannot be reached (details redacted).
        """
        transactions = TransactionSource(config)
        try:
            repository = cls(config, transactions, clock or SystemClock(), 0)
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

    def dedicated_connection(self) -> Connection:
        """An autocommit connection outside the pool, for a run's liveness lock.

        Raises:
            Unavailable: the server cannot be reached (details redacted).
        """
        return self.transactions.dedicated_connection()

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
