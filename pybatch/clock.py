"""The repository clock, and the rule for which instants the database clock decides.

The client clock stamps what a caller records (`created_at`, `transitioned_at`, a stop's
`requested_at`...), so tests can control those values. Every instant that *decides*
something comes from the database server's `clock_timestamp()` instead, in the statement
that acts on it: lease expiry, the retention cutoff, the unresolved-execution cutoff and the
stale threshold. A decision that writes an end time (recovery) never goes below the times
already stored, so a run stamped by a client whose clock ran ahead can still be recovered.
Client stamps are trusted only within `ConnectionConfig.max_clock_skew` of the server:
every new pooled connection measures the distance and a host beyond it is refused
(ClockSkewExceeded). See docs/etl-guide.md, "Clocks".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "SystemClock", "is_simulated", "measured_skew"]


class Clock(Protocol):
    """A thread-safe source of aware UTC instants; tests inject a controlled one.

    A clock whose `simulated` attribute is True (a test double that sets the time it
    returns on purpose) is exempt from the clock-skew check on new connections; every other
    clock, the SystemClock above all, must be within the configured skew of the server.
    """

    def now(self) -> datetime:
        """The current instant, timezone-aware, in UTC."""
        ...


class SystemClock:
    """Wall-clock time, microsecond precision."""

    def now(self) -> datetime:
        """The current wall-clock instant in UTC."""
        return datetime.now(UTC)


def is_simulated(clock: Clock) -> bool:
    """Whether `clock` declares itself a test double (`simulated = True`)."""
    return getattr(clock, "simulated", False) is True


def measured_skew(before: datetime, server: datetime, after: datetime) -> timedelta:
    """How far the client clock is from the server's, net of the round trip.

    `before` and `after` are client readings around the one that returned `server`; the
    server read happened somewhere between them, so only the distance beyond that window
    counts. Positive: the client is ahead; negative: behind; zero: within the round trip.
    """
    if server < before:
        return before - server
    if server > after:
        return after - server
    return timedelta(0)
