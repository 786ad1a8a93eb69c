"""Liveness of a run: a session advisory lock its owner holds (queries/liveness.sql).

The owner holds the lock on a dedicated autocommit connection for the life of the run;
PostgreSQL releases it when that session ends, however the process ends. The lock is fast
evidence only, never the authority (the lease is): a launcher that finds it held while the
lease is fresh refuses at once instead of waiting for a renewal. Runs of schema version 4
and later key it by their owner token (OwnerToken.liveness_key), so nobody can take it
before its owner; the id-keyed lock is only probed for runs started before leases existed.
Nothing here ever waits for a lock. These functions run outside any unit of work, so they
map driver errors themselves.
"""

from __future__ import annotations

import psycopg

from pybatch import _sqlstate
from pybatch._statements import Connection, Statements
from pybatch.values.ids import IdentifierKind, check_identifier

__all__ = [
    "owner_is_gone",
    "owner_liveness_is_free",
    "try_lock_owner_liveness",
    "try_lock_job_execution_liveness",
    "try_lock_step_execution_liveness",
    "unlock_step_execution_liveness",
    "worker_is_gone",
]


def try_lock_owner_liveness(q: Statements, conn: Connection, key: int) -> bool:
    """Take a run's token-keyed liveness lock on `conn` for the session; False when held.

    Raises:
        Unavailable: the connection failed (mapped, redacted).

    Statements: liveness.sql try_lock_owner_liveness.
    """
    try:
        return q.try_lock_owner_liveness.scalar(conn, liveness_key=key) is True
    except psycopg.Error as error:
        raise _sqlstate.translate(error) from None


def owner_liveness_is_free(q: Statements, conn: Connection, key: int) -> bool:
    """True when no session holds a run's token-keyed liveness lock.

    Raises:
        Unavailable: the connection failed (mapped, redacted).

    Statements: liveness.sql try_lock_owner_liveness, unlock_owner_liveness.
    """
    if not try_lock_owner_liveness(q, conn, key):
        return False
    try:
        q.unlock_owner_liveness.scalar(conn, liveness_key=key)
    except psycopg.Error as error:
        raise _sqlstate.translate(error) from None
    return True


def try_lock_job_execution_liveness(q: Statements, conn: Connection, execution_id: int) -> bool:
    """Take the execution's liveness lock on `conn` for the session; False when it is held.

    Raises:
        Unavailable: the connection failed (mapped, redacted).

    Statements: liveness.sql try_lock_job_execution_liveness.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
    try:
        return q.try_lock_job_execution_liveness.scalar(conn, job_execution_id=execution_id) is True
    except psycopg.Error as error:
        raise _sqlstate.translate(error) from None


def owner_is_gone(q: Statements, conn: Connection, execution_id: int) -> bool:
    """True when no session holds the id-keyed liveness lock of a run started before leases.

    Raises:
        Unavailable: the connection failed (mapped, redacted).

    Statements: liveness.sql try_lock_job_execution_liveness, unlock_job_execution_liveness.
    """
    if not try_lock_job_execution_liveness(q, conn, execution_id):
        return False
    try:
        q.unlock_job_execution_liveness.scalar(conn, job_execution_id=execution_id)
    except psycopg.Error as error:
        raise _sqlstate.translate(error) from None
    return True


def try_lock_step_execution_liveness(q: Statements, conn: Connection, step_id: int) -> bool:
    """Take a partition worker step's liveness lock on `conn`; False when it is held.

    Raises:
        Unavailable: the connection failed (mapped, redacted).

    Statements: liveness.sql try_lock_step_execution_liveness.
    """
    check_identifier(IdentifierKind.STEP_EXECUTION, step_id)
    try:
        return q.try_lock_step_execution_liveness.scalar(conn, step_execution_id=step_id) is True
    except psycopg.Error as error:
        raise _sqlstate.translate(error) from None


def unlock_step_execution_liveness(q: Statements, conn: Connection, step_id: int) -> None:
    """Release a worker step's liveness lock taken on `conn`.

    Raises:
        Unavailable: the connection failed (mapped, redacted).

    Statements: liveness.sql unlock_step_execution_liveness.
    """
    check_identifier(IdentifierKind.STEP_EXECUTION, step_id)
    try:
        q.unlock_step_execution_liveness.scalar(conn, step_execution_id=step_id)
    except psycopg.Error as error:
        raise _sqlstate.translate(error) from None


def worker_is_gone(q: Statements, conn: Connection, step_id: int) -> bool:
    """True when no live session holds the worker step's liveness lock (its process is gone).

    Statements: liveness.sql try_lock_step_execution_liveness, unlock_step_execution_liveness.
    """
    if not try_lock_step_execution_liveness(q, conn, step_id):
        return False
    unlock_step_execution_liveness(q, conn, step_id)
    return True
