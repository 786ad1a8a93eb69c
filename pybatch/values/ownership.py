"""Execution ownership: owner tokens, leases and the control a runner observes.

A token says who runs an execution; the lease, the only authority, says until when. A runner
renews it while it lives, so an execution is orphaned only once its lease ran out (database clock).
"""

from __future__ import annotations

import datetime as _dt
import secrets

import attrs

from pybatch.values._fields import fixed_bytes
from pybatch.values.records import JobExecution

TOKEN_BYTES = 16


@attrs.frozen
class OwnerToken:
    """16 random bytes naming one runner of one execution."""

    value: bytes = attrs.field(validator=fixed_bytes(TOKEN_BYTES), repr=False)

    @classmethod
    def generate(cls) -> OwnerToken:
        """A fresh token from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(TOKEN_BYTES))

    def __repr__(self) -> str:
        return f"OwnerToken({self.value[:4].hex()}…)"


MIN_LEASE = _dt.timedelta(seconds=1)
MAX_LEASE = _dt.timedelta(hours=1)
DEFAULT_LEASE = _dt.timedelta(seconds=10)


def _lease_bounds(
    instance: object, attribute: attrs.Attribute[_dt.timedelta], value: _dt.timedelta
) -> None:
    if not isinstance(value, _dt.timedelta):
        raise TypeError("a lease duration is a datetime.timedelta")
    if not MIN_LEASE <= value <= MAX_LEASE:
        raise ValueError(f"a lease lasts from {MIN_LEASE} to {MAX_LEASE}, not {value}")


@attrs.frozen
class ExecutionLease:
    """How long ownership stays fresh unrenewed (1 s to 1 h, default 10 s); renewed every third."""

    duration: _dt.timedelta = attrs.field(default=DEFAULT_LEASE, validator=_lease_bounds)

    @property
    def renew_interval(self) -> _dt.timedelta:
        """How often the runner renews (and polls for stop requests)."""
        return self.duration / 3

    @property
    def milliseconds(self) -> int:
        """The duration in whole milliseconds, as the statements take it."""
        return int(self.duration / _dt.timedelta(milliseconds=1))


@attrs.frozen
class LeaseState:
    """An execution's ownership evidence, read under its row lock."""

    execution_id: int
    owner_token: OwnerToken | None
    lease_expires_at: _dt.datetime | None
    lease_expired: bool  # The lease ran out on the database clock (False without a lease).
    #: Milliseconds until the lease runs out on the database clock (None without a lease).
    lease_remaining_ms: int | None
    stop_requested: bool

    @property
    def remaining_seconds(self) -> float:
        """Seconds until the lease runs out (0 when it has, or without a lease)."""
        return (self.lease_remaining_ms or 0) / 1000

    @property
    def has_lease(self) -> bool:
        """False for an execution no owner ever leased."""
        return self.lease_expires_at is not None

    @property
    def owner_gone(self) -> bool:
        """The lease alone decides: the owner is gone when it ran out, or there is none."""
        return not self.has_lease or self.lease_expired


@attrs.frozen
class ExecutionControl:
    """What an owner learns when it observes its execution."""

    execution: JobExecution
    owner_matches: bool
    stop_requested: bool
