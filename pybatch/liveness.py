"""A run's liveness session: the dedicated connection that holds its execution's lock.

The lock is fast evidence that the owner is alive, never the authority: the lease on the
execution row decides. It is keyed by the owner token, so no other role can take it first;
a run whose lock is held by someone else goes on without it (never waiting), and an
expired lease is recovered whoever holds any lock.

Statements: liveness.sql (through pybatch/repository/liveness.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pybatch.repository import liveness

if TYPE_CHECKING:
    from pybatch.job_repository import JobRepository
    from pybatch.values.ownership import OwnerToken

logger = logging.getLogger("pybatch.liveness")

__all__ = ["LivenessSession"]


class LivenessSession:
    """One autocommit connection outside the pool, living as long as the run it proves alive."""

    def __init__(self, repository: JobRepository) -> None:
        self._statements = repository.statements
        self._conn = repository.dedicated_connection()

    def __repr__(self) -> str:
        return f"LivenessSession(open={not self._conn.closed})"

    def claim(self, execution_id: int, owner: OwnerToken) -> bool:
        """Hold `owner`'s liveness lock of `execution_id` until `close`; never waits.

        False when another session holds it (only someone who learned the key can): the run
        goes on without this evidence, its lease alone proving it alive.

        Raises:
            Unavailable: the connection failed.
        """
        key = owner.liveness_key(execution_id)
        if liveness.try_lock_owner_liveness(self._statements, self._conn, key):
            return True
        logger.warning(
            "pybatch: the liveness lock of job execution %s is held by another session; "
            "the run goes on, proved alive by its lease alone",
            execution_id,
        )
        return False

    def owner_is_gone(self, execution_id: int, owner: OwnerToken | None = None) -> bool:
        """True when no session holds the liveness lock of `execution_id`; never waits.

        `owner` is the execution's recorded owner token (its token-keyed lock is probed);
        None probes the id-keyed lock of a run started before leases existed.

        Raises:
            Unavailable: the connection failed.
        """
        if owner is None:
            return liveness.owner_is_gone(self._statements, self._conn, execution_id)
        key = owner.liveness_key(execution_id)
        return liveness.owner_liveness_is_free(self._statements, self._conn, key)

    def close(self) -> None:
        """End the session, which releases every lock it holds."""
        self._conn.close()
