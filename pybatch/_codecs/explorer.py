"""Decode explorer rows into projections; anything unexpected (a total over 2**63-1) is refused."""

from __future__ import annotations

import decimal
from typing import Any

from pybatch._codecs import executions, flow
from pybatch._codecs._primitives import (
    DecodeError,
    Row,
    aware_at,
    bool_at,
    decode_int64,
    digest_at,
    enum_at,
    int64_at,
    optional_aware_at,
    optional_enum_at,
    optional_int64_at,
    row_columns,
    text_at,
)
from pybatch._codecs.lifecycle import FAILURE_COLUMNS, INSTANT_COLUMNS, decode_failure
from pybatch._codecs.operator import decode_operator_record
from pybatch._codecs.partitions import PARTITION_HEAD_COLUMNS
from pybatch._codecs.steps import COUNT_COLUMNS, STEP_HEAD_COLUMNS
from pybatch.errors import PyBatchError
from pybatch.values.explorer import (
    DefinitionDescriptor,
    InstanceTombstone,
    JobExecutionProjection,
    JobInstanceProjection,
    JobNameSummary,
    LatestAttempt,
    ParameterDescriptor,
    ProjectionCounts,
    RetentionHold,
    RunningExecution,
    StateEnvelopeDescriptor,
    StepExecutionProjection,
    StepPartitionProjection,
)
from pybatch.values.ids import INT64_MAX
from pybatch.values.parameters import ParameterValue, ParameterValueKind
from pybatch.values.status import BatchStatus, FailureReason


def _envelope_columns(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}_{part}" for part in ("format", "schema", "schema_version", "bytes"))


#: Columns each decoder reads, in the order queries/explorer.sql selects them.
JOB_NAME_SUMMARY_COLUMNS = ("job_name", "latest_execution_id", "latest_status", "latest_updated_at")
LATEST_ATTEMPT_COLUMNS = ("execution_id", "attempt", "status")
RUNNING_EXECUTION_COLUMNS = (
    *("id", "job_name", "attempt", "status", "started_at", "lease_expires_at"),
    *("stop_requested_at", "owner_host", "step_name", "step_started_at", "read_count"),
    *("write_count", "commit_count", "observed_at"),
)
INSTANCE_PROJECTION_COLUMNS = (
    *("id", "job_name", "instance_key", "created_at", "hold_actor", "hold_reason"),
    *("hold_placed_at", "last_attempt", "final_status", "purged_at", "identifying_parameters"),
)
EXECUTION_PROJECTION_COLUMNS = (
    *("id", "job_instance_id", "job_name", "attempt", "status", "exit_code"),
    *FAILURE_COLUMNS,
    *INSTANT_COLUMNS,
    *("stop_requested_at", "stop_requested_by", "version", "definition_revision"),
    *("manifest_format", "manifest_digest", *_envelope_columns("context"), *COUNT_COLUMNS),
    *("owner_host", "identifying_parameters", "owner_recorded"),
)
STEP_PROJECTION_COLUMNS = (
    *STEP_HEAD_COLUMNS,
    *COUNT_COLUMNS,
    *FAILURE_COLUMNS,
    "version",
    *INSTANT_COLUMNS,
    *_envelope_columns("checkpoint"),
    *_envelope_columns("context"),
)
PARTITION_PROJECTION_COLUMNS = (
    *PARTITION_HEAD_COLUMNS,
    *COUNT_COLUMNS,
    "version",
    *_envelope_columns("context"),
)

_KINDS = {kind.json_tag: kind for kind in ParameterValueKind}
_COUNT_FIELDS = ("read", "processed", "written", "filtered", "commits", "rollbacks")


def _count(value: object, *, column: str) -> int:
    """A stored counter or a derived (numeric) total, 0..2**63-1."""
    if isinstance(value, decimal.Decimal):
        if not value.is_finite() or value != value.to_integral_value():
            raise DecodeError(column)
        if not 0 <= value <= INT64_MAX:
            raise DecodeError(column)
        return int(value)
    return decode_int64(value, column=column, minimum=0)


def _counts(row: Row) -> ProjectionCounts:
    return ProjectionCounts(
        **{
            name: _count(row[column], column=column)
            for name, column in zip(_COUNT_FIELDS, COUNT_COLUMNS, strict=True)
        }
    )


def _envelope(row: Row, prefix: str) -> StateEnvelopeDescriptor:
    return StateEnvelopeDescriptor(
        kind=prefix,
        format_version=int64_at(row, f"{prefix}_format"),
        schema_id=text_at(row, f"{prefix}_schema"),
        schema_version=int64_at(row, f"{prefix}_schema_version"),
        encoded_len=int64_at(row, f"{prefix}_bytes", 0),
    )


def decode_job_name_summary(row: Row) -> JobNameSummary:
    """Decode an explore_job_names row."""
    row = row_columns(row, JOB_NAME_SUMMARY_COLUMNS)
    return JobNameSummary(
        job_name=text_at(row, "job_name"),
        latest_execution_id=optional_int64_at(row, "latest_execution_id"),
        latest_status=optional_enum_at(BatchStatus, row, "latest_status"),
        latest_updated_at=optional_aware_at(row, "latest_updated_at"),
    )


def decode_latest_attempt(row: Row) -> LatestAttempt:
    """Decode an explore_latest_attempt row."""
    row = row_columns(row, LATEST_ATTEMPT_COLUMNS)
    return LatestAttempt(
        execution_id=int64_at(row, "execution_id"),
        attempt=int64_at(row, "attempt"),
        status=enum_at(BatchStatus, row, "status"),
    )


def decode_running_execution(row: Row) -> RunningExecution:
    """Decode an explore_running_executions row (the step columns are NULL before a step)."""
    row = row_columns(row, RUNNING_EXECUTION_COLUMNS)
    return RunningExecution(
        id=int64_at(row, "id"),
        job_name=text_at(row, "job_name"),
        attempt=int64_at(row, "attempt"),
        status=enum_at(BatchStatus, row, "status"),
        started_at=optional_aware_at(row, "started_at"),
        lease_expires_at=aware_at(row, "lease_expires_at"),
        stop_requested_at=optional_aware_at(row, "stop_requested_at"),
        owner_host=_optional_text(row, "owner_host"),
        step_name=_optional_text(row, "step_name"),
        step_started_at=optional_aware_at(row, "step_started_at"),
        read=optional_int64_at(row, "read_count", 0) or 0,
        written=optional_int64_at(row, "write_count", 0) or 0,
        commits=optional_int64_at(row, "commit_count", 0) or 0,
        observed_at=aware_at(row, "observed_at"),
    )


def decode_instance_projection(row: Row) -> JobInstanceProjection:
    """Decode an explore_instances row."""
    row = row_columns(row, INSTANCE_PROJECTION_COLUMNS)
    actor, reason, placed = row["hold_actor"], row["hold_reason"], row["hold_placed_at"]
    if (actor is None) != (reason is None) or (actor is None) != (placed is None):
        raise DecodeError("hold_actor")
    hold = None
    if actor is not None:
        actor, reason = text_at(row, "hold_actor"), text_at(row, "hold_reason")
        hold = RetentionHold(actor, reason, aware_at(row, "hold_placed_at"))
    return JobInstanceProjection(
        id=int64_at(row, "id"),
        job_name=text_at(row, "job_name"),
        instance_key_digest=digest_at(row, "instance_key"),
        parameters=_parameters(row),
        created_at=aware_at(row, "created_at"),
        hold=hold,
        tombstone=_tombstone(row),
    )


def _parameters(row: Row) -> tuple[ParameterDescriptor, ...]:
    """The identifying parameters in name (UTF-8 byte) order; each value checked by its kind.

    Lighter than decode_identifying_parameters (no digest-input rules: pages only display).
    """
    document = row["identifying_parameters"]
    if type(document) is not dict:
        raise DecodeError("identifying_parameters")
    parameters = []
    for name in sorted(document, key=str.encode):
        envelope = document[name]
        try:
            value = ParameterValue(_KINDS[envelope["type"]], envelope["value"]).value
        except (KeyError, TypeError, PyBatchError):
            raise DecodeError("identifying_parameters") from None
        parameters.append(ParameterDescriptor(name, envelope["type"], value))
    return tuple(parameters)


def _optional_text(row: Row, column: str) -> str | None:
    return None if row[column] is None else text_at(row, column)


def _tombstone(row: Row) -> InstanceTombstone | None:
    """What a purge left of the instance's history, or None while it is live."""
    final_status = optional_enum_at(BatchStatus, row, "final_status")
    purged_at = optional_aware_at(row, "purged_at")
    if (final_status is None) != (purged_at is None):  # job_instance_tombstone_shape
        raise DecodeError("final_status")
    if final_status is None or purged_at is None:
        return None
    last_attempt = int64_at(row, "last_attempt", minimum=0)
    return InstanceTombstone(final_status, purged_at, last_attempt)


def _lifecycle(row: Row) -> dict[str, Any]:
    """The status, exit code, counts and version every execution, step and partition carries."""
    return {
        "status": enum_at(BatchStatus, row, "status"),
        "exit_code": text_at(row, "exit_code"),
        "counts": _counts(row),
        "version": int64_at(row, "version", 0),
    }


def _instants(row: Row) -> dict[str, Any]:
    """The four instants and the failure of an execution or step, in their JSON order."""
    return {
        "created_at": aware_at(row, "created_at"),
        "started_at": optional_aware_at(row, "started_at"),
        "ended_at": optional_aware_at(row, "ended_at"),
        "updated_at": aware_at(row, "updated_at"),
        "failure": decode_failure(row["failure_category"], row["failure_id"]),
    }


def decode_execution_projection(row: Row) -> JobExecutionProjection:
    """Decode an explore_executions / explore_execution / explore_unresolved_executions row."""
    row = row_columns(row, EXECUTION_PROJECTION_COLUMNS)
    stop_at = optional_aware_at(row, "stop_requested_at")
    if (stop_at is None) != (row["stop_requested_by"] is None):
        raise DecodeError("stop_requested_by")
    return JobExecutionProjection(
        id=int64_at(row, "id"),
        instance_id=int64_at(row, "job_instance_id"),
        job_name=text_at(row, "job_name"),
        parameters=_parameters(row),
        attempt=int64_at(row, "attempt"),
        **_lifecycle(row),
        **_instants(row),
        definition=DefinitionDescriptor(
            revision=text_at(row, "definition_revision"),
            manifest_format=int64_at(row, "manifest_format"),
            manifest_digest=digest_at(row, "manifest_digest"),
        ),
        context=_envelope(row, "context"),
        stop_requested_at=stop_at,
        stop_requested_by=None if stop_at is None else text_at(row, "stop_requested_by"),
        owner_recorded=bool_at(row, "owner_recorded"),
        owner_host=_optional_text(row, "owner_host"),
    )


def decode_step_projection(row: Row) -> StepExecutionProjection:
    """Decode an explore_step_executions row."""
    row = row_columns(row, STEP_PROJECTION_COLUMNS)
    return StepExecutionProjection(
        id=int64_at(row, "id"),
        job_execution_id=int64_at(row, "job_execution_id"),
        step_name=text_at(row, "step_name"),
        node_id=text_at(row, "step_logical_id"),
        **_lifecycle(row),
        **_instants(row),
        checkpoint=_envelope(row, "checkpoint"),
        context=_envelope(row, "context"),
    )


def decode_partition_projection(row: Row) -> StepPartitionProjection:
    """Decode an explore_step_partitions row."""
    row = row_columns(row, PARTITION_PROJECTION_COLUMNS)
    return StepPartitionProjection(
        id=int64_at(row, "id"),
        step_execution_id=int64_at(row, "step_execution_id"),
        partition_key=text_at(row, "partition_key"),
        ordinal=int64_at(row, "partition_ordinal"),
        **_lifecycle(row),
        worker_step_execution_id=optional_int64_at(row, "worker_step_execution_id"),
        context=_envelope(row, "context"),
    )


#: The explorer's recovery, flow and operator listings decode with their own tables' codecs.
decode_recovery_decision = executions.decode_recovery_decision
decode_flow_decision = flow.decode_flow_decision
decode_operator_request = decode_operator_record


FAILURE_REASON_COLUMNS = (
    *("step_execution_id", "error_class", "message", "sqlstate", "constraint_name"),
    *("table_name", "column_name"),
)


def decode_failure_reason(row: Row) -> tuple[int | None, FailureReason]:
    """Decode an explore_failure_reasons row: (the step's id, or None for the execution)."""
    row = row_columns(row, FAILURE_REASON_COLUMNS)
    try:
        reason = FailureReason(
            error_class=text_at(row, "error_class"),
            message=text_at(row, "message"),
            sqlstate=_optional_text(row, "sqlstate"),
            constraint=_optional_text(row, "constraint_name"),
            table=_optional_text(row, "table_name"),
            column=_optional_text(row, "column_name"),
        )
    except ValueError:
        raise DecodeError("failure_error_class") from None
    return optional_int64_at(row, "step_execution_id"), reason
