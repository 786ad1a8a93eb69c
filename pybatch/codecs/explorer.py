"""Decode explorer rows (queries/explorer.sql) into the projections of values/explorer.py.

Every decoder refuses what it does not expect with `DecodeError` (the explorer reports it
as `Repository(Unavailable)`), including a derived counter total above 2**63-1.
"""

from __future__ import annotations

import decimal

from pybatch.codecs import flow, recovery
from pybatch.codecs._primitives import (
    DecodeError,
    Row,
    decode_aware,
    decode_digest,
    decode_enum,
    decode_int64,
    decode_optional_aware,
    decode_optional_int64,
    decode_text,
    row_columns,
)
from pybatch.codecs.operator import decode_operator_record
from pybatch.values.explorer import (
    DefinitionDescriptor,
    JobExecutionProjection,
    JobInstanceProjection,
    JobNameSummary,
    ParameterDescriptor,
    ProjectionCounts,
    RetentionHold,
    StateEnvelopeDescriptor,
    StepExecutionProjection,
    StepPartitionProjection,
)
from pybatch.values.flow import FlowDecision
from pybatch.values.ids import INT64_MAX, FailureId
from pybatch.values.operator import OperatorRecord
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

#: Columns each decoder reads, in the order queries/explorer.sql selects them.
JOB_NAME_SUMMARY_COLUMNS = (
    "job_name",
    "latest_execution_id",
    "latest_status",
    "latest_updated_at",
)
INSTANCE_PROJECTION_COLUMNS = (
    "id",
    "job_name",
    "instance_key",
    "created_at",
    "hold_actor",
    "hold_reason",
    "hold_placed_at",
    "parameter_kinds",
)
EXECUTION_PROJECTION_COLUMNS = (
    "id",
    "job_instance_id",
    "job_name",
    "attempt",
    "status",
    "exit_code",
    "failure_category",
    "failure_id",
    "created_at",
    "started_at",
    "ended_at",
    "updated_at",
    "stop_requested_at",
    "stop_requested_by",
    "version",
    "definition_revision",
    "manifest_format",
    "manifest_digest",
    "context_format",
    "context_schema",
    "context_schema_version",
    "context_bytes",
    "read_count",
    "processed_count",
    "write_count",
    "filter_count",
    "commit_count",
    "rollback_count",
    "owner_recorded",
)
STEP_PROJECTION_COLUMNS = (
    "id",
    "job_execution_id",
    "step_name",
    "step_logical_id",
    "status",
    "exit_code",
    "read_count",
    "processed_count",
    "write_count",
    "filter_count",
    "commit_count",
    "rollback_count",
    "failure_category",
    "failure_id",
    "version",
    "created_at",
    "started_at",
    "ended_at",
    "updated_at",
    "checkpoint_format",
    "checkpoint_schema",
    "checkpoint_schema_version",
    "checkpoint_bytes",
    "context_format",
    "context_schema",
    "context_schema_version",
    "context_bytes",
)
PARTITION_PROJECTION_COLUMNS = (
    "id",
    "step_execution_id",
    "worker_step_execution_id",
    "partition_key",
    "partition_ordinal",
    "status",
    "exit_code",
    "read_count",
    "processed_count",
    "write_count",
    "filter_count",
    "commit_count",
    "rollback_count",
    "version",
    "context_format",
    "context_schema",
    "context_schema_version",
    "context_bytes",
)

_PARAMETER_KINDS = frozenset({"string", "i64", "u64", "bool"})
_COUNT_COLUMNS = (
    ("read", "read_count"),
    ("processed", "processed_count"),
    ("written", "write_count"),
    ("filtered", "filter_count"),
    ("commits", "commit_count"),
    ("rollbacks", "rollback_count"),
)


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
        **{name: _count(row[column], column=column) for name, column in _COUNT_COLUMNS}
    )


def _failure(row: Row) -> FailureSummary | None:
    category, failure_id = row["failure_category"], row["failure_id"]
    if category is None and failure_id is None:
        return None
    if category is None or failure_id is None:
        raise DecodeError("failure_category")
    return FailureSummary(
        decode_enum(FailureCategory, category, column="failure_category"),
        FailureId(decode_int64(failure_id, column="failure_id", minimum=1)),
    )


def _envelope(row: Row, prefix: str) -> StateEnvelopeDescriptor:
    return StateEnvelopeDescriptor(
        kind=prefix,
        format_version=decode_int64(row[f"{prefix}_format"], column=f"{prefix}_format", minimum=1),
        schema_id=decode_text(row[f"{prefix}_schema"], column=f"{prefix}_schema"),
        schema_version=decode_int64(
            row[f"{prefix}_schema_version"], column=f"{prefix}_schema_version", minimum=1
        ),
        encoded_len=decode_int64(row[f"{prefix}_bytes"], column=f"{prefix}_bytes", minimum=0),
    )


def _status(row: Row, column: str = "status") -> BatchStatus:
    return decode_enum(BatchStatus, row[column], column=column)


def decode_job_name_summary(row: Row) -> JobNameSummary:
    """Decode an explore_job_names row."""
    row = row_columns(row, JOB_NAME_SUMMARY_COLUMNS)
    latest_id = decode_optional_int64(
        row["latest_execution_id"], column="latest_execution_id", minimum=1
    )
    status = row["latest_status"]
    return JobNameSummary(
        job_name=decode_text(row["job_name"], column="job_name"),
        latest_execution_id=latest_id,
        latest_status=None if status is None else _status(row, "latest_status"),
        latest_updated_at=decode_optional_aware(
            row["latest_updated_at"], column="latest_updated_at"
        ),
    )


def decode_instance_projection(row: Row) -> JobInstanceProjection:
    """Decode an explore_instances row; the parameter kinds arrive as [[name, kind], ...]."""
    row = row_columns(row, INSTANCE_PROJECTION_COLUMNS)
    kinds = row["parameter_kinds"]
    if not isinstance(kinds, list):
        raise DecodeError("parameter_kinds")
    parameters = []
    for entry in kinds:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or type(entry[0]) is not str
            or type(entry[1]) is not str
            or entry[1] not in _PARAMETER_KINDS
        ):
            raise DecodeError("parameter_kinds")
        parameters.append(ParameterDescriptor(entry[0], entry[1]))
    actor, reason, placed = row["hold_actor"], row["hold_reason"], row["hold_placed_at"]
    if (actor is None) != (reason is None) or (actor is None) != (placed is None):
        raise DecodeError("hold_actor")
    hold = (
        None
        if actor is None
        else RetentionHold(
            actor=decode_text(actor, column="hold_actor"),
            reason=decode_text(reason, column="hold_reason"),
            placed_at=decode_aware(placed, column="hold_placed_at"),
        )
    )
    return JobInstanceProjection(
        id=decode_int64(row["id"], column="id", minimum=1),
        job_name=decode_text(row["job_name"], column="job_name"),
        instance_key_digest=decode_digest(row["instance_key"], column="instance_key"),
        parameters=tuple(sorted(parameters, key=lambda p: p.name.encode())),
        created_at=decode_aware(row["created_at"], column="created_at"),
        hold=hold,
    )


def decode_execution_projection(row: Row) -> JobExecutionProjection:
    """Decode an explore_executions / explore_execution / explore_unresolved_executions row."""
    row = row_columns(row, EXECUTION_PROJECTION_COLUMNS)
    owner = row["owner_recorded"]
    if type(owner) is not bool:
        raise DecodeError("owner_recorded")
    stop_at = decode_optional_aware(row["stop_requested_at"], column="stop_requested_at")
    stop_by = row["stop_requested_by"]
    if (stop_at is None) != (stop_by is None):
        raise DecodeError("stop_requested_by")
    return JobExecutionProjection(
        id=decode_int64(row["id"], column="id", minimum=1),
        instance_id=decode_int64(row["job_instance_id"], column="job_instance_id", minimum=1),
        job_name=decode_text(row["job_name"], column="job_name"),
        attempt=decode_int64(row["attempt"], column="attempt", minimum=1),
        status=_status(row),
        exit_code=decode_text(row["exit_code"], column="exit_code"),
        counts=_counts(row),
        version=decode_int64(row["version"], column="version", minimum=0),
        created_at=decode_aware(row["created_at"], column="created_at"),
        started_at=decode_optional_aware(row["started_at"], column="started_at"),
        ended_at=decode_optional_aware(row["ended_at"], column="ended_at"),
        updated_at=decode_aware(row["updated_at"], column="updated_at"),
        failure=_failure(row),
        definition=DefinitionDescriptor(
            revision=decode_text(row["definition_revision"], column="definition_revision"),
            manifest_format=decode_int64(
                row["manifest_format"], column="manifest_format", minimum=1
            ),
            manifest_digest=decode_digest(row["manifest_digest"], column="manifest_digest"),
        ),
        context=_envelope(row, "context"),
        stop_requested_at=stop_at,
        stop_requested_by=(
            None if stop_by is None else decode_text(stop_by, column="stop_requested_by")
        ),
        owner_recorded=owner,
    )


def decode_step_projection(row: Row) -> StepExecutionProjection:
    """Decode an explore_step_executions row."""
    row = row_columns(row, STEP_PROJECTION_COLUMNS)
    return StepExecutionProjection(
        id=decode_int64(row["id"], column="id", minimum=1),
        job_execution_id=decode_int64(
            row["job_execution_id"], column="job_execution_id", minimum=1
        ),
        step_name=decode_text(row["step_name"], column="step_name"),
        node_id=decode_text(row["step_logical_id"], column="step_logical_id"),
        status=_status(row),
        exit_code=decode_text(row["exit_code"], column="exit_code"),
        counts=_counts(row),
        version=decode_int64(row["version"], column="version", minimum=0),
        created_at=decode_aware(row["created_at"], column="created_at"),
        started_at=decode_optional_aware(row["started_at"], column="started_at"),
        ended_at=decode_optional_aware(row["ended_at"], column="ended_at"),
        updated_at=decode_aware(row["updated_at"], column="updated_at"),
        failure=_failure(row),
        checkpoint=_envelope(row, "checkpoint"),
        context=_envelope(row, "context"),
    )


def decode_partition_projection(row: Row) -> StepPartitionProjection:
    """Decode an explore_step_partitions row."""
    row = row_columns(row, PARTITION_PROJECTION_COLUMNS)
    return StepPartitionProjection(
        id=decode_int64(row["id"], column="id", minimum=1),
        step_execution_id=decode_int64(
            row["step_execution_id"], column="step_execution_id", minimum=1
        ),
        partition_key=decode_text(row["partition_key"], column="partition_key"),
        ordinal=decode_int64(row["partition_ordinal"], column="partition_ordinal", minimum=1),
        status=_status(row),
        exit_code=decode_text(row["exit_code"], column="exit_code"),
        counts=_counts(row),
        version=decode_int64(row["version"], column="version", minimum=0),
        worker_step_execution_id=decode_optional_int64(
            row["worker_step_execution_id"], column="worker_step_execution_id", minimum=1
        ),
        context=_envelope(row, "context"),
    )


def decode_recovery_decision(row: Row) -> RecoveryDecision:
    """Decode an explore_recovery_decisions row (the recovery codec, one place)."""
    return recovery.decode_recovery_decision(row)


def decode_flow_decision(row: Row) -> FlowDecision:
    """Decode an explore_flow_decisions row (the flow codec, one place)."""
    return flow.decode_flow_decision(row)


def decode_operator_request(row: Row) -> OperatorRecord:
    """Decode an explore_operator_requests row (the operator codec, one place)."""
    return decode_operator_record(row)
