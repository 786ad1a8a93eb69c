"""Capabilities and the repository descriptor."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from pybatch.errors import UnsupportedCapability
from pybatch.values._fields import Code


class RepositoryCapability(Code):
    """Optional repository features, in their stable declaration order."""

    OPERATOR_REQUESTS = "operator requests"
    STOP_REQUESTS = "durable stop requests"
    EXECUTION_OWNERSHIP = "execution ownership evidence"
    INSTANCE_HOLDS = "instance holds"
    RETENTION_PURGE = "retention purge"
    STEP_PARTITIONS = "durable step partitions"


def _capability_set(values: Iterable[RepositoryCapability]) -> frozenset[RepositoryCapability]:
    """The declared capabilities as a frozen set (any iterable of capabilities is accepted)."""
    return frozenset(values)


@attrs.frozen
class RepositoryDescriptor:
    """What a repository declares: descriptor shape version, schema version, capabilities."""

    CURRENT_VERSION = 1

    descriptor_version: int
    schema_version: int
    capabilities: frozenset[RepositoryCapability] = attrs.field(converter=_capability_set)

    @classmethod
    def default(cls) -> RepositoryDescriptor:
        """The conservative claim of an adapter that declares nothing."""
        return cls(cls.CURRENT_VERSION, 0, frozenset())

    def declares(self, capability: RepositoryCapability) -> bool:
        """Whether `capability` is declared."""
        return capability in self.capabilities

    def require(self, capability: RepositoryCapability) -> None:
        """Raise UnsupportedCapability unless `capability` is declared; never downgrade."""
        if capability not in self.capabilities:
            raise UnsupportedCapability(capability=capability.value)

    def ordered_capabilities(self) -> list[RepositoryCapability]:
        """Declared capabilities in the stable declaration order."""
        return [c for c in RepositoryCapability if c in self.capabilities]
