"""A run's liveness session: the dedicated connection that holds its execution's lock.

Statements: liveness.sql (through pybatch/repository/liveness.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybatch.errors import Unavailable
from pybatch.repository import liveness

if TYPE_CHECKING:
    from pybatch.job_repository import JobRepository

__all__ = ["LivenessSession"]


class LivenessSession:
    """One autocommit connection outside the pool, living as long as the run it proves alive."""

    def __init__(self, repository: JobRepository) -> None:
        self._statements = repository.statements
        self._conn = repository.dedicated_connection()

    def __repr__(self) -> str:
        return f"LivenessSession(open={not self._conn.closed})"

    def claim(self, execution_id: int) -> None:
        """Hold the liveness lock of `execution_id` until `close`.

        Raises:
            Unavailable: the lock is held by another session, or the connection failed.
        """
        if not liveness.try_lock_job_execution_liveness(self._statements, self._conn, execution_id):
            raise Unavailable()

    def owner_is_gone(self, execution_id: int) -> bool:
        """True when no live session holds the liveness lock of `execution_id`.

        Raises:
            Unavailable: the connection failed.
        """
        return liveness.owner_is_gone(self._statements, self._conn, execution_id)

    def close(self) -> None:
        """End the session, which releases every lock it holds."""
        self._conn.close()
