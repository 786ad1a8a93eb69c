"""Group M: capabilities and the repository descriptor (M1-M3)."""

from __future__ import annotations

import attrs
import pytest

from pybatch import ConnectionConfig, JobRepository, UnitOfWork, supported_schema_version
from pybatch.capability_defaults import (
    CAPABILITY_OPERATIONS,
    CapabilityDefaults,
    built_capabilities,
)
from pybatch.errors import UnsupportedCapability
from pybatch.values.capabilities import RepositoryCapability, RepositoryDescriptor
from pybatch.values.names import OperationId
from pybatch.values.operator import OperatorAction
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


def test_m1_default_descriptor_declares_nothing() -> None:
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


def test_m1_require_never_downgrades_a_partial_declaration() -> None:
    partial = RepositoryDescriptor(1, 1, frozenset({RepositoryCapability.INSTANCE_HOLDS}))
    partial.require(RepositoryCapability.INSTANCE_HOLDS)
    for capability in set(RepositoryCapability) - {RepositoryCapability.INSTANCE_HOLDS}:
        with pytest.raises(UnsupportedCapability):
            partial.require(capability)


def test_m2_capability_display_names() -> None:
    assert [c.value for c in RepositoryCapability] == DISPLAY_NAMES
    assert [str(c) for c in RepositoryCapability] == DISPLAY_NAMES


#: What pybatch has built: all six capabilities.
BUILT = DISPLAY_NAMES


def test_m3_pybatch_declares_exactly_what_is_built_with_its_schema_version(
    repository: JobRepository, pg_config: ConnectionConfig, clock: ManualClock
) -> None:
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


def test_m3_every_operation_of_a_built_capability_is_pybatch_s_own() -> None:
    for capability, operations in CAPABILITY_OPERATIONS.items():
        for name in operations:
            assert getattr(UnitOfWork, name) is not getattr(CapabilityDefaults, name), (
                capability,
                name,
            )


@pytest.mark.parametrize("missing", list(RepositoryCapability), ids=str)
def test_m3_a_unit_of_work_without_a_capability_answers_unsupported_capability(
    repository: JobRepository, missing: RepositoryCapability
) -> None:
    """A unit of work that keeps the base answers of one capability (a partial adapter).

    Every operation of that capability raises UnsupportedCapability naming it, before any
    SQL (the unit of work stays usable), and the capability is not declared; the others are.
    """
    partial = type(
        f"Without{missing.name.title().replace('_', '')}",
        (UnitOfWork,),
        {name: getattr(CapabilityDefaults, name) for name in CAPABILITY_OPERATIONS[missing]},
    )
    assert built_capabilities(partial) == frozenset(RepositoryCapability) - {missing}
    declared = RepositoryDescriptor(1, 1, built_capabilities(partial))
    with pytest.raises(UnsupportedCapability) as undeclared:
        declared.require(missing)
    assert undeclared.value.capability == missing.value
    uow = partial(repository.transactions.lease(), repository.statements, repository.clock)
    with uow:
        for name in CAPABILITY_OPERATIONS[missing]:
            with pytest.raises(UnsupportedCapability) as unsupported:
                getattr(uow, name)(1)
            assert unsupported.value.capability == missing.value, name
            assert str(unsupported.value) == f"the adapter does not support {missing.value}"
        assert uow.is_open  # nothing ran, nothing failed
        assert uow.get_job_execution(1) is None  # and the transaction is still usable


def test_m3_the_base_defaults_of_operator_requests_are_unsupported_capability() -> None:
    base = CapabilityDefaults()
    for name in ("find_operator_request", "append_operator_request"):
        with pytest.raises(UnsupportedCapability) as unsupported:
            getattr(base, name)(OperatorAction.STOP, OperationId("op-1"))
        assert unsupported.value.capability == "operator requests"


def test_m3_base_defaults_cover_every_capability() -> None:
    assert set(CAPABILITY_OPERATIONS) == set(RepositoryCapability)
    assert built_capabilities(CapabilityDefaults) == frozenset()
