"""What a capability is bound to: one unit of work's transaction, statements and clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from pybatch._statements import Connection, Statements
from pybatch.clock import Clock
from pybatch.errors import PyBatchError

#: Constraint name -> the error a violation of it means for this operation.
Overrides = Mapping[str, Callable[[], PyBatchError]]


class Transaction(Protocol):
    """The unit of work as its capabilities see it (pybatch/unit_of_work.py)."""

    statements: Statements
    clock: Clock
    #: Parents whose partition plan was created or carried here: not yet published.
    unpublished_plans: set[int]

    def operation(
        self, *, overrides: Overrides | None = None
    ) -> AbstractContextManager[Connection]:
        """One atomic operation: a savepoint (none when nested), driver errors mapped."""
        ...


class Capability:
    """A set of operations bound to one unit of work; each runs in `operation()`."""

    __slots__ = ("_uow",)

    def __init__(self, uow: Transaction) -> None:
        self._uow = uow
