"""Skip records: the items a fault-tolerant step skipped (migration 0011, `pybatch.step_skip`).

A chunk of `StepRun.load` that narrowed its batch down to the items the server rejected
records them here, in its own transaction, before its progress UPDATE: the chunk's good rows,
its skip records and its skip counters commit together or not at all. The explorer reads them
back page by page (`JobExplorer.skips`).

Statements: skips.sql get_step_skip_total and insert_step_skip, in the chunk's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from pybatch._failure_reasons import CONTROL, bounded, server_name
from pybatch._statements import Connection, load_statements
from pybatch.errors import NotCommitted, Rejected

#: The bound of the key column (step_skip_item_key_length; messages are bounded as reasons).
MAX_KEY_BYTES = 256


@attrs.frozen
class SkippedItem:
    """One item a chunk skips: where it is in the source, its key, and why it was rejected."""

    position: int
    key: str
    error: Rejected


def item_key(value: object) -> str:
    """The key stored for an item: its text, control characters replaced, bounded."""
    return bounded(CONTROL.sub(" ", str(value)), MAX_KEY_BYTES) or "-"


def step_skip_total(conn: Connection, step_execution_id: int) -> int:
    """The skips the step has committed so far (NotCommitted: the step is gone)."""
    total = load_statements().get_step_skip_total.scalar(conn, step_execution_id=step_execution_id)
    if type(total) is not int:
        raise NotCommitted(reason="the step execution does not exist")
    return total


def record_skips(conn: Connection, step_execution_id: int, skipped: Sequence[SkippedItem]) -> None:
    """Insert the chunk's skip records in its open transaction, one statement each.

    A chunk skips few items (each costs its isolating writes already), so one round trip
    per record is not worth an array-binding statement. The message is the typed error's
    own (SQLSTATE and names only): the server's message can quote the rejected row's values.
    """
    for item in skipped:
        error = item.error
        changed = load_statements().insert_step_skip.affected(
            conn,
            step_execution_id=step_execution_id,
            item_position=item.position,
            item_key=item.key,
            sqlstate=error.sqlstate,
            constraint_name=server_name(error.constraint),
            table_name=server_name(error.table),
            column_name=server_name(error.column),
            message=bounded(str(error)),
        )
        if changed != 1:
            raise NotCommitted(reason="a skip record was not inserted")
