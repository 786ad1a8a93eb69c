"""Aware UTC instants: any offset is normalised to UTC, naive ones refused; microseconds kept."""

from __future__ import annotations

import datetime as _dt

import attrs

from pybatch.errors import InvalidTimestampOrder, NaiveTimestamp, TimestampOutOfRange


def aware_utc(value: _dt.datetime) -> _dt.datetime:
    """The instant in UTC: NaiveTimestamp without an offset, TimestampOutOfRange past 1..9999."""
    if not isinstance(value, _dt.datetime):
        raise TypeError("expected a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise NaiveTimestamp()
    try:
        return value.astimezone(_dt.UTC)
    except OverflowError:
        raise TimestampOutOfRange() from None


def optional_aware_utc(value: _dt.datetime | None) -> _dt.datetime | None:
    """Like `aware_utc`, passing None through (for optional instants)."""
    return None if value is None else aware_utc(value)


@attrs.frozen
class ExecutionTimestamps:
    """Creation, start and end instants of an execution, in order."""

    created_at: _dt.datetime = attrs.field(converter=aware_utc)
    started_at: _dt.datetime | None = attrs.field(default=None, converter=optional_aware_utc)
    ended_at: _dt.datetime | None = attrs.field(default=None, converter=optional_aware_utc)

    def __attrs_post_init__(self) -> None:
        if self.started_at is not None and self.started_at < self.created_at:
            raise InvalidTimestampOrder()
        lower = self.started_at if self.started_at is not None else self.created_at
        if self.ended_at is not None and self.ended_at < lower:
            raise InvalidTimestampOrder()
