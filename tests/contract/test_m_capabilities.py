"""Group M: capabilities and the repository descriptor (behaviour.md 2.21, 4.18, 8.M)."""

from __future__ import annotations

import attrs
import pytest

from pybatch import ConnectionConfig, JobRepository, supported_schema_version
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


def test_m3_pybatch_declares_all_six_with_its_schema_version(
    repository: JobRepository, pg_config: ConnectionConfig, clock: ManualClock
) -> None:
    descriptor = repository.descriptor()
    assert descriptor.descriptor_version == RepositoryDescriptor.CURRENT_VERSION == 1
    assert descriptor.schema_version == supported_schema_version() >= 1
    assert [c.value for c in descriptor.ordered_capabilities()] == DISPLAY_NAMES
    for capability in RepositoryCapability:
        assert descriptor.declares(capability)
        descriptor.require(capability)
    assert repository.connection_capacity() == pg_config.pool_size == 4
    with JobRepository.connect(attrs.evolve(pg_config, pool_size=7), clock=clock) as other:
        assert other.connection_capacity() == 7
        assert other.descriptor() == descriptor
