"""The repository clock, and the rule for which instants the database clock decides.

The client clock stamps what a caller records (`created_at`...), so tests control it. Every
instant that *decides* (lease expiry, retention and unresolved cutoffs, staleness) is the
server's `clock_timestamp()` in the acting statement; a recovery's end time never goes below
stored times. Client stamps are trusted only within `max_clock_skew`, measured on every new
pooled connection (ClockSkewExceeded).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Thread-safe aware UTC instants; a `simulated = True` test double skips the skew check."""

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
    """How far the client is ahead (+) or behind (-) the server beyond the round trip window."""
    if server < before:
        return before - server
    if server > after:
        return after - server
    return timedelta(0)
