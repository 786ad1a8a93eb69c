"""What a capability is bound to: one unit of work's transaction, statements and clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from pybatch._clock import Clock
from pybatch._statements import Connection, Row, Statement, Statements
from pybatch.errors import JobExecutionNotFound, JobInstanceNotFound, PyBatchError
from pybatch.values.ids import IdentifierKind, check_identifier

#: Constraint name -> the error a violation of it means for this operation.
Overrides = Mapping[str, Callable[[], PyBatchError]]


class Transaction(Protocol):
    """The unit of work as its capabilities see it (pybatch/_unit_of_work.py)."""

    statements: Statements
    clock: Clock
    #: Parents whose partition plan was created or carried here: not yet published.
    unpublished_plans: set[int]

    def operation(
        self, *, overrides: Overrides | None = None
    ) -> AbstractContextManager[Connection]:
        """One atomic operation: a savepoint (none when nested), driver errors mapped."""

    def commit_statement(
        self, statement: Statement, /, *, overrides: Overrides | None = None, **params: object
    ) -> Row | None:
        """`statement` as the whole transaction, committed in the same round trip."""


class Capability:
    """A set of operations bound to one unit of work; each runs in `operation()`."""

    __slots__ = ("_uow",)

    def __init__(self, uow: Transaction) -> None:
        self._uow = uow

    @contextmanager
    def _operation(
        self, *, overrides: Overrides | None = None
    ) -> Iterator[tuple[Statements, Connection]]:
        """`operation()` of the unit of work, with its statements."""
        with self._uow.operation(overrides=overrides) as conn:
            yield self._uow.statements, conn


def require_job_instance(q: Statements, conn: Connection, instance_id: int) -> None:
    """Refuse an instance id that is malformed or names no instance (JobInstanceNotFound)."""
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    if q.get_job_instance.one(conn, job_instance_id=instance_id) is None:
        raise JobInstanceNotFound(id=instance_id)


def job_execution_row(q: Statements, conn: Connection, execution_id: int) -> Row:
    """The stored row of an execution, undecoded (JobExecutionNotFound when there is none)."""
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    row = q.get_job_execution.one(conn, job_execution_id=execution_id)
    if row is None:
        raise JobExecutionNotFound(id=execution_id)
    return row
