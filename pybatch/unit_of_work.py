"""The unit of work: one pooled connection, one READ COMMITTED transaction (behaviour.md 4.0).

Each repository operation runs under its own savepoint, so a failed operation leaves
nothing staged and the unit of work stays usable. COMMIT outcomes follow schema.md 5:
a transaction the server already failed raises TransactionAborted, a lost
acknowledgement raises CommitOutcomeUnknown, and neither is ever reported as success.

Statements: transaction.sql set_transaction_timeouts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from pybatch import _sqlstate
from pybatch.codecs._primitives import DecodeError
from pybatch.errors import (
    CommitOutcomeUnknown,
    PyBatchError,
    RetryableConflict,
    TransactionAborted,
    Unavailable,
    UnitOfWorkClosed,
)

if TYPE_CHECKING:
    from pybatch.repository import JobRepository

__all__ = ["UnitOfWork", "UnitOfWorkBase"]

Overrides = Mapping[str, Callable[[], PyBatchError]]


class UnitOfWorkBase:
    """Transaction mechanics shared by every unit of work; operations live in the subclass."""

    def __init__(self, repository: JobRepository, conn: psycopg.Connection[Any]) -> None:
        self._repository = repository
        self._conn: psycopg.Connection[Any] | None = conn
        self._poisoned: PyBatchError | None = None
        self.statements = repository.statements
        self.clock = repository.clock

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> UnitOfWorkBase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._conn is None:
            return
        try:
            self.rollback()
        except PyBatchError:
            if exc is None:
                raise

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """Whether statements can still run (not committed, rolled back or closed)."""
        return self._conn is not None

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The transaction's connection, for business statements that commit with it.

        Business statements run outside pybatch's savepoints: one that fails leaves the
        transaction failed, and `commit` then raises TransactionAborted.
        """
        return self._live_connection()

    def _live_connection(self) -> psycopg.Connection[Any]:
        if self._poisoned is not None:
            raise self._poisoned
        if self._conn is None:
            raise UnitOfWorkClosed()
        return self._conn

    @contextmanager
    def operation(self, *, overrides: Overrides | None = None) -> Iterator[psycopg.Connection[Any]]:
        """Run one repository operation under its own savepoint, mapping driver errors."""
        conn = self._live_connection()
        try:
            with conn.transaction():
                yield conn
        except PyBatchError as error:
            if isinstance(error, RetryableConflict | Unavailable) and conn.broken:
                self._poison(error)
            raise
        except DecodeError:
            raise Unavailable() from None
        except psycopg.Error as error:
            mapped = _sqlstate.translate(error, overrides=overrides)
            if isinstance(mapped, RetryableConflict) or _sqlstate.is_connection_loss(error, conn):
                self._poison(mapped)
            raise mapped from None

    def transaction_settings(self) -> dict[str, str]:
        """The isolation level, timeouts and time zone in force (diagnostics, rule 22)."""
        with self.operation() as conn:
            row = self.statements.get_transaction_settings(conn)
        return {str(key): str(value) for key, value in row.items()}

    def _poison(self, error: PyBatchError) -> None:
        """After a conflict abort or a lost connection, only rollback is allowed."""
        self._poisoned = error

    # ------------------------------------------------------------------ outcome

    def commit(self) -> None:
        """COMMIT; raise rather than report success for anything but a durable commit."""
        if self._poisoned is not None:
            raise self._poisoned
        conn = self._live_connection()
        if conn.info.transaction_status == TransactionStatus.INERROR:
            self._finish(discard=not self._try_rollback(conn))
            raise TransactionAborted()
        try:
            conn.commit()
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                self._finish(discard=True)
                raise CommitOutcomeUnknown() from None
            mapped = _sqlstate.translate(error)
            self._finish(discard=not self._try_rollback(conn))
            raise mapped from None
        self._finish(discard=False)

    def rollback(self) -> None:
        """ROLLBACK everything staged; a second call is a no-op."""
        conn = self._conn
        if conn is None:
            return
        if self._try_rollback(conn):
            self._finish(discard=False)
            return
        self._finish(discard=True)
        raise Unavailable()

    @staticmethod
    def _try_rollback(conn: psycopg.Connection[Any]) -> bool:
        if conn.broken or conn.closed:
            return False
        try:
            conn.rollback()
        except psycopg.Error:
            return False
        return True

    def _finish(self, *, discard: bool) -> None:
        conn, self._conn = self._conn, None
        self._poisoned = None
        if conn is not None:
            self._repository._release(conn, discard=discard)



class UnitOfWork(UnitOfWorkBase):
    """A unit of work with every repository operation; each is atomic."""

    def __enter__(self) -> UnitOfWork:
        return self
