"""The one compare-and-swap algorithm of job and step executions.

A transition locks the row, computes the new state in Python (`values/lifecycle.py`), then
writes it with an UPDATE whose `WHERE` holds the expected version; zero rows means another
writer won, told apart from a vanished row by one re-read.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Generic, TypeVar

import attrs

from pybatch._codecs.lifecycle import encode_execution_metadata
from pybatch._repository._capability import Capability
from pybatch._statements import Connection, Row, Statement, Statements
from pybatch.errors import PyBatchError, StaleVersion, Unavailable, VersionOutOfRange
from pybatch.values.ids import INT64_MAX, IdentifierKind, check_identifier, check_version
from pybatch.values.lifecycle import ExecutionMetadata, LifecycleTransition, apply_transition
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.status import FailureReason

Record = TypeVar("Record", JobExecution, StepExecution)


@attrs.frozen
class LifecycleRows(Generic[Record]):
    """How one lifecycle table is locked, decoded and compare-and-swapped."""

    kind: IdentifierKind
    #: The name of the row's id parameter in the table's statements.
    id_parameter: str
    lock_statement: Callable[[Statements], Statement]
    get_statement: Callable[[Statements], Statement]
    transition_statement: Callable[[Statements], Statement]
    decode: Callable[[Row], Record]
    not_found: Callable[[int], PyBatchError]
    #: Whether transitions move the counters: steps write their rollback_count, jobs have none.
    counts_apply: bool


def failure_reason_columns(reason: FailureReason | None) -> dict[str, object]:
    """The failure reason parameters of an ending statement (all None without a reason)."""
    return {
        "error_class": reason and reason.error_class,
        "message": reason and reason.message,
        "sqlstate": reason and reason.sqlstate,
        "constraint_name": reason and reason.constraint,
        "table_name": reason and reason.table,
        "column_name": reason and reason.column,
    }


def lock(rows: LifecycleRows[Record], q: Statements, conn: Connection, record_id: int) -> Record:
    """Lock the row and decode it; raises the table's NotFound error."""
    check_identifier(rows.kind, record_id)
    if (row := rows.lock_statement(q).one(conn, **{rows.id_parameter: record_id})) is None:
        raise rows.not_found(record_id)
    return rows.decode(row)


def check_expected_version(expected_version: int) -> int:
    """An expected version (VersionOutOfRange when negative, Unavailable above the bigint)."""
    try:
        return check_version(expected_version)
    except VersionOutOfRange:
        if type(expected_version) is int and expected_version > INT64_MAX:
            raise Unavailable() from None
        raise


def swapped(
    rows: LifecycleRows[Record],
    q: Statements,
    conn: Connection,
    current: Record,
    changed: int,
    expected: int,
    new: tuple[ExecutionMetadata, int],
    at: datetime,
) -> Record:
    """The record after a compare-and-swap that changed `changed` rows."""
    if changed != 1:  # another writer won, or the row vanished (NotFound)
        raise StaleVersion(expected=expected, actual=lock(rows, q, conn, current.id).version)
    metadata, version = new
    return attrs.evolve(
        current, metadata=metadata, version=version, updated_at=max(current.updated_at, at)
    )


def transition(
    rows: LifecycleRows[Record],
    q: Statements,
    conn: Connection,
    record_id: int,
    expected_version: int,
    change: LifecycleTransition,
) -> Record:
    """Apply a lifecycle transition under the row lock, then compare-and-swap.

    Raises the table's NotFound, then the lifecycle errors in the contract's check order.
    """
    check_expected_version(expected_version)
    current = lock(rows, q, conn, record_id)
    new = apply_transition(
        current.metadata, current.version, expected_version, change, counts_apply=rows.counts_apply
    )
    columns = encode_execution_metadata(new[0])
    del columns["exit_code"]  # transitions never change the exit status
    if rows.counts_apply:
        columns["rollback_count"] = new[0].counts.rolled_back
    changed = rows.transition_statement(q).affected(
        conn,
        **columns,
        transitioned_at=change.at,
        expected_version=expected_version,
        **{rows.id_parameter: record_id},
    )
    return swapped(rows, q, conn, current, changed, expected_version, new, change.at)


class LifecycleCapability(Capability, Generic[Record]):
    """The operations job and step executions share; `_rows` names the table."""

    __slots__ = ()
    _rows: LifecycleRows[Record]

    def transition(
        self, record_id: int, expected_version: int, change: LifecycleTransition
    ) -> Record:
        """Apply a lifecycle transition under the row lock (compare-and-swap)."""
        with self._operation() as (q, conn):
            return transition(self._rows, q, conn, record_id, expected_version, change)

    def get(self, record_id: int) -> Record | None:
        """One record, or None (docs/contract.md, Reads)."""
        with self._operation() as (q, conn):
            check_identifier(self._rows.kind, record_id)
            row = self._rows.get_statement(q).one(conn, **{self._rows.id_parameter: record_id})
            return None if row is None else self._rows.decode(row)
