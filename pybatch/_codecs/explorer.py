"""Decode explorer rows into projections; anything unexpected (a total over 2**63-1) is refused."""

from __future__ import annotations

import decimal
from typing import Any

from pybatch._codecs import _primitives as p
from pybatch._codecs.lifecycle import FAILURE_COLUMNS, INSTANT_COLUMNS, decode_failure
from pybatch._codecs.partitions import PARTITION_HEAD_COLUMNS
from pybatch._codecs.steps import COUNT_COLUMNS, STEP_HEAD_COLUMNS
from pybatch.errors import PyBatchError
from pybatch.values import explorer as v
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
    *(*FAILURE_COLUMNS, *INSTANT_COLUMNS),
    *("stop_requested_at", "stop_requested_by", "version", "definition_revision"),
    *("manifest_format", "manifest_digest", *_envelope_columns("context"), *COUNT_COLUMNS),
    *("owner_host", "identifying_parameters", "owner_recorded"),
)
STEP_PROJECTION_COLUMNS = (
    *(*STEP_HEAD_COLUMNS, *COUNT_COLUMNS, *FAILURE_COLUMNS, "version", *INSTANT_COLUMNS),
    *(*_envelope_columns("checkpoint"), *_envelope_columns("context")),
)
PARTITION_PROJECTION_COLUMNS = (
    *(*PARTITION_HEAD_COLUMNS, *COUNT_COLUMNS, "version", *_envelope_columns("context")),
)

_KINDS = {kind.json_tag: kind for kind in ParameterValueKind}


def _count(value: object, *, column: str) -> int:
    """A stored counter or a derived (numeric) total, 0..2**63-1."""
    if isinstance(value, decimal.Decimal):
        if not (value.is_finite() and 0 <= value <= INT64_MAX and value % 1 == 0):
            raise p.DecodeError(column)
        return int(value)
    return p.decode_int64(value, column=column, minimum=0)


def _envelope(row: p.Row, prefix: str) -> v.StateEnvelopeDescriptor:
    return v.StateEnvelopeDescriptor(
        kind=prefix,
        format_version=p.int64_at(row, f"{prefix}_format"),
        schema_id=p.text_at(row, f"{prefix}_schema"),
        schema_version=p.int64_at(row, f"{prefix}_schema_version"),
        encoded_len=p.int64_at(row, f"{prefix}_bytes", 0),
    )


def decode_job_name_summary(row: p.Row) -> v.JobNameSummary:
    """Decode an explore_job_names row."""
    row = p.row_columns(row, JOB_NAME_SUMMARY_COLUMNS)
    return v.JobNameSummary(
        job_name=p.text_at(row, "job_name"),
        latest_execution_id=p.optional_int64_at(row, "latest_execution_id"),
        latest_status=p.optional_enum_at(BatchStatus, row, "latest_status"),
        latest_updated_at=p.optional_aware_at(row, "latest_updated_at"),
    )


def decode_latest_attempt(row: p.Row) -> v.LatestAttempt:
    """Decode an explore_latest_attempt row."""
    row = p.row_columns(row, LATEST_ATTEMPT_COLUMNS)
    return v.LatestAttempt(
        execution_id=p.int64_at(row, "execution_id"),
        attempt=p.int64_at(row, "attempt"),
        status=p.enum_at(BatchStatus, row, "status"),
    )


def decode_running_execution(row: p.Row) -> v.RunningExecution:
    """Decode an explore_running_executions row (the step columns are NULL before a step)."""
    row = p.row_columns(row, RUNNING_EXECUTION_COLUMNS)
    return v.RunningExecution(
        id=p.int64_at(row, "id"),
        job_name=p.text_at(row, "job_name"),
        attempt=p.int64_at(row, "attempt"),
        status=p.enum_at(BatchStatus, row, "status"),
        started_at=p.optional_aware_at(row, "started_at"),
        lease_expires_at=p.aware_at(row, "lease_expires_at"),
        stop_requested_at=p.optional_aware_at(row, "stop_requested_at"),
        owner_host=_optional_text(row, "owner_host"),
        step_name=_optional_text(row, "step_name"),
        step_started_at=p.optional_aware_at(row, "step_started_at"),
        read=p.optional_int64_at(row, "read_count", 0) or 0,
        written=p.optional_int64_at(row, "write_count", 0) or 0,
        commits=p.optional_int64_at(row, "commit_count", 0) or 0,
        observed_at=p.aware_at(row, "observed_at"),
    )


def decode_instance_projection(row: p.Row) -> v.JobInstanceProjection:
    """Decode an explore_instances row."""
    row = p.row_columns(row, INSTANCE_PROJECTION_COLUMNS)
    actor, reason, placed = row["hold_actor"], row["hold_reason"], row["hold_placed_at"]
    if (actor is None) != (reason is None) or (actor is None) != (placed is None):
        raise p.DecodeError("hold_actor")
    hold = None
    if actor is not None:
        actor, reason = p.text_at(row, "hold_actor"), p.text_at(row, "hold_reason")
        hold = v.RetentionHold(actor, reason, p.aware_at(row, "hold_placed_at"))
    return v.JobInstanceProjection(
        id=p.int64_at(row, "id"),
        job_name=p.text_at(row, "job_name"),
        instance_key_digest=p.digest_at(row, "instance_key"),
        parameters=_parameters(row),
        created_at=p.aware_at(row, "created_at"),
        hold=hold,
        tombstone=_tombstone(row),
    )


def _parameters(row: p.Row) -> tuple[v.ParameterDescriptor, ...]:
    """The identifying parameters in name (UTF-8 byte) order; each value checked by its kind.

    Lighter than decode_identifying_parameters (no digest-input rules: pages only display).
    """
    document = row["identifying_parameters"]
    if type(document) is not dict:
        raise p.DecodeError("identifying_parameters")
    parameters = []
    for name in sorted(document, key=str.encode):
        envelope = document[name]
        try:
            value = ParameterValue(_KINDS[envelope["type"]], envelope["value"]).value
        except (KeyError, TypeError, PyBatchError):
            raise p.DecodeError("identifying_parameters") from None
        parameters.append(v.ParameterDescriptor(name, envelope["type"], value))
    return tuple(parameters)


def _optional_text(row: p.Row, column: str) -> str | None:
    return None if row[column] is None else p.text_at(row, column)


def _tombstone(row: p.Row) -> v.InstanceTombstone | None:
    """What a purge left of the instance's history, or None while it is live."""
    if row["final_status"] is None and row["purged_at"] is None:
        return None  # job_instance_tombstone_shape: both or neither; a half is DecodeError below
    final_status = p.enum_at(BatchStatus, row, "final_status")
    purged_at = p.aware_at(row, "purged_at")
    return v.InstanceTombstone(final_status, purged_at, p.int64_at(row, "last_attempt", 0))


def _lifecycle(row: p.Row) -> dict[str, Any]:
    """The status, exit code, counts and version every execution, step and partition carries."""
    return {
        "status": p.enum_at(BatchStatus, row, "status"),
        "exit_code": p.text_at(row, "exit_code"),
        # ProjectionCounts' fields are in COUNT_COLUMNS' order.
        "counts": v.ProjectionCounts(*(_count(row[c], column=c) for c in COUNT_COLUMNS)),
        "version": p.int64_at(row, "version", 0),
    }


def _instants(row: p.Row) -> dict[str, Any]:
    """The four instants and the failure of an execution or step, in their JSON order."""
    return {
        "created_at": p.aware_at(row, "created_at"),
        "started_at": p.optional_aware_at(row, "started_at"),
        "ended_at": p.optional_aware_at(row, "ended_at"),
        "updated_at": p.aware_at(row, "updated_at"),
        "failure": decode_failure(row["failure_category"], row["failure_id"]),
    }


def decode_execution_projection(row: p.Row) -> v.JobExecutionProjection:
    """Decode an explore_executions / explore_execution / explore_unresolved_executions row."""
    row = p.row_columns(row, EXECUTION_PROJECTION_COLUMNS)
    stop_at = p.optional_aware_at(row, "stop_requested_at")
    if (stop_at is None) != (row["stop_requested_by"] is None):
        raise p.DecodeError("stop_requested_by")
    return v.JobExecutionProjection(
        id=p.int64_at(row, "id"),
        instance_id=p.int64_at(row, "job_instance_id"),
        job_name=p.text_at(row, "job_name"),
        parameters=_parameters(row),
        attempt=p.int64_at(row, "attempt"),
        **_lifecycle(row),
        **_instants(row),
        definition=v.DefinitionDescriptor(
            revision=p.text_at(row, "definition_revision"),
            manifest_format=p.int64_at(row, "manifest_format"),
            manifest_digest=p.digest_at(row, "manifest_digest"),
        ),
        context=_envelope(row, "context"),
        stop_requested_at=stop_at,
        stop_requested_by=None if stop_at is None else p.text_at(row, "stop_requested_by"),
        owner_recorded=p.bool_at(row, "owner_recorded"),
        owner_host=_optional_text(row, "owner_host"),
    )


def decode_step_projection(row: p.Row) -> v.StepExecutionProjection:
    """Decode an explore_step_executions row."""
    row = p.row_columns(row, STEP_PROJECTION_COLUMNS)
    return v.StepExecutionProjection(
        id=p.int64_at(row, "id"),
        job_execution_id=p.int64_at(row, "job_execution_id"),
        step_name=p.text_at(row, "step_name"),
        node_id=p.text_at(row, "step_logical_id"),
        **_lifecycle(row),
        **_instants(row),
        checkpoint=_envelope(row, "checkpoint"),
        context=_envelope(row, "context"),
    )


def decode_partition_projection(row: p.Row) -> v.StepPartitionProjection:
    """Decode an explore_step_partitions row."""
    row = p.row_columns(row, PARTITION_PROJECTION_COLUMNS)
    return v.StepPartitionProjection(
        id=p.int64_at(row, "id"),
        step_execution_id=p.int64_at(row, "step_execution_id"),
        partition_key=p.text_at(row, "partition_key"),
        ordinal=p.int64_at(row, "partition_ordinal"),
        **_lifecycle(row),
        worker_step_execution_id=p.optional_int64_at(row, "worker_step_execution_id"),
        context=_envelope(row, "context"),
    )


STEP_SKIP_COLUMNS = (
    *("id", "step_execution_id", "step_name", "item_position", "item_key", "sqlstate"),
    *("constraint_name", "table_name", "column_name", "message", "created_at"),
)
SKIP_COUNT_COLUMNS = ("step_execution_id", "skips")


def decode_step_skip(row: p.Row) -> v.StepSkip:
    """Decode an explore_step_skips row."""
    row = p.row_columns(row, STEP_SKIP_COLUMNS)
    return v.StepSkip(
        id=p.int64_at(row, "id"),
        step_execution_id=p.int64_at(row, "step_execution_id"),
        step_name=p.text_at(row, "step_name"),
        item_position=p.int64_at(row, "item_position", 0),
        item_key=p.text_at(row, "item_key"),
        sqlstate=p.text_at(row, "sqlstate"),
        constraint=_optional_text(row, "constraint_name"),
        table=_optional_text(row, "table_name"),
        column=_optional_text(row, "column_name"),
        message=p.text_at(row, "message"),
        created_at=p.aware_at(row, "created_at"),
    )


def decode_skip_count(row: p.Row) -> tuple[int, int]:
    """Decode an explore_step_skip_counts row: (the step's id, the items it skipped)."""
    row = p.row_columns(row, SKIP_COUNT_COLUMNS)
    return p.int64_at(row, "step_execution_id"), p.int64_at(row, "skips", 0)


FAILURE_REASON_COLUMNS = (
    *("step_execution_id", "error_class", "message", "sqlstate", "constraint_name"),
    *("table_name", "column_name"),
)


def decode_failure_reason(row: p.Row) -> tuple[int | None, FailureReason]:
    """Decode an explore_failure_reasons row: (the step's id, or None for the execution)."""
    row = p.row_columns(row, FAILURE_REASON_COLUMNS)
    try:
        reason = FailureReason(
            error_class=p.text_at(row, "error_class"),
            message=p.text_at(row, "message"),
            sqlstate=_optional_text(row, "sqlstate"),
            constraint=_optional_text(row, "constraint_name"),
            table=_optional_text(row, "table_name"),
            column=_optional_text(row, "column_name"),
        )
    except ValueError:
        raise p.DecodeError("failure_error_class") from None
    return p.optional_int64_at(row, "step_execution_id"), reason
