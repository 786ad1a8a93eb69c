"""Retention holds (docs/contract.md, Holds), queries/holds.sql.

One hold per instance, stored on the instance row. A hold keeps the instance out of every
purge survey and makes a pending plan that names it stale; it never blocks lifecycle work.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from pybatch._codecs._primitives import DecodeError, decode_aware, decode_int64
from pybatch._repository._capability import Capability
from pybatch._statements import Connection, Row, Statement
from pybatch.errors import JobInstanceNotFound, RequestFieldError
from pybatch.values.ids import IdentifierKind, aware_utc, check_identifier
from pybatch.values.names import ActorRef, ReasonCode
from pybatch.values.retention import RetentionHold


def _decode_hold(row: Any) -> RetentionHold | None:
    if row["hold_actor"] is None and row["hold_reason"] is None and row["hold_placed_at"] is None:
        return None
    try:
        return RetentionHold(
            job_instance_id=decode_int64(row["id"], column="id", minimum=0),
            actor=ActorRef(row["hold_actor"]),
            reason=ReasonCode(row["hold_reason"]),
            placed_at=decode_aware(row["hold_placed_at"], column="hold_placed_at"),
        )
    except (RequestFieldError, TypeError):
        raise DecodeError("hold") from None


def _instance_row(statement: Statement, conn: Connection, instance_id: int) -> Row:
    """The instance's hold columns through `statement` (JobInstanceNotFound without a row)."""
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    if (row := statement.one(conn, job_instance_id=instance_id)) is None:
        raise JobInstanceNotFound(id=instance_id)
    return row


class Holds(Capability):
    """The holds operations of one unit of work; each raises JobInstanceNotFound without one."""

    def get(self, instance_id: int) -> RetentionHold | None:
        """The instance's hold, or None."""
        with self._operation() as (q, conn):
            return _decode_hold(_instance_row(q.read_instance_hold, conn, instance_id))

    def place_unless_held(
        self, instance_id: int, actor: ActorRef, reason: ReasonCode, placed_at: _dt.datetime
    ) -> tuple[RetentionHold, bool]:
        """Place the hold unless a hold with the same reason is in place: (the hold, placed).

        The instance is locked first, so of two identical holds one places it and the other
        finds it; a hold with another reason replaces the one in place.
        """
        with self._operation() as (q, conn):
            current = _decode_hold(_instance_row(q.lock_instance_hold, conn, instance_id))
            if current is not None and current.reason == reason:
                return current, False
            hold = RetentionHold(
                job_instance_id=instance_id, actor=actor, reason=reason, placed_at=placed_at
            )
            q.update_instance_hold.affected(
                conn,
                job_instance_id=instance_id,
                actor_ref=actor.value,
                reason_code=reason.value,
                placed_at=aware_utc(placed_at),
            )
            return hold, True

    def release(self, instance_id: int) -> RetentionHold | None:
        """Clear the hold; return the previous one (None if there was none: nothing written)."""
        with self._operation() as (q, conn):
            previous = _decode_hold(_instance_row(q.lock_instance_hold, conn, instance_id))
            if previous is not None:
                q.update_instance_hold.affected(
                    conn,
                    job_instance_id=instance_id,
                    actor_ref=None,
                    reason_code=None,
                    placed_at=None,
                )
            return previous
