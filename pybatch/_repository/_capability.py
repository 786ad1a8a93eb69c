"""What a capability is bound to: one unit of work's transaction, statements and clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, TypeVar

import attrs

from pybatch import errors
from pybatch._clock import Clock
from pybatch._codecs._primitives import DecodeError, returned
from pybatch._codecs.executions import JOB_EXECUTION_COLUMNS, decode_job_execution
from pybatch._statements import Connection, Row, Statement, Statements
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.records import JobExecution

T = TypeVar("T")

#: Constraint name -> the error a violation of it means for this operation.
Overrides = Mapping[str, Callable[[], errors.PyBatchError]]


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
        self,
        statement: Statement,
        params: Mapping[str, object],
        decode: Callable[..., T],
        *,
        overrides: Overrides | None = None,
        then: tuple[Statement, Mapping[str, object]] | None = None,
        wait_for_flush: bool = True,
    ) -> T:
        """`statement` (then `then`) alone, committed in the same round trip; rows to `decode`.

        `wait_for_flush=False` only for what docs/contract.md, Durability of commits, lists: a
        step's start and end, a partition's end with the next claim.
        """


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
        raise errors.JobInstanceNotFound(id=instance_id)


def job_execution_row(q: Statements, conn: Connection, execution_id: int) -> Row:
    """The stored row of an execution, undecoded (JobExecutionNotFound when there is none)."""
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    if (row := q.get_job_execution.one(conn, job_execution_id=execution_id)) is None:
        raise errors.JobExecutionNotFound(id=execution_id)
    return row


def execution_at(row: Row, prefix: str) -> JobExecution | None:
    """The job execution in `row`'s columns named `prefix` + column, decoded (None without one)."""
    if row[f"{prefix}id"] is None:
        return None
    return decode_job_execution({column: row[prefix + column] for column in JOB_EXECUTION_COLUMNS})


def decided(row: Row | None, *done: str) -> tuple[str, Row]:
    """A transition function's outcome, one of `done`, and its row; else the refusal raised.

    A refusal names a repository error of pybatch.errors, built from `details`; an outcome or
    a field that is not known fails closed (DecodeError).
    """
    values = returned(row)
    outcome, details = values["outcome"], values["details"]
    if outcome in done:
        return str(outcome), values
    refusal = getattr(errors, outcome, None) if type(outcome) is str else None
    if not (isinstance(refusal, type) and issubclass(refusal, errors.RepositoryError)):
        raise DecodeError("outcome")
    if not isinstance(details, dict):
        raise DecodeError("details")
    fields = {field.name for field in attrs.fields(refusal)}
    if not set(details) <= fields or any(type(v) not in (str, int, bool) for v in details.values()):
        raise DecodeError("details")
    raise refusal(**details)
