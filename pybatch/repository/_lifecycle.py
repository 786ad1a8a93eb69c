"""The one compare-and-swap algorithm of job and step executions.

See docs/contract.md, Lifecycle; Transitions and enrichment.

A transition or an exit-status enrichment locks the row, computes the new lifecycle state
in Python (`values/lifecycle.py`, the contract's table), then writes it with an UPDATE whose
`WHERE` holds the expected version; zero rows means another writer won, told apart from a
vanished row by one re-read. `executions.py` and `steps.py` supply their statements through
a `LifecycleRows`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Generic, TypeVar

import attrs

from pybatch._statements import Connection, Statements
from pybatch.errors import PyBatchError, StaleVersion, Unavailable, VersionOutOfRange
from pybatch.values.ids import INT64_MAX, check_version
from pybatch.values.lifecycle import (
    ExecutionMetadata,
    LifecycleTransition,
    apply_exit_enrichment,
    apply_transition,
)
from pybatch.values.names import ExitCode
from pybatch.values.records import JobExecution, StepExecution

Record = TypeVar("Record", JobExecution, StepExecution)


@attrs.frozen
class LifecycleRows(Generic[Record]):
    """How one lifecycle table is locked, read and compare-and-swapped."""

    #: Lock the row and decode it; raises the table's NotFound error.
    lock: Callable[[Statements, Connection, int], Record]
    #: Read the row without a lock, or None.
    get: Callable[[Statements, Connection, int], Record | None]
    #: The table's NotFound error for an id.
    not_found: Callable[[int], PyBatchError]
    #: Write a transition's metadata if the version is still the expected one; rows changed.
    write_transition: Callable[[Statements, Connection, int, int, ExecutionMetadata, datetime], int]
    #: Write an exit status if the version is still the expected one; rows changed.
    write_exit_status: Callable[[Statements, Connection, int, int, ExitCode, datetime], int]
    #: Whether transitions move the counters (steps count rollbacks; jobs have no counters).
    counts_apply: bool


def check_expected_version(expected_version: int) -> int:
    """An expected version to compare with a stored one.

    See docs/contract.md, Identifiers, versions and counters.

    Raises:
        Unavailable: above 2^63-1, where no stored version can be (bigint).
        VersionOutOfRange: negative.
    """
    try:
        return check_version(expected_version)
    except VersionOutOfRange:
        if type(expected_version) is int and expected_version > INT64_MAX:
            raise Unavailable() from None
        raise


def _swapped(
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
    if changed != 1:
        latest = rows.get(q, conn, current.id)
        if latest is None:
            raise rows.not_found(current.id)
        raise StaleVersion(expected=expected, actual=latest.version)
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

    Raises:
        the table's NotFound, then the lifecycle errors in the order of
        docs/contract.md, Transition check order.
    """
    check_expected_version(expected_version)
    current = rows.lock(q, conn, record_id)
    new = apply_transition(
        current.metadata,
        current.version,
        expected_version,
        change,
        counts_apply=rows.counts_apply,
    )
    changed = rows.write_transition(q, conn, record_id, expected_version, new[0], change.at)
    return _swapped(rows, q, conn, current, changed, expected_version, new, change.at)


def enrich_exit_status(
    rows: LifecycleRows[Record],
    q: Statements,
    conn: Connection,
    now: datetime,
    record_id: int,
    expected_version: int,
    exit_status: ExitCode,
) -> Record:
    """Replace the exit status in any status, bumping the version.

    See docs/contract.md, Exit-status enrichment; Transitions and enrichment.
    """
    check_expected_version(expected_version)
    current = rows.lock(q, conn, record_id)
    new = apply_exit_enrichment(current.metadata, current.version, expected_version, exit_status)
    changed = rows.write_exit_status(q, conn, record_id, expected_version, exit_status, now)
    return _swapped(rows, q, conn, current, changed, expected_version, new, now)
