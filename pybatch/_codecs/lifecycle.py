"""Lifecycle columns shared by job and step executions: status, exit code, failure, timestamps."""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from pybatch import errors as e
from pybatch._codecs import _primitives as p
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import FailureId, IdentifierKind, check_identifier
from pybatch.values.lifecycle import ExecutionMetadata, ExecutionTimestamps
from pybatch.values.names import ExitCode
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

#: The failure pair and the four instants of a job or step row, in their table order.
FAILURE_COLUMNS = ("failure_category", "failure_id")
INSTANT_COLUMNS = ("created_at", "started_at", "ended_at", "updated_at")


def decode_failure(category: object, failure_id: object) -> FailureSummary | None:
    """Both failure columns present or both absent; a half-present pair is refused."""
    if category is None and failure_id is None:
        return None
    if category is None or failure_id is None:
        raise p.DecodeError("failure_category" if category is None else "failure_id")
    decoded = p.decode_enum(FailureCategory, category, column="failure_category")
    identifier = p.decode_int64(failure_id, column="failure_id", minimum=1)
    return FailureSummary(decoded, FailureId(identifier))


def decode_metadata(values: Mapping[str, object], counts: ExecutionCounts) -> ExecutionMetadata:
    """Decode the lifecycle columns of a job or step row around its (already decoded) counts."""
    status = p.enum_at(BatchStatus, values, "status")
    exit_code = p.text_value_at(ExitCode, values, "exit_code")
    failure = decode_failure(values["failure_category"], values["failure_id"])
    created_at = p.aware_at(values, "created_at")
    started_at = p.optional_aware_at(values, "started_at")
    ended_at = p.optional_aware_at(values, "ended_at")
    if started_at is not None and started_at < created_at:
        raise p.DecodeError("started_at")
    lower = created_at if started_at is None else started_at
    if ended_at is not None and (ended_at < lower or status is BatchStatus.UNKNOWN):
        raise p.DecodeError("ended_at")  # UNKNOWN has no end time: storage forbids it too
    try:
        return ExecutionMetadata(
            status=status,
            exit_status=exit_code,
            timestamps=ExecutionTimestamps(created_at, started_at, ended_at),
            counts=counts,
            failure=failure,
        )
    except (e.ActiveExecutionHasEndTime, e.FinishedExecutionMissingEndTime):
        raise p.DecodeError("ended_at") from None
    except e.FailedExecutionMissingFailure:
        raise p.DecodeError("failure_category") from None


def decode_updated_at(
    values: Mapping[str, object], metadata: ExecutionMetadata
) -> datetime.datetime:
    """Decode `updated_at`, which can never precede `created_at`."""
    updated_at = p.aware_at(values, "updated_at")
    if updated_at < metadata.timestamps.created_at:
        raise p.DecodeError("updated_at")
    return updated_at


def encode_execution_metadata(metadata: ExecutionMetadata) -> dict[str, object]:
    """Column values of a transition; a failure id above 2^63-1 is refused here."""
    failure = metadata.failure
    return {
        "status": metadata.status.value,
        "exit_code": metadata.exit_status.value,
        "started_at": metadata.timestamps.started_at,
        "ended_at": metadata.timestamps.ended_at,
        "failure_category": None if failure is None else failure.category.value,
        "failure_id": (
            None
            if failure is None
            else check_identifier(IdentifierKind.FAILURE, failure.failure_id)
        ),
    }
