"""A controlled clock for tests: microsecond-precision aware UTC instants."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class ManualClock:
    """Returns the instant it was set to; `advance` moves it forward.

    Simulated: new connections do not measure its distance from the server's clock,
    so a test can stamp any instant it likes (the database clock still decides every cutoff).
    """

    simulated = True

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta = timedelta(seconds=1)) -> datetime:
        with self._lock:
            self._now += delta
            return self._now

    def set(self, instant: datetime) -> None:
        with self._lock:
            self._now = instant


class OffsetClock:
    """This host's wall clock moved by `offset`: a real client whose clock is wrong.

    Not simulated, so each new connection's clock-skew check measures it; `offset` may change
    after connect to model a clock that jumps while the process runs.
    """

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset
