"""The lease alone says whether an owner lives: gone when it ran out, or when there is none."""

from __future__ import annotations

import datetime as dt

import pytest

from pybatch._repository.ownership import StartedPartition
from pybatch.values.ownership import LeaseState, OwnerToken

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def lease(*, expires: dt.datetime | None, expired: bool) -> LeaseState:
    return LeaseState(
        execution_id=7,
        owner_token=None if expires is None else OwnerToken.generate(),
        lease_expires_at=expires,
        lease_expired=expired,
        lease_remaining_ms=None if expires is None else (0 if expired else 5000),
        stop_requested=False,
    )


@pytest.mark.parametrize(
    ("expires", "expired", "gone"),
    [(AT, False, False), (AT, True, True), (None, False, True)],
    ids=["fresh lease", "lease ran out", "never leased"],
)
def test_an_execution_owner_is_gone_only_when_its_lease_ran_out_or_never_existed(
    expires: dt.datetime | None, expired: bool, gone: bool
) -> None:
    assert lease(expires=expires, expired=expired).owner_gone is gone


@pytest.mark.parametrize(
    ("leased", "expired", "gone"),
    [(True, False, False), (True, True, True), (False, False, True)],
    ids=["fresh lease", "lease ran out", "never leased"],
)
def test_a_partition_worker_is_gone_only_when_its_lease_ran_out_or_never_existed(
    leased: bool, expired: bool, gone: bool
) -> None:
    worker = StartedPartition(
        id=1, key="a", worker_step_execution_id=3, version=1, leased=leased, lease_expired=expired
    )
    assert worker.worker_gone is gone
