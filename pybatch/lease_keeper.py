"""Keeps a running execution's lease fresh from a background thread (behaviour.md 4.12).

The runner's main thread may spend minutes inside one chunk; the lease must not lapse
meanwhile, or a second launch would take the run over. The keeper renews the lease every
`lease.renew_interval` through pooled units of work (a killed idle connection is replaced,
never fatal), and doubles as the stop-request poll: when a renewal reports a stop request
it observes it (moving the execution to STOPPING) so the runner ends at its next chunk
boundary. When a renewal finds the ownership gone it records that and stops renewing;
the runner raises ExecutionOwnershipLost at its next boundary and touches nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from pybatch.errors import ExecutionOwnershipLost, PyBatchError
from pybatch.unit_of_work import UnitOfWork
from pybatch.values.ownership import ExecutionLease, OwnerToken

if TYPE_CHECKING:
    from pybatch.job_repository import JobRepository

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("pybatch.etl")

#: After a failed renewal, try again after this fraction of the regular interval.
RETRY_DIVISOR = 4


class LeaseKeeper:
    """Renews one execution's lease until stopped; reports loss of ownership and stop requests."""

    def __init__(
        self,
        repository: JobRepository,
        execution_id: int,
        owner: OwnerToken,
        lease: ExecutionLease,
    ) -> None:
        self.repository = repository
        self.execution_id = execution_id
        self.owner = owner
        self.lease = lease
        self._halt = threading.Event()
        self._lost = threading.Event()
        self._stop_requested = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"pybatch-lease-{execution_id}", daemon=True
        )

    def __repr__(self) -> str:
        return f"LeaseKeeper(execution={self.execution_id}, lease={self.lease.duration})"

    @property
    def lost(self) -> bool:
        """Whether a renewal found that this process no longer owns the execution."""
        return self._lost.is_set()

    @property
    def stop_requested(self) -> bool:
        """Whether a renewal saw a stop request (and observed it)."""
        return self._stop_requested.is_set()

    def start(self) -> None:
        """Start renewing in the background."""
        self._thread.start()

    def halt(self) -> None:
        """Stop renewing (before the runner records how the execution ended)."""
        self._halt.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def renew_now(self) -> None:
        """Renew once in the caller's thread; record a loss or a stop request.

        Raises:
            ExecutionOwnershipLost: the execution was recovered or changed behind the owner.
        """
        if self.lost:
            raise ExecutionOwnershipLost(id=self.execution_id)
        try:
            stop = self.repository.run_in_unit_of_work(self._renew)
        except ExecutionOwnershipLost:
            self._lost.set()
            raise
        if stop:
            self._stop_requested.set()

    def _renew(self, uow: UnitOfWork) -> bool:
        stop = uow.renew_execution_lease(self.execution_id, self.owner, self.lease)
        if stop and not self.stop_requested:
            uow.observe_execution_control(self.execution_id, self.owner, uow.clock.now())
        return stop

    def _run(self) -> None:
        interval = self.lease.renew_interval.total_seconds()
        wait = interval
        while not self._halt.wait(wait):
            try:
                self.renew_now()
            except ExecutionOwnershipLost:
                logger.error(
                    "pybatch: job execution %s is no longer owned by this process; "
                    "its lease lapsed and another process recovered it",
                    self.execution_id,
                )
                return
            except PyBatchError as error:
                # A dropped or killed connection, a lock timeout: try again soon, well
                # before the lease (three intervals) runs out.
                logger.warning(
                    "pybatch: could not renew the lease of job execution %s (%s); retrying",
                    self.execution_id,
                    type(error).__name__,
                )
                wait = interval / RETRY_DIVISOR
                continue
            wait = interval
