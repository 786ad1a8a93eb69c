"""Job instances (behaviour.md 4.2) over queries/instances.sql."""

from __future__ import annotations

from typing import Any

import psycopg

from pybatch._statements import Statements
from pybatch.clock import Clock
from pybatch.codecs.executions import decode_job_instance, encode_job_instance_key
from pybatch.errors import ConcurrentModification
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.records import Created, Existing, JobInstance, JobInstanceSelection

__all__ = ["find_job_instance", "get_job_instance", "select_or_create_job_instance"]

Connection = psycopg.Connection[Any]


def select_or_create_job_instance(
    q: Statements, conn: Connection, clock: Clock, key: JobInstanceKey
) -> JobInstanceSelection:
    """Return the instance of `key`, creating it when absent (behaviour.md 4.2).

    Race: concurrent creators of one key are settled by job_instance_identity_unique; the
    loser's insert does nothing and its read-back, a new statement under READ COMMITTED,
    sees the winner's committed row.

    Statements: instances.sql insert_job_instance_if_absent, find_job_instance_by_key.
    """
    columns = encode_job_instance_key(key)
    row = q.insert_job_instance_if_absent(conn, **columns, now=clock.now())
    if row is not None:
        return Created(instance=decode_job_instance(row))
    row = q.find_job_instance_by_key(
        conn, job_name=columns["job_name"], instance_key=columns["instance_key"]
    )
    if row is None:
        raise ConcurrentModification()
    return Existing(instance=decode_job_instance(row))


def find_job_instance(q: Statements, conn: Connection, key: JobInstanceKey) -> JobInstance | None:
    """The instance of `key`, or None (statements: instances.sql find_job_instance_by_key)."""
    row = q.find_job_instance_by_key(conn, job_name=key.job_name.value, instance_key=key.digest())
    return None if row is None else decode_job_instance(row)


def get_job_instance(q: Statements, conn: Connection, instance_id: int) -> JobInstance | None:
    """The instance with this id, or None (statements: instances.sql get_job_instance)."""
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    row = q.get_job_instance(conn, job_instance_id=instance_id)
    return None if row is None else decode_job_instance(row)
