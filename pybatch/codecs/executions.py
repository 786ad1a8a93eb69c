"""Codecs of job_instance, job_execution and step_execution rows (schema.md 2.5-2.7, 3.8, 3.9).

Each decoder reads exactly the columns listed in its `*_COLUMNS` tuple with `row["col"]`, so a
statement that forgets a column fails loudly (KeyError, a bug) instead of decoding a default.
Anything a column holds that the domain refuses raises `DecodeError(column)`; the unit of
work maps it to `Unavailable` (behaviour.md 6.3).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import TypeVar

from pybatch.codecs._jsonb import to_jsonb
from pybatch.codecs._primitives import (
    DecodeError,
    canonical_json,
    decode_aware,
    decode_digest,
    decode_enum,
    decode_int64,
    decode_json_object,
    decode_optional_aware,
    decode_optional_int64,
    decode_text,
)
from pybatch.errors import (
    ActiveExecutionHasEndTime,
    FailedExecutionMissingFailure,
    FinishedExecutionMissingEndTime,
    InvalidTimestampOrder,
    JsonNotEncodable,
    PyBatchError,
    Unavailable,
)
from pybatch.values.counts import ExecutionCounts, StepFaultCounts
from pybatch.values.ids import (
    DefinitionId,
    FailureId,
    IdentifierKind,
    JobExecutionId,
    JobInstanceId,
    StepExecutionId,
    check_identifier,
)
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.names import ExitCode, JobName, NodeId, ParameterName, StateSchemaId, StepName
from pybatch.values.parameters import (
    PARAMETER_STRING_MAX_BYTES,
    JobInstanceKey,
    JobParameter,
    JobParameters,
    ParameterValue,
    ParameterValueKind,
)
from pybatch.values.records import JobExecution, JobInstance, StepExecution
from pybatch.values.state import (
    STATE_FORMAT_VERSION,
    Checkpoint,
    ExecutionContext,
    StateLimits,
)
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from pybatch.values.timestamps import ExecutionTimestamps

__all__ = [
    "IDENTIFYING_PARAMETERS_MAX_BYTES",
    "JOB_EXECUTION_COLUMNS",
    "JOB_INSTANCE_COLUMNS",
    "STEP_EXECUTION_COLUMNS",
    "Row",
    "decode_checkpoint",
    "decode_context",
    "decode_counts",
    "decode_identifying_parameters",
    "decode_job_execution",
    "decode_job_instance",
    "decode_step_execution",
    "encode_counts",
    "encode_execution_metadata",
    "encode_fault_counts",
    "encode_identifying_parameters",
    "encode_job_instance_key",
    "encode_state",
]

#: A result row as psycopg's dict_row (or pugsql) returns it.
Row = Mapping[str, object]

#: Bound of the canonical identifying-parameter document (schema.md 3.8).
IDENTIFYING_PARAMETERS_MAX_BYTES = 1024 * 1024

#: Columns `decode_job_instance` reads.
JOB_INSTANCE_COLUMNS = ("id", "job_name", "instance_key", "identifying_parameters", "created_at")

#: Columns `decode_job_execution` reads (no counters: rule 14).
JOB_EXECUTION_COLUMNS = (
    "id",
    "job_instance_id",
    "definition_id",
    "upgrade_from_definition_id",
    "restart_of_execution_id",
    "attempt",
    "status",
    "exit_code",
    "failure_category",
    "failure_id",
    "created_at",
    "started_at",
    "ended_at",
    "updated_at",
    "version",
)

_COUNT_COLUMNS = (
    ("read", "read_count"),
    ("processed", "processed_count"),
    ("written", "write_count"),
    ("filtered", "filter_count"),
    ("committed", "commit_count"),
    ("rolled_back", "rollback_count"),
)
_FAULT_COUNT_COLUMNS = (
    ("read_retry", "read_retry_count"),
    ("process_retry", "process_retry_count"),
    ("write_retry", "write_retry_count"),
    ("read_skip", "read_skip_count"),
    ("process_skip", "process_skip_count"),
    ("write_skip", "write_skip_count"),
    ("no_rollback", "no_rollback_count"),
)
_STATE_PREFIXES = ("checkpoint", "context")

#: Columns `decode_step_execution` reads (fault-state columns belong to the fault-state codec).
STEP_EXECUTION_COLUMNS = (
    "id",
    "job_execution_id",
    "step_name",
    "step_logical_id",
    "status",
    "exit_code",
    *(column for _, column in _COUNT_COLUMNS),
    *(
        f"{prefix}_{part}"
        for prefix in _STATE_PREFIXES
        for part in ("format", "schema", "schema_version", "payload")
    ),
    "failure_category",
    "failure_id",
    "created_at",
    "started_at",
    "ended_at",
    "updated_at",
    "version",
    *(column for _, column in _FAULT_COUNT_COLUMNS),
)

_T = TypeVar("_T")
_StateT = TypeVar("_StateT", Checkpoint, ExecutionContext)
_U32_MAX = 2**32 - 1
_I32_MAX = 2**31 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1
_ENVELOPE_MEMBERS = frozenset({"type", "identifying", "value"})
_KINDS_BY_TAG = {kind.json_tag: kind for kind in ParameterValueKind}


def _decode_value(factory: Callable[[str], _T], value: object, *, column: str) -> _T:
    """Build a validated text value from a text column; a refused value is DecodeError."""
    text = decode_text(value, column=column)
    try:
        return factory(text)
    except PyBatchError:
        raise DecodeError(column) from None


def _row(row: Row, columns: tuple[str, ...]) -> dict[str, object]:
    """Read exactly `columns` with `row[column]` (a missing column is a KeyError: a bug)."""
    return {column: row[column] for column in columns}


# --------------------------------------------------------------------------- identifying parameters


def encode_identifying_parameters(key: JobInstanceKey) -> dict[str, object]:
    """The `identifying_parameters` document of a key (schema.md 3.8), as a plain dict.

    Raises:
        Unavailable: the canonical document exceeds 1 MiB.
    """
    document: dict[str, object] = {}
    for name, parameter in key.parameters.items():
        document[name.value] = {
            "type": parameter.kind.json_tag,
            "identifying": True,
            "value": parameter.value.value,
        }
    if len(canonical_json(document)) > IDENTIFYING_PARAMETERS_MAX_BYTES:
        raise Unavailable()
    return document


def decode_identifying_parameters(
    document: object, *, column: str = "identifying_parameters"
) -> JobParameters:
    """Decode an identifying-parameter document, failing closed on every rule of schema.md 3.8.

    Refused: not an object; over 1 MiB canonical; an invalid name; an envelope that is not an
    object with exactly `type`, `identifying` and `value`; `identifying` not `true`; an
    unknown type tag; a value of the wrong JSON type or range (a boolean is never an integer).
    """
    members = decode_json_object(document, column=column)
    try:
        size = len(canonical_json(members))
    except JsonNotEncodable:
        raise DecodeError(column) from None
    if size > IDENTIFYING_PARAMETERS_MAX_BYTES:
        raise DecodeError(column)
    pairs: list[tuple[ParameterName | str, JobParameter]] = []
    for raw_name, envelope in members.items():
        name = _decode_value(ParameterName, raw_name, column=column)
        if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_MEMBERS:
            raise DecodeError(column)
        if envelope["identifying"] is not True:
            raise DecodeError(column)
        tag = envelope["type"]
        kind = _KINDS_BY_TAG.get(tag) if type(tag) is str else None
        if kind is None:
            raise DecodeError(column)
        value = _decode_parameter_value(kind, envelope["value"], column=column)
        pairs.append((name, JobParameter(value, identifying=True)))
    try:
        return JobParameters.from_pairs(pairs)
    except PyBatchError:
        raise DecodeError(column) from None


def _decode_parameter_value(
    kind: ParameterValueKind, raw: object, *, column: str
) -> ParameterValue:
    if kind is ParameterValueKind.STRING:
        if type(raw) is not str:
            raise DecodeError(column)
        try:
            too_long = len(raw.encode("utf-8")) > PARAMETER_STRING_MAX_BYTES
        except UnicodeEncodeError:
            raise DecodeError(column) from None
        if too_long:
            raise DecodeError(column)
        return ParameterValue.string(raw)
    if kind is ParameterValueKind.BOOL:
        if type(raw) is not bool:
            raise DecodeError(column)
        return ParameterValue.boolean(raw)
    if type(raw) is not int:
        raise DecodeError(column)
    if kind is ParameterValueKind.I64:
        if not _I64_MIN <= raw <= _I64_MAX:
            raise DecodeError(column)
        return ParameterValue.i64(raw)
    if not 0 <= raw <= _U64_MAX:
        raise DecodeError(column)
    return ParameterValue.u64(raw)


def encode_job_instance_key(key: JobInstanceKey) -> dict[str, object]:
    """Column values of a new job_instance row: job_name, instance_key, identifying_parameters.

    Raises:
        Unavailable: the canonical parameter document exceeds 1 MiB.
    """
    return {
        "job_name": key.job_name.value,
        "instance_key": key.digest(),
        "identifying_parameters": to_jsonb(encode_identifying_parameters(key)),
    }


# --------------------------------------------------------------------------- job instance


def decode_job_instance(row: Row) -> JobInstance:
    """Decode a job_instance row (columns `JOB_INSTANCE_COLUMNS`).

    The stored `instance_key` must equal the digest recomputed from the job name and the
    identifying parameters, else `DecodeError("instance_key")`.
    """
    values = _row(row, JOB_INSTANCE_COLUMNS)
    instance_id = decode_int64(values["id"], column="id", minimum=1)
    job_name = _decode_value(JobName, values["job_name"], column="job_name")
    instance_key = decode_digest(values["instance_key"], column="instance_key")
    parameters = decode_identifying_parameters(
        values["identifying_parameters"], column="identifying_parameters"
    )
    created_at = decode_aware(values["created_at"], column="created_at")
    if JobInstanceKey(job_name, parameters).digest() != instance_key:
        raise DecodeError("instance_key")
    return JobInstance(
        id=JobInstanceId(instance_id),
        job_name=job_name,
        instance_key=instance_key,
        created_at=created_at,
        parameters=parameters,
    )


# --------------------------------------------------------------------------- execution metadata


def _decode_failure(category: object, failure_id: object) -> FailureSummary | None:
    """Both failure columns present or both absent; a half-present pair is refused."""
    if category is None and failure_id is None:
        return None
    if category is None:
        raise DecodeError("failure_category")
    if failure_id is None:
        raise DecodeError("failure_id")
    decoded = decode_enum(FailureCategory, category, column="failure_category")
    identifier = decode_int64(failure_id, column="failure_id", minimum=1)
    return FailureSummary(decoded, FailureId(identifier))


def _decode_metadata(values: Mapping[str, object], counts: ExecutionCounts) -> ExecutionMetadata:
    status = decode_enum(BatchStatus, values["status"], column="status")
    exit_code = _decode_value(ExitCode, values["exit_code"], column="exit_code")
    failure = _decode_failure(values["failure_category"], values["failure_id"])
    created_at = decode_aware(values["created_at"], column="created_at")
    started_at = decode_optional_aware(values["started_at"], column="started_at")
    ended_at = decode_optional_aware(values["ended_at"], column="ended_at")
    if started_at is not None and started_at < created_at:
        raise DecodeError("started_at")
    if ended_at is not None and ended_at < (started_at if started_at is not None else created_at):
        raise DecodeError("ended_at")
    if status is BatchStatus.UNKNOWN and ended_at is not None:
        raise DecodeError("ended_at")  # storage forbids it; the decoder refuses it too
    try:
        return ExecutionMetadata(
            status=status,
            exit_status=exit_code,
            timestamps=ExecutionTimestamps(created_at, started_at, ended_at),
            counts=counts,
            failure=failure,
        )
    except (ActiveExecutionHasEndTime, FinishedExecutionMissingEndTime, InvalidTimestampOrder):
        raise DecodeError("ended_at") from None
    except FailedExecutionMissingFailure:
        raise DecodeError("failure_category") from None


def _decode_updated_at(
    values: Mapping[str, object], metadata: ExecutionMetadata
) -> datetime.datetime:
    updated_at = decode_aware(values["updated_at"], column="updated_at")
    if updated_at < metadata.timestamps.created_at:
        raise DecodeError("updated_at")
    return updated_at


def decode_job_execution(row: Row) -> JobExecution:
    """Decode a job_execution row (columns `JOB_EXECUTION_COLUMNS`); counters are zero."""
    values = _row(row, JOB_EXECUTION_COLUMNS)
    execution_id = decode_int64(values["id"], column="id", minimum=1)
    instance_id = decode_int64(values["job_instance_id"], column="job_instance_id", minimum=1)
    definition_id = decode_int64(values["definition_id"], column="definition_id", minimum=1)
    upgrade_from = decode_optional_int64(
        values["upgrade_from_definition_id"], column="upgrade_from_definition_id", minimum=1
    )
    restart_of = decode_optional_int64(
        values["restart_of_execution_id"], column="restart_of_execution_id", minimum=1
    )
    attempt = decode_int64(values["attempt"], column="attempt", minimum=1)
    if attempt > _I32_MAX:
        raise DecodeError("attempt")
    metadata = _decode_metadata(values, ExecutionCounts())
    updated_at = _decode_updated_at(values, metadata)
    version = decode_int64(values["version"], column="version", minimum=0)
    return JobExecution(
        id=JobExecutionId(execution_id),
        job_instance_id=JobInstanceId(instance_id),
        attempt=attempt,
        definition_id=DefinitionId(definition_id),
        metadata=metadata,
        version=version,
        updated_at=updated_at,
        restart_of_execution_id=None if restart_of is None else JobExecutionId(restart_of),
        upgrade_from_definition_id=None if upgrade_from is None else DefinitionId(upgrade_from),
    )


# --------------------------------------------------------------------------- step execution


def _decode_state(state_cls: type[_StateT], values: Mapping[str, object], prefix: str) -> _StateT:
    """Rebuild and validate a state envelope from its four columns (limits 1 MiB / depth 64)."""
    format_value = values[f"{prefix}_format"]
    if type(format_value) is not int or format_value != STATE_FORMAT_VERSION:
        raise DecodeError(f"{prefix}_format")
    schema = _decode_value(StateSchemaId, values[f"{prefix}_schema"], column=f"{prefix}_schema")
    schema_version = values[f"{prefix}_schema_version"]
    if type(schema_version) is not int or not 1 <= schema_version <= _U32_MAX:
        raise DecodeError(f"{prefix}_schema_version")
    payload = decode_json_object(values[f"{prefix}_payload"], column=f"{prefix}_payload")
    try:
        return state_cls(schema, schema_version, payload, limits=StateLimits.STEP)
    except PyBatchError:
        raise DecodeError(f"{prefix}_payload") from None


def decode_step_execution(row: Row) -> StepExecution:
    """Decode a step_execution row (columns `STEP_EXECUTION_COLUMNS`)."""
    values = _row(row, STEP_EXECUTION_COLUMNS)
    step_id = decode_int64(values["id"], column="id", minimum=1)
    job_execution_id = decode_int64(
        values["job_execution_id"], column="job_execution_id", minimum=1
    )
    step_name = _decode_value(StepName, values["step_name"], column="step_name")
    logical_id = _decode_value(NodeId, values["step_logical_id"], column="step_logical_id")
    counts = ExecutionCounts(
        **{
            field: decode_int64(values[column], column=column, minimum=0)
            for field, column in _COUNT_COLUMNS
        }
    )
    fault_counts = StepFaultCounts(
        **{
            field: decode_int64(values[column], column=column, minimum=0)
            for field, column in _FAULT_COUNT_COLUMNS
        }
    )
    checkpoint = _decode_state(Checkpoint, values, "checkpoint")
    context = _decode_state(ExecutionContext, values, "context")
    metadata = _decode_metadata(values, counts)
    updated_at = _decode_updated_at(values, metadata)
    version = decode_int64(values["version"], column="version", minimum=0)
    return StepExecution(
        id=StepExecutionId(step_id),
        job_execution_id=JobExecutionId(job_execution_id),
        step_name=step_name,
        logical_id=logical_id,
        metadata=metadata,
        version=version,
        updated_at=updated_at,
        checkpoint=checkpoint,
        context=context,
        fault_counts=fault_counts,
    )


# --------------------------------------------------------------------------- encoders


def encode_state(state: Checkpoint | ExecutionContext) -> dict[str, object]:
    """Column values of a checkpoint (`checkpoint_*`) or an execution context (`context_*`).

    The payload column gets the canonical payload as a jsonb parameter; `format` is always 1.
    """
    prefix = "checkpoint" if isinstance(state, Checkpoint) else "context"
    return {
        f"{prefix}_format": STATE_FORMAT_VERSION,
        f"{prefix}_schema": state.schema.value,
        f"{prefix}_schema_version": state.schema_version,
        f"{prefix}_payload": to_jsonb(state.payload),
    }


def encode_execution_metadata(metadata: ExecutionMetadata) -> dict[str, object]:
    """Column values written by a transition or enrichment (counters: `encode_counts`).

    Keys: status, exit_code, started_at, ended_at, failure_category, failure_id.

    Raises:
        IdentifierOutOfRange: the failure id is above 2^63-1 (unstorable).
    """
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


def encode_counts(counts: ExecutionCounts) -> dict[str, object]:
    """Column values of the six step counters (read_count ... rollback_count)."""
    return {column: getattr(counts, field) for field, column in _COUNT_COLUMNS}


def encode_fault_counts(counts: StepFaultCounts) -> dict[str, object]:
    """Column values of the seven retry/skip/no-rollback counters of a step."""
    return {column: getattr(counts, field) for field, column in _FAULT_COUNT_COLUMNS}


def decode_checkpoint(row: Row) -> Checkpoint:
    """Rebuild a step's checkpoint from its `checkpoint_*` columns (limits 1 MiB / depth 64)."""
    return _decode_state(Checkpoint, row, "checkpoint")


def decode_context(row: Row) -> ExecutionContext:
    """Rebuild a step's execution context from its `context_*` columns."""
    return _decode_state(ExecutionContext, row, "context")


def decode_counts(row: Row) -> ExecutionCounts:
    """The six step counters of a row (read_count ... rollback_count)."""
    return ExecutionCounts(
        **{
            field: decode_int64(row[column], column=column, minimum=0)
            for field, column in _COUNT_COLUMNS
        }
    )
