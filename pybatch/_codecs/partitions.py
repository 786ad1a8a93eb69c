"""Codec of step_partition rows: a bad key, ordinal, shape, context or checksum is corrupt state."""

from __future__ import annotations

from collections.abc import Sequence

from pybatch._codecs import _primitives as p
from pybatch._codecs import steps
from pybatch.errors import PartitionStateCorrupt, PyBatchError
from pybatch.values._canonical import sha256
from pybatch.values.names import ExitCode
from pybatch.values.partitions import PartitionKey, PartitionPlanEntry, StepPartition
from pybatch.values.state import ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus

#: The leading columns of a step_partition row, in table order.
PARTITION_HEAD_COLUMNS = tuple(
    "id step_execution_id worker_step_execution_id partition_key partition_ordinal status"
    " exit_code".split()
)
STEP_PARTITION_COLUMNS = (
    *(*PARTITION_HEAD_COLUMNS, *steps.COUNT_COLUMNS),
    *(*steps.CONTEXT_COLUMNS, "context_checksum", "version"),
)


def context_checksum(context: ExecutionContext) -> bytes:
    """SHA-256 of the canonical partition context envelope (docs/tables.md 3.6)."""
    return sha256(context.encode())


def _context(row: p.Row) -> ExecutionContext:
    context = steps.decode_state(ExecutionContext, row, "context", StateLimits.PARTITION)
    if context_checksum(context) != p.digest_at(row, "context_checksum"):
        raise p.DecodeError("context_checksum")
    return context


def decode_step_partition(row: p.Row) -> StepPartition:
    """Decode one step_partition row (PartitionStateCorrupt for any refused column)."""
    try:
        return StepPartition(
            id=p.int64_at(row, "id"),
            step_execution_id=p.int64_at(row, "step_execution_id"),
            worker_step_execution_id=p.optional_int64_at(row, "worker_step_execution_id"),
            key=PartitionKey(p.text_at(row, "partition_key")),
            ordinal=p.int64_at(row, "partition_ordinal"),
            status=p.enum_at(BatchStatus, row, "status"),
            exit_status=ExitCode(p.text_at(row, "exit_code")),
            counts=steps.decode_counts(row),
            context=_context(row),
            version=p.int64_at(row, "version", 0),
        )
    except (p.DecodeError, PyBatchError, ValueError, TypeError):
        raise PartitionStateCorrupt() from None


#: The partition columns a claim sets to constants: not returned (53 columns cost both sides).
_CLAIM_SETS = {"status": "STARTED", "exit_code": "UNKNOWN", **dict.fromkeys(steps.COUNT_COLUMNS, 0)}
_KNOWN = {*_CLAIM_SETS, "step_execution_id", "worker_step_execution_id"}  # constants, or ids
_CLAIMED_OWN = [column for column in STEP_PARTITION_COLUMNS if column not in _KNOWN]
#: A claim's row: the worker step's columns, then the partition's others (prefixed `p_`).
CLAIMED_PARTITION_COLUMNS = (*steps.STEP_EXECUTION_COLUMNS, *(f"p_{c}" for c in _CLAIMED_OWN))


def decode_claimed_partition(row: p.Row, parent_id: int) -> StepPartition:
    """The partition of a claim_step_partition row (its columns prefixed `p_`) of `parent_id`."""
    own = {column: row[f"p_{column}"] for column in _CLAIMED_OWN}
    ids = {"step_execution_id": parent_id, "worker_step_execution_id": row["id"]}
    return decode_step_partition(own | ids | _CLAIM_SETS)


def encode_plan_entries(entries: Sequence[PartitionPlanEntry]) -> dict[str, object]:
    """The parallel arrays of queries/partitions.sql insert_step_partitions, in entry order."""
    return {
        "partition_keys": [entry.key.value for entry in entries],
        "partition_ordinals": list(range(1, len(entries) + 1)),
        "context_schemas": [entry.context.schema.value for entry in entries],
        "context_schema_versions": [entry.context.schema_version for entry in entries],
        "context_payloads": [entry.context.payload_json().decode() for entry in entries],
        "context_checksums": [context_checksum(entry.context) for entry in entries],
    }
