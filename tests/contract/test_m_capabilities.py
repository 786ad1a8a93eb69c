"""Group M: capabilities and the repository descriptor (behaviour.md 2.21, 4.18, 8.M)."""

from __future__ import annotations

import attrs
import pytest

from pybatch import ConnectionConfig, JobRepository, supported_schema_version
from pybatch.capability_defaults import (
    CAPABILITY_OPERATIONS,
    CapabilityDefaults,
    built_capabilities,
)
from pybatch.errors import UnsupportedCapability
from pybatch.values.capabilities import RepositoryCapability, RepositoryDescriptor
from tests.support.clock import ManualClock

#: Section 2.21, in declaration order.
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


#: What pybatch has built; grows as capabilities are built, never ahead of them.
BUILT = DISPLAY_NAMES  # all six are built


def test_m3_pybatch_declares_exactly_what_is_built_with_its_schema_version(
    repository: JobRepository, pg_config: ConnectionConfig, clock: ManualClock
) -> None:
    descriptor = repository.descriptor()
    assert descriptor.descriptor_version == RepositoryDescriptor.CURRENT_VERSION == 1
    assert descriptor.schema_version == supported_schema_version() >= 1
    assert [c.value for c in descriptor.ordered_capabilities()] == BUILT
    for capability in RepositoryCapability:
        if capability.value in BUILT:
            descriptor.require(capability)
        else:
            with pytest.raises(UnsupportedCapability) as unsupported:
                descriptor.require(capability)
            assert unsupported.value.capability == capability.value
    assert repository.connection_capacity() == pg_config.pool_size == 4
    with JobRepository.connect(attrs.evolve(pg_config, pool_size=7), clock=clock) as other:
        assert other.connection_capacity() == 7
        assert other.descriptor() == descriptor


def test_m3_undeclared_operations_raise_unsupported_capability(repository: JobRepository) -> None:
    """Every operation of an undeclared capability answers UnsupportedCapability, no SQL."""
    declared = repository.descriptor()
    with repository.begin() as uow:
        for capability, operations in CAPABILITY_OPERATIONS.items():
            for name in operations:
                operation = getattr(uow, name)
                if declared.declares(capability):
                    assert operation.__func__ is not getattr(CapabilityDefaults, name), name
                    continue
                with pytest.raises(UnsupportedCapability) as unsupported:
                    operation(1)
                assert unsupported.value.capability == capability.value, name
        assert uow.is_open  # nothing ran, nothing failed


def test_m3_base_defaults_cover_every_capability() -> None:
    assert set(CAPABILITY_OPERATIONS) == set(RepositoryCapability)
    assert built_capabilities(CapabilityDefaults) == frozenset()
