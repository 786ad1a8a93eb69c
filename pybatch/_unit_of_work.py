"""The unit of work: one leased connection, one READ COMMITTED transaction.

Each operation (`uow.executions.create(...)`, pybatch/_repository/<capability>.py) runs under
its own savepoint, so a failed one leaves nothing staged and the unit of work usable. COMMIT
of a transaction the server already failed raises TransactionAborted, a lost acknowledgement
CommitOutcomeUnknown; neither is ever reported as success. A transition that is one statement
runs as the whole unit of work through `commit_statement`, its own transaction in one round
trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from functools import cached_property, partial
from typing import TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from pybatch import _sqlstate
from pybatch import errors as e
from pybatch._clock import Clock
from pybatch._codecs._primitives import DecodeError
from pybatch._repository._capability import Overrides
from pybatch._repository.definitions import Definitions
from pybatch._repository.executions import Executions
from pybatch._repository.flow import Flow
from pybatch._repository.holds import Holds
from pybatch._repository.instances import Instances
from pybatch._repository.operator_requests import OperatorRequests
from pybatch._repository.ownership import Ownership
from pybatch._repository.partitions import Partitions
from pybatch._repository.recovery import Recovery
from pybatch._repository.retention import Retention
from pybatch._repository.steps import Steps
from pybatch._repository.stop_requests import StopRequests
from pybatch._statements import Connection, Statement, Statements
from pybatch._transaction import CommitErrors, Lease

T = TypeVar("T")

_COMMIT_ERRORS = CommitErrors(
    aborted=e.TransactionAborted, refused=_sqlstate.translate, unknown=e.CommitOutcomeUnknown
)


class UnitOfWork:
    """One transaction and the capabilities whose operations run in it."""

    def __init__(self, lease: Lease, statements: Statements, clock: Clock) -> None:
        self._lease = lease
        self._poisoned: e.PyBatchError | None = None
        self.statements = statements
        self.clock = clock
        self.unpublished_plans: set[int] = set()
        self._operation_depth = 0
        self._committed = False

    def __enter__(self) -> UnitOfWork:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        if not self._lease.is_open:
            return
        try:
            self.rollback()
        except e.PyBatchError:
            if exc is None:
                raise

    @property
    def is_open(self) -> bool:
        """Whether statements can still run (not committed, rolled back or closed)."""
        return self._lease.is_open

    @property
    def connection(self) -> Connection:
        """The connection for business statements: outside savepoints, a failed one fails COMMIT."""
        if self._poisoned is not None:
            raise self._poisoned
        if (conn := self._lease.connection) is None:
            raise e.UnitOfWorkClosed()
        self._lease.begin()  # behind a transaction-mode pooler, the settings come first
        return conn

    @contextmanager
    def operation(self, *, overrides: Overrides | None = None) -> Iterator[Connection]:
        """Run one repository operation under its own savepoint, mapping driver errors."""
        conn = self.connection
        if self._operation_depth:
            # Called by another operation: it runs inside the caller's savepoint, whose
            # failure handling and error mapping cover it (no second savepoint round trip).
            yield conn
            return
        self._operation_depth += 1
        try:
            if conn.info.transaction_status == TransactionStatus.IDLE:
                # Nothing is staged yet: the operation's first statement opens the
                # transaction (no BEGIN round trip), and on failure rolling all of it back
                # is exactly what rolling back to a savepoint would do.
                try:
                    yield conn
                except BaseException:
                    if not conn.broken and not conn.closed:
                        with suppress(psycopg.Error):  # the error raised already says so
                            conn.rollback()
                    raise
            else:
                with conn.transaction():
                    yield conn
        except e.DomainError as error:
            raise e.RepositoryDomainError(error=error) from error
        except e.PyBatchError as error:
            if isinstance(error, e.RetryableConflict | e.Unavailable) and conn.broken:
                self._poisoned = error
            raise
        except DecodeError:
            raise e.Unavailable() from None
        except psycopg.Error as error:
            mapped = _sqlstate.translate(error, overrides=overrides)
            if isinstance(mapped, e.RetryableConflict) or _sqlstate.is_connection_loss(error, conn):
                # After a conflict abort or a lost connection, only rollback is allowed.
                self._poisoned = mapped
            raise mapped from None
        finally:
            self._operation_depth -= 1

    def commit_statement(
        self,
        statement: Statement,
        params: Mapping[str, object],
        decode: Callable[..., T],
        *,
        overrides: Overrides | None = None,
        then: tuple[Statement, Mapping[str, object]] | None = None,
        wait_for_flush: bool = True,
    ) -> T:
        """Run `statement` (and `then`) as this whole unit of work, committed in one round trip.

        `decode` takes the row (both rows with `then`). No savepoint (nothing else is staged);
        `commit()` then returns. Errors map as in `operation()`, an undecodable row is
        Unavailable; nothing is committed on an error but CommitOutcomeUnknown.
        `wait_for_flush=False`: the COMMIT returns before the WAL is flushed (docs/contract.md,
        Durability of commits).
        """
        if self._poisoned is not None:
            raise self._poisoned
        conn = self._lease.connection  # not `connection`: the settings go in the pipeline
        if conn is None:
            raise e.UnitOfWorkClosed()
        if self._operation_depth or conn.info.transaction_status != TransactionStatus.IDLE:
            raise RuntimeError("commit_statement must be the only statement of its unit of work")
        if self._lease.read_only:  # it runs in autocommit, where READ ONLY would not apply
            raise RuntimeError("a read-only unit of work commits no statement")
        refused = partial(_sqlstate.translate, overrides=overrides)
        errors = CommitErrors(e.TransactionAborted, refused, e.CommitOutcomeUnknown)
        rows = self._lease.commit_alone(
            [(statement, params), *([then] if then else [])], errors, wait_for_flush=wait_for_flush
        )
        self._committed = True
        try:
            return decode(*rows)
        except DecodeError:
            raise e.Unavailable() from None

    def commit(self) -> None:
        """COMMIT; raise rather than report success for anything but a durable commit."""
        if self._committed:  # by commit_statement
            return
        self.connection  # noqa: B018 - raises the poisoning error, else UnitOfWorkClosed if closed
        self._lease.commit(_COMMIT_ERRORS)

    def rollback(self) -> None:
        """ROLLBACK everything staged, once (Unavailable: it failed, the connection is gone)."""
        self._poisoned = None
        if not self._lease.rollback():
            raise e.Unavailable()

    # Each is pybatch/_repository/<name>.py over queries/<name>.sql, created on first use.
    definitions = cached_property(Definitions)
    instances = cached_property(Instances)
    executions = cached_property(Executions)
    steps = cached_property(Steps)
    flow = cached_property(Flow)
    partitions = cached_property(Partitions)
    recovery = cached_property(Recovery)
    operator_requests = cached_property(OperatorRequests)
    stop_requests = cached_property(StopRequests)
    ownership = cached_property(Ownership)
    holds = cached_property(Holds)
    retention = cached_property(Retention)
