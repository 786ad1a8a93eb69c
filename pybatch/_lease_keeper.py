"""Keeps a lease fresh from a background thread (docs/contract.md, Ownership and leases).

A runner may spend minutes inside one chunk; its lease must not lapse meanwhile. A renewal
that finds the ownership gone records it; the runner raises at its next boundary and touches
nothing. `LeaseKeeper`'s renewal doubles as the stop-request poll (observing it: STOPPING).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from pybatch import _telemetry
from pybatch._unit_of_work import UnitOfWork
from pybatch.errors import ExecutionOwnershipLost, PartitionOwnershipLost, PyBatchError
from pybatch.values.ownership import ExecutionLease, OwnerToken

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository

logger = logging.getLogger("pybatch.etl")

#: After a failed renewal, try again after this fraction of the regular interval.
RETRY_DIVISOR = 4


class _Keeper:
    """Renews one lease until halted; records a lost ownership (subclasses say whose)."""

    #: The error a renewal raises when the ownership is gone.
    lost_error: type[ExecutionOwnershipLost] | type[PartitionOwnershipLost]
    #: Builds the typed error naming the lost ownership.
    lost_ownership: Callable[[], PyBatchError]
    #: One renewal in the caller's thread; raises `lost_error` when the ownership is gone.
    _renew_once: Callable[[], None]
    #: The attributes of this keeper's renewal counters (the job's name, when known).
    telemetry_attributes: Mapping[str, str] = {}

    def __init__(
        self,
        repository: JobRepository,
        owner: OwnerToken,
        lease: ExecutionLease,
        description: str,
    ) -> None:
        self.repository = repository
        self.owner = owner
        self.lease = lease
        self._description = description
        self._halt = threading.Event()
        self._lost = threading.Event()
        self._renewing = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._description}, lease={self.lease.duration})"

    @property
    def lost(self) -> bool:
        """Whether a renewal found that this process no longer owns the leased work."""
        return self._lost.is_set()

    def start(self) -> None:
        """Renew in a thread of its own from when the first renewal is due (a short run: never)."""
        _renewal_threads().defer(self, time.monotonic() + self.lease.renew_interval.total_seconds())

    def halt(self) -> None:
        """Stop renewing before the runner records its end: no renewal is in flight after."""
        self._halt.set()
        _renewal_threads().cancel(self)
        with self._renewing:
            pass

    def raise_if_lost(self) -> None:
        """Renew once after a refused write: raise only `lost_error` (nothing else proves loss)."""
        try:
            self.renew_now()
        except self.lost_error:
            raise
        except PyBatchError:
            return

    def renew_now(self) -> None:
        """Renew once in the caller's thread; a `lost_error` is recorded and raised."""
        if self.lost:
            raise self.lost_ownership()
        try:
            self._renew_once()
        except self.lost_error:
            self._lost.set()
            _telemetry.lease_lost(self.telemetry_attributes)
            raise
        _telemetry.lease_renewed(self.telemetry_attributes)

    def _run(self) -> None:
        interval = self.lease.renew_interval.total_seconds()
        wait = 0.0  # started when the first renewal is due
        while not self._halt.wait(wait):
            wait = interval
            try:
                with self._renewing:
                    if self._halt.is_set():
                        return
                    self.renew_now()
            except self.lost_error as lost:
                logger.error("pybatch: %s", lost)
                return
            except Exception as error:
                # A dropped or killed connection, a lock timeout, anything unforeseen: try
                # again soon, well before the lease (three intervals) runs out.
                logger.warning(
                    "pybatch: could not renew the lease of %s (%s); retrying",
                    self._description,
                    type(error).__name__,
                )
                wait = interval / RETRY_DIVISOR


class LeaseKeeper(_Keeper):
    """Renews one execution's lease until stopped; reports loss of ownership and stop requests."""

    lost_error = ExecutionOwnershipLost

    def __init__(
        self,
        repository: JobRepository,
        execution_id: int,
        owner: OwnerToken,
        lease: ExecutionLease,
        job_name: str | None = None,
    ) -> None:
        self.execution_id = execution_id
        if job_name is not None:
            self.telemetry_attributes = {"pybatch.job.name": job_name}
        self._stop_requested = threading.Event()
        self.lost_ownership = partial(ExecutionOwnershipLost, id=execution_id)
        super().__init__(repository, owner, lease, f"job execution {execution_id}")

    @property
    def stop_requested(self) -> bool:
        """Whether a renewal saw a stop request (and observed it)."""
        return self._stop_requested.is_set()

    def _renew_once(self) -> None:
        if self.repository.run_in_unit_of_work(self._renew):
            self._stop_requested.set()

    def _renew(self, uow: UnitOfWork) -> bool:
        stop = uow.ownership.renew_lease(self.execution_id, self.owner, self.lease)
        if stop and not self.stop_requested:
            uow.ownership.observe_control(self.execution_id, self.owner, uow.clock.now())
        return stop


class PartitionLeaseKeeper(_Keeper):
    """Renews a partition worker's lease on the partition it claimed, until halted."""

    lost_error = PartitionOwnershipLost

    def __init__(
        self,
        repository: JobRepository,
        partition_id: int,
        worker_id: int,
        owner: OwnerToken,
        lease: ExecutionLease,
    ) -> None:
        self.partition_id = partition_id
        self.worker_id = worker_id
        self.lost_ownership = partial(
            PartitionOwnershipLost, partition_id=partition_id, worker=worker_id
        )
        description = f"partition {partition_id} (worker step {worker_id})"
        super().__init__(repository, owner, lease, description)

    def _renew_once(self) -> None:
        self.repository.run_in_unit_of_work(
            lambda uow: uow.ownership.renew_partition_lease(
                self.partition_id, self.worker_id, self.owner, self.lease
            )
        )


class _RenewalThreads:
    """Starts each keeper's renewal loop once its first renewal is due; one thread waits for all."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._due: dict[_Keeper, float] = {}
        self._changed = threading.Condition()
        self._wake_at = math.inf
        threading.Thread(target=self._start_due, name="pybatch-lease", daemon=True).start()

    def defer(self, keeper: _Keeper, due: float) -> None:
        with self._changed:
            self._due[keeper] = due
            if due < self._wake_at:  # else the thread wakes earlier and sees it anyway
                self._changed.notify()

    def cancel(self, keeper: _Keeper) -> None:
        with self._changed:
            self._due.pop(keeper, None)

    def _start_due(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for keeper in [k for k, due in self._due.items() if due <= now]:
                    del self._due[keeper]
                    threading.Thread(target=keeper._run, name="pybatch-lease", daemon=True).start()
                self._wake_at = min(self._due.values(), default=math.inf)
                self._changed.wait(None if self._wake_at == math.inf else self._wake_at - now)


_renewals: _RenewalThreads | None = None


def _renewal_threads() -> _RenewalThreads:
    """This process's renewal threads (a forked worker makes its own: threads do not fork)."""
    global _renewals
    if _renewals is None or _renewals.pid != os.getpid():
        _renewals = _RenewalThreads()
    return _renewals
