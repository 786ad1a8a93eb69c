"""Capabilities and the repository descriptor (M1-M3)."""

from __future__ import annotations

import attrs
import pytest

from pybatch import ConnectionConfig, JobRepository, supported_schema_version
from pybatch.errors import JobExecutionNotFound, JobInstanceNotFound, UnsupportedCapability
from pybatch.values.capabilities import RepositoryCapability, RepositoryDescriptor
from pybatch.values.names import OperationId
from pybatch.values.operator import OperatorAction
from pybatch.values.retention import RetentionAction
from tests.support.clock import ManualClock

#: The capabilities' display names, in their stable declaration order.
DISPLAY_NAMES = [
    "operator requests",
    "durable stop requests",
    "execution ownership evidence",
    "instance holds",
    "retention purge",
    "durable step partitions",
]


def test_the_default_descriptor_declares_nothing() -> None:
    """Scenario M1."""
    default = RepositoryDescriptor.default()
    assert (default.descriptor_version, default.schema_version) == (1, 0)
    assert RepositoryDescriptor.CURRENT_VERSION == 1
    assert default.capabilities == frozenset()
    assert default.ordered_capabilities() == []
    for capability in RepositoryCapability:
        assert not default.declares(capability)
        with pytest.raises(UnsupportedCapability) as unsupported:
            default.require(capability)
        assert unsupported.value.capability == capability.value
        assert str(unsupported.value) == f"the adapter does not support {capability.value}"


def test_require_never_downgrades_a_partial_declaration() -> None:
    """Scenario M1."""
    partial = RepositoryDescriptor(1, 1, frozenset({RepositoryCapability.INSTANCE_HOLDS}))
    partial.require(RepositoryCapability.INSTANCE_HOLDS)
    for capability in set(RepositoryCapability) - {RepositoryCapability.INSTANCE_HOLDS}:
        with pytest.raises(UnsupportedCapability):
            partial.require(capability)


def test_capabilities_have_their_display_names_in_order() -> None:
    """Scenario M2."""
    assert [c.value for c in RepositoryCapability] == DISPLAY_NAMES
    assert [str(c) for c in RepositoryCapability] == DISPLAY_NAMES


#: What pybatch has built: all six capabilities.
BUILT = DISPLAY_NAMES


def test_pybatch_declares_exactly_what_is_built_with_its_schema_version(
    repository: JobRepository, pg_config: ConnectionConfig, clock: ManualClock
) -> None:
    """Scenario M3."""
    descriptor = repository.descriptor()
    assert descriptor.descriptor_version == RepositoryDescriptor.CURRENT_VERSION == 1
    assert descriptor.schema_version == supported_schema_version() >= 1
    assert [c.value for c in descriptor.ordered_capabilities()] == BUILT
    assert descriptor.capabilities == frozenset(RepositoryCapability)
    for capability in RepositoryCapability:
        descriptor.require(capability)  # raises for none
    assert repository.connection_capacity() == pg_config.pool_size == 4
    with JobRepository.connect(attrs.evolve(pg_config, pool_size=7), clock=clock) as other:
        assert other.connection_capacity() == 7
        assert other.descriptor() == descriptor


def test_every_declared_capability_answers_in_a_unit_of_work(
    repository: JobRepository,
) -> None:
    """Each capability pybatch declares is a live set of operations of the unit of work.

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
        assert uow.partitions.count_by_status(1) == {}
        assert uow.is_open
        assert uow.executions.get(1) is None
