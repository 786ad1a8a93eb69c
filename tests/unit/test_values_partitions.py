"""Partition values: the domain rules, without a database."""

from __future__ import annotations

import pytest

from pybatch.errors import (
    NameInvalid,
    PartitionContextTooLarge,
    TextRule,
)
from pybatch.values.counts import ExecutionCounts
from pybatch.values.names import ExitCode
from pybatch.values.partitions import (
    PartitionKey,
    PartitionPlanEntry,
    StepPartition,
)
from pybatch.values.state import ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus
from tests.support.text_rules import broken_rule

S = BatchStatus


def partition(key: str, status: BatchStatus, worker: int | None, **counts: int) -> StepPartition:
    return StepPartition(
        id=1,
        step_execution_id=1,
        worker_step_execution_id=worker,
        key=PartitionKey(key),
        ordinal=1,
        status=status,
        exit_status=ExitCode(f"EXIT_{key.upper()}"),
        counts=ExecutionCounts(**counts),
        context=ExecutionContext.empty(),
        version=0,
    )


def test_keys_keep_whitespace_and_refuse_empty_long_or_nul() -> None:
    assert PartitionKey("a ") != PartitionKey("a")
    rules = (("", TextRule.EMPTY), ("x" * 129, TextRule.TOO_LONG))
    for bad, rule in (*rules, ("a\x00b", TextRule.CONTROL_CHARACTER)):
        with broken_rule(NameInvalid, rule):
            PartitionKey(bad)
    longest = PartitionKey("é" * 64)  # 128 bytes, the bound
    assert longest.value == "é" * 64 and len(longest.value.encode()) == 128
    with broken_rule(NameInvalid, TextRule.TOO_LONG):
        PartitionKey("é" * 64 + "x")


def test_entry_context_bounded_by_bytes_and_depth() -> None:
    schema = ExecutionContext.empty().schema
    too_big = ExecutionContext(schema, 1, {"x": "y" * 4100}, limits=StateLimits.STEP)
    with pytest.raises(PartitionContextTooLarge):
        PartitionPlanEntry("k", too_big)
    deep: dict[str, object] = {}
    node = deep
    for _ in range(20):
        child: dict[str, object] = {}
        node["n"] = child
        node = child
    too_deep = ExecutionContext(schema, 1, deep, limits=StateLimits(max_depth=64))
    with pytest.raises(PartitionContextTooLarge):
        PartitionPlanEntry("k", too_deep)


def test_shape_starting_exactly_without_worker() -> None:
    with pytest.raises(ValueError):
        partition("a", S.STARTING, 7)
    with pytest.raises(ValueError):
        partition("a", S.STARTED, None)
