"""Retention holds (docs/contract.md, Holds), queries/holds.sql.

One hold per instance, stored on the instance row. A hold keeps the instance out of every
purge survey and makes a pending plan that names it stale; it never blocks lifecycle work.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import psycopg

from pybatch.codecs._primitives import DecodeError, decode_aware, decode_int64
from pybatch.errors import JobInstanceNotFound, RequestFieldError
from pybatch.repository._capability import Capability
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.names import ActorRef, ReasonCode
from pybatch.values.retention import RetentionHold
from pybatch.values.timestamps import aware_utc

Connection = psycopg.Connection[Any]


def _decode_hold(row: Any) -> RetentionHold | None:
    columns = (row["hold_actor"], row["hold_reason"], row["hold_placed_at"])
    if all(value is None for value in columns):
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


class Holds(Capability):
    """The holds operations of one unit of work."""

    def get(self, instance_id: int) -> RetentionHold | None:
        """The instance's hold, or None.

        Raises:
            JobInstanceNotFound: no such instance.

        Statements: holds.sql read_instance_hold.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
            row = q.read_instance_hold.one(conn, job_instance_id=instance_id)
            if row is None:
                raise JobInstanceNotFound(id=instance_id)
            return _decode_hold(row)

    def place(
        self, instance_id: int, actor: ActorRef, reason: ReasonCode, placed_at: _dt.datetime
    ) -> RetentionHold:
        """Place the hold, replacing any existing one.

        Raises:
            JobInstanceNotFound: no such instance.

        Statements: holds.sql lock_instance_hold, update_instance_hold.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
            hold = RetentionHold(
                job_instance_id=instance_id, actor=actor, reason=reason, placed_at=placed_at
            )
            if q.lock_instance_hold.one(conn, job_instance_id=instance_id) is None:
                raise JobInstanceNotFound(id=instance_id)
            q.update_instance_hold.affected(
                conn,
                job_instance_id=instance_id,
                actor_ref=actor.value,
                reason_code=reason.value,
                placed_at=aware_utc(placed_at),
            )
            return hold

    def release(self, instance_id: int) -> RetentionHold | None:
        """Clear the hold; return the previous one (None if there was none).

        Raises:
            JobInstanceNotFound: no such instance.

        Statements: holds.sql lock_instance_hold, update_instance_hold.
        """
        with self._uow.operation() as conn:
            q = self._uow.statements
            check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
            row = q.lock_instance_hold.one(conn, job_instance_id=instance_id)
            if row is None:
                raise JobInstanceNotFound(id=instance_id)
            previous = _decode_hold(row)
            if previous is not None:
                q.update_instance_hold.affected(
                    conn,
                    job_instance_id=instance_id,
                    actor_ref=None,
                    reason_code=None,
                    placed_at=None,
                )
            return previous
