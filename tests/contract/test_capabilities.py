"""Every capability of the unit of work is built, and the pool is as configured."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import JobExecutionNotFound, JobInstanceNotFound, Unavailable
from pybatch.values.names import OperationId
from pybatch.values.operator import OperatorAction
from pybatch.values.retention import RetentionAction
from tests.support.clock import ManualClock


def test_the_pool_opens_no_more_connections_than_its_configured_size(
    pg_config: ConnectionConfig, clock: ManualClock
) -> None:
    config = attrs.evolve(pg_config, pool_size=1, acquire_timeout=timedelta(milliseconds=200))
    with JobRepository.connect(config, clock=clock) as repository, repository.begin():
        with pytest.raises(Unavailable):
            repository.begin()  # the one connection is held by the open unit of work


def test_every_capability_answers_in_a_unit_of_work(
    repository: JobRepository,
) -> None:
    """Each capability is a live set of operations of the unit of work.

    A read of each runs real SQL against an empty repository: nothing to report, or the
    typed not-found error, and the transaction stays usable.

    Scenario M3.
    """
    with repository.begin() as uow:
        assert uow.operator_requests.find(OperatorAction.STOP, OperationId("op-1")) is None
        assert uow.stop_requests is uow.stop_requests  # bound once per unit of work
        with pytest.raises(JobExecutionNotFound):
            uow.ownership.lock(1)
        with pytest.raises(JobInstanceNotFound):
            uow.holds.get(1)
        assert uow.retention.find_action(RetentionAction.APPLY_PURGE, OperationId("op-1")) is None
        assert uow.partitions.count_open(1) == 0
        assert uow.is_open
        assert uow.executions.get(1) is None
