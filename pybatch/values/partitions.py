"""Partition values: keys, plan entries, stored partitions and the rule of an assignment."""

from __future__ import annotations

from functools import partial

import attrs

from pybatch import errors as e
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import IdentifierKind, version
from pybatch.values.names import ExitCode
from pybatch.values.state import ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus

MAX_PARTITIONS = 1024  # Entries in one plan.
MAX_PARTITION_WORKERS = 64  # Worker processes of one partitioned step.
MAX_PARTITION_CONTEXT_BYTES = 4096  # Encoded partition context envelope bound.
_KEY_MAX_BYTES = 128

#: Statuses a finished worker hands to its partition.
RESULT_STATUSES = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.STOPPED, BatchStatus.UNKNOWN}
)


def _check_key(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if type(value) is not str:
        raise TypeError("a partition key is a str")
    refuse = partial(e.NameInvalid, kind="partition key")
    if not value:
        raise refuse(rule=e.TextRule.EMPTY)
    if len(value.encode("utf-8", "surrogatepass")) > _KEY_MAX_BYTES:
        raise refuse(rule=e.TextRule.TOO_LONG, max_bytes=_KEY_MAX_BYTES)
    if "\x00" in value:
        raise refuse(rule=e.TextRule.CONTROL_CHARACTER, character_index=value.index("\x00"))
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise e.TextNotUtf8(kind="partition key") from None


@attrs.frozen(order=False)
class PartitionKey:
    """A partition's key within its plan: byte-exact, whitespace kept, 1..128 bytes, no NUL."""

    value: str = attrs.field(validator=_check_key)

    @property
    def sort_key(self) -> bytes:
        """Key byte order (the plan read and aggregation order)."""
        return self.value.encode("utf-8")


def _partition_context(context: ExecutionContext) -> ExecutionContext:
    """Re-check a context against the partition bounds (4 KiB, depth 16)."""
    if not isinstance(context, ExecutionContext):
        raise TypeError("context is an ExecutionContext")
    try:
        return ExecutionContext(
            context.schema, context.schema_version, context.payload, limits=StateLimits.PARTITION
        )
    except (e.StateTooLarge, e.StateTooDeep):
        raise e.PartitionContextTooLarge(max_bytes=MAX_PARTITION_CONTEXT_BYTES) from None


def _as_key(value: PartitionKey | str) -> PartitionKey:
    return value if isinstance(value, PartitionKey) else PartitionKey(value)


@attrs.frozen
class PartitionPlanEntry:
    """One partition to create: its key and the context its worker starts from."""

    key: PartitionKey = attrs.field(converter=_as_key)
    context: ExecutionContext = attrs.field(converter=_partition_context)


@attrs.frozen(kw_only=True)
class StepPartition:
    """One stored partition of a parent step (shape: STARTING exactly when no worker)."""

    id: int = attrs.field(validator=IdentifierKind.STEP_PARTITION.validator)
    step_execution_id: int = attrs.field(validator=IdentifierKind.STEP_EXECUTION.validator)
    worker_step_execution_id: int | None = attrs.field(
        validator=IdentifierKind.STEP_EXECUTION.optional
    )
    key: PartitionKey
    ordinal: int
    status: BatchStatus
    exit_status: ExitCode
    counts: ExecutionCounts
    context: ExecutionContext
    version: int = attrs.field(validator=version)

    def __attrs_post_init__(self) -> None:
        if type(self.ordinal) is not int or not 1 <= self.ordinal <= MAX_PARTITIONS:
            raise ValueError("a partition ordinal is 1..1024")
        if (self.status is BatchStatus.STARTING) != (self.worker_step_execution_id is None):
            raise ValueError("a partition is STARTING exactly when it has no worker")
        if self.context.encoded_bytes > MAX_PARTITION_CONTEXT_BYTES:
            raise e.PartitionContextTooLarge(max_bytes=MAX_PARTITION_CONTEXT_BYTES)
