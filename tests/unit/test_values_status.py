"""BatchStatus, FailureCategory, FailureSummary, counts and timestamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from pybatch import errors
from pybatch.values.counts import ExecutionCounts, StepFaultCounts
from pybatch.values.ids import INT64_MAX, aware_utc
from pybatch.values.lifecycle import ExecutionTimestamps
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)

STATUS_TABLE = {
    # code: (active, finished, unresolved)
    "STARTING": (True, False, True),
    "STARTED": (True, False, True),
    "STOPPING": (True, False, True),
    "STOPPED": (False, True, False),
    "FAILED": (False, True, False),
    "COMPLETED": (False, True, False),
    "ABANDONED": (False, True, False),
    "UNKNOWN": (False, False, True),
}


def test_batch_status_codes_and_properties() -> None:
    assert [status.value for status in BatchStatus] == list(STATUS_TABLE)
    for status in BatchStatus:
        flags = (status.is_active, status.is_finished, status.is_unresolved)
        assert flags == STATUS_TABLE[status.value]
        assert str(status) == status.value


def test_failure_categories() -> None:
    assert len(FailureCategory) == 15
    for category in FailureCategory:
        assert str(category) == category.value


def test_failure_summary() -> None:
    summary = FailureSummary(FailureCategory.TIMEOUT, 7)  # type: ignore[arg-type]
    assert summary.failure_id == 7
    with pytest.raises(errors.ZeroIdentifier) as error:
        FailureSummary(FailureCategory.TIMEOUT, 0)  # type: ignore[arg-type]
    assert error.value.kind == "failure"
    with pytest.raises(TypeError):
        FailureSummary(FailureCategory.TIMEOUT, True)  # type: ignore[arg-type]
    # Domain range 1..2^64-1; the storage bound is checked when binding.
    assert FailureSummary(FailureCategory.TIMEOUT, 2**64 - 1).failure_id == 2**64 - 1  # type: ignore[arg-type]


def test_counts_bounds_and_sums() -> None:
    with pytest.raises(errors.CounterOutOfRange) as error:
        ExecutionCounts(written=-1)
    assert error.value.name == "written"
    with pytest.raises(errors.CounterOutOfRange):
        ExecutionCounts(read=INT64_MAX + 1)
    with pytest.raises(errors.CountExhausted):
        ExecutionCounts(rolled_back=INT64_MAX).with_terminal_rollback()
    assert ExecutionCounts().with_terminal_rollback().rolled_back == 1
    with pytest.raises(TypeError):
        ExecutionCounts(read=True)
    assert StepFaultCounts(no_rollback=3).no_rollback == 3
    with pytest.raises(errors.CounterOutOfRange):
        StepFaultCounts(read_retry=-1)


def test_naive_instants_are_refused_and_offsets_normalise_to_utc_keeping_microseconds() -> None:
    """Scenario A21."""
    with pytest.raises(errors.NaiveTimestamp):
        aware_utc(datetime(2026, 1, 1))
    plus_two = datetime(2026, 1, 2, 5, 4, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    normalised = aware_utc(plus_two)
    assert normalised == T0
    assert normalised.tzinfo is UTC
    assert normalised.microsecond == 123456
    with pytest.raises(errors.NaiveTimestamp):
        ExecutionTimestamps(datetime(2026, 1, 1))
    stamps = ExecutionTimestamps(plus_two)
    assert stamps.created_at.tzinfo is UTC


def test_execution_timestamp_order() -> None:
    later = T0 + timedelta(microseconds=1)
    assert ExecutionTimestamps(T0, T0, T0).ended_at == T0
    assert ExecutionTimestamps(T0, None, later).ended_at == later
    with pytest.raises(errors.InvalidTimestampOrder):
        ExecutionTimestamps(later, T0)
    with pytest.raises(errors.InvalidTimestampOrder):
        ExecutionTimestamps(T0, later, T0)
    with pytest.raises(errors.InvalidTimestampOrder):
        ExecutionTimestamps(later, None, T0)
