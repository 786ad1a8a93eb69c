"""What a repository that lacks a capability answers (docs/contract.md, Capability defaults).

`CapabilityDefaults` is the base of every unit of work: each optional operation raises
`UnsupportedCapability` naming its capability, and `UnitOfWork` overrides exactly the
operations pybatch has built. `JobRepository.descriptor()` declares the capabilities
whose operations are all overridden, so the descriptor and the methods cannot disagree.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pybatch.errors import UnsupportedCapability
from pybatch.values.capabilities import RepositoryCapability

__all__ = ["CAPABILITY_OPERATIONS", "CapabilityDefaults", "built_capabilities"]

C = RepositoryCapability

#: The unit-of-work operations each capability consists of (docs/contract.md, Capabilities).
CAPABILITY_OPERATIONS: dict[RepositoryCapability, tuple[str, ...]] = {
    C.OPERATOR_REQUESTS: ("find_operator_request", "append_operator_request"),
    C.STOP_REQUESTS: ("request_execution_stop",),
    C.EXECUTION_OWNERSHIP: ("claim_execution_owner", "observe_execution_control"),
    C.INSTANCE_HOLDS: ("job_instance_hold", "place_instance_hold", "release_instance_hold"),
    C.RETENTION_PURGE: (
        "find_retention_action",
        "append_retention_action",
        "purge_survey",
        "apply_purge",
    ),
    C.STEP_PARTITIONS: (
        "create_step_partition_plan",
        "step_partition_plan",
        "restart_step_partition_plan",
        "assign_step_partition",
        "complete_step_partition",
        "aggregate_step_partitions",
    ),
}


def _unsupported(capability: RepositoryCapability) -> NoReturn:
    raise UnsupportedCapability(capability=capability.value)


class CapabilityDefaults:
    """Base-class answers for optional operations: `UnsupportedCapability{capability}`."""

    def find_operator_request(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Operator requests; this base raises UnsupportedCapability."""
        _unsupported(C.OPERATOR_REQUESTS)

    def append_operator_request(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Operator requests; this base raises UnsupportedCapability."""
        _unsupported(C.OPERATOR_REQUESTS)

    def request_execution_stop(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Stop requests; this base raises UnsupportedCapability."""
        _unsupported(C.STOP_REQUESTS)

    def claim_execution_owner(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Ownership and leases; this base raises UnsupportedCapability."""
        _unsupported(C.EXECUTION_OWNERSHIP)

    def observe_execution_control(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Ownership and leases; this base raises UnsupportedCapability."""
        _unsupported(C.EXECUTION_OWNERSHIP)

    def job_instance_hold(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Holds; this base raises UnsupportedCapability."""
        _unsupported(C.INSTANCE_HOLDS)

    def place_instance_hold(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Holds; this base raises UnsupportedCapability."""
        _unsupported(C.INSTANCE_HOLDS)

    def release_instance_hold(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Holds; this base raises UnsupportedCapability."""
        _unsupported(C.INSTANCE_HOLDS)

    def find_retention_action(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Retention and purge; this base raises UnsupportedCapability."""
        _unsupported(C.RETENTION_PURGE)

    def append_retention_action(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Retention and purge; this base raises UnsupportedCapability."""
        _unsupported(C.RETENTION_PURGE)

    def purge_survey(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Retention and purge; this base raises UnsupportedCapability."""
        _unsupported(C.RETENTION_PURGE)

    def apply_purge(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Retention and purge; this base raises UnsupportedCapability."""
        _unsupported(C.RETENTION_PURGE)

    def create_step_partition_plan(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Partitions; this base raises UnsupportedCapability."""
        _unsupported(C.STEP_PARTITIONS)

    def step_partition_plan(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Partitions; this base raises UnsupportedCapability."""
        _unsupported(C.STEP_PARTITIONS)

    def restart_step_partition_plan(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Partitions; this base raises UnsupportedCapability."""
        _unsupported(C.STEP_PARTITIONS)

    def assign_step_partition(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Partitions; this base raises UnsupportedCapability."""
        _unsupported(C.STEP_PARTITIONS)

    def complete_step_partition(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Partitions; this base raises UnsupportedCapability."""
        _unsupported(C.STEP_PARTITIONS)

    def aggregate_step_partitions(self, *args: Any, **kwargs: Any) -> Any:
        """docs/contract.md, Partitions; this base raises UnsupportedCapability."""
        _unsupported(C.STEP_PARTITIONS)


def built_capabilities(
    unit_of_work_class: type[CapabilityDefaults],
) -> frozenset[RepositoryCapability]:
    """The capabilities whose every operation `unit_of_work_class` overrides."""
    return frozenset(
        capability
        for capability, operations in CAPABILITY_OPERATIONS.items()
        if all(
            getattr(unit_of_work_class, name) is not getattr(CapabilityDefaults, name)
            for name in operations
        )
    )
