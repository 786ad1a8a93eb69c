"""The repository clock: every instant pybatch stamps comes from here (behaviour.md 2.7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """A thread-safe source of aware UTC instants; tests inject a controlled one."""

    def now(self) -> datetime:
        """The current instant, timezone-aware, in UTC."""
        ...


class SystemClock:
    """Wall-clock time, microsecond precision."""

    def now(self) -> datetime:
        """The current wall-clock instant in UTC."""
        return datetime.now(UTC)
