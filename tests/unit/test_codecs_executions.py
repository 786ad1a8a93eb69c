"""Row codecs of instances, executions and steps: round trips and fail-closed decoding."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pybatch import errors
from pybatch._codecs._jsonb import CanonicalJsonb
from pybatch._codecs._primitives import DecodeError
from pybatch._codecs.executions import JOB_EXECUTION_COLUMNS, decode_job_execution
from pybatch._codecs.instances import (
    JOB_INSTANCE_COLUMNS,
    decode_identifying_parameters,
    decode_job_instance,
    encode_identifying_parameters,
    encode_job_instance_key,
)
from pybatch._codecs.lifecycle import encode_execution_metadata
from pybatch._codecs.steps import (
    STEP_EXECUTION_COLUMNS,
    decode_step_execution,
    encode_counts,
)
from pybatch.values._canonical import canonical_json
from pybatch.values.counts import ExecutionCounts, StepFaultCounts
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import ExecutionMetadata, ExecutionTimestamps
from pybatch.values.names import ExitCode, JobName, StateSchemaId
from pybatch.values.parameters import JobInstanceKey, JobParameters, ParameterValue
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.rows import encode_fault_counts, encode_state

T0 = datetime(2026, 6, 1, 8, 30, 0, 654321, tzinfo=UTC)
Row = dict[str, Any]


def golden_key() -> JobInstanceKey:
    return JobInstanceKey(
        JobName("golden_job"),
        JobParameters.of(
            {"region": "서울", "limit": ParameterValue.u64(2**63), "count": -2, "active": True}
        ),
    )


def instance_row() -> Row:
    key = golden_key()
    return {
        "id": 11,
        "job_name": "golden_job",
        "instance_key": key.digest(),
        # as jsonb returns it: keys reordered (length first), values plain
        "identifying_parameters": {
            "count": {"value": -2, "type": "i64", "identifying": True},
            "limit": {"type": "u64", "value": 2**63, "identifying": True},
            "active": {"identifying": True, "type": "bool", "value": True},
            "region": {"type": "string", "identifying": True, "value": "서울"},
        },
        "created_at": T0,
        "hold_actor": None,  # extra columns are ignored
    }


def execution_row() -> Row:
    return {
        "id": 21,
        "job_instance_id": 11,
        "definition_id": 3,
        "upgrade_from_definition_id": None,
        "restart_of_execution_id": None,
        "attempt": 1,
        "status": "STARTED",
        "exit_code": "UNKNOWN",
        "failure_category": None,
        "failure_id": None,
        "created_at": T0,
        "started_at": T0 + timedelta(seconds=1),
        "ended_at": None,
        "updated_at": T0 + timedelta(seconds=1),
        "version": 1,
    }


def step_row() -> Row:
    row = execution_row()
    for column in (
        "job_instance_id",
        "definition_id",
        "upgrade_from_definition_id",
        "restart_of_execution_id",
        "attempt",
    ):
        del row[column]
    row.update(
        {
            "id": 31,
            "job_execution_id": 21,
            "step_name": "extract",
            "step_logical_id": "extract",
            "read_count": 10,
            "processed_count": 9,
            "write_count": 8,
            "filter_count": 1,
            "commit_count": 2,
            "rollback_count": 0,
            "checkpoint_format": 1,
            "checkpoint_schema": "etl.reader.v1",
            "checkpoint_schema_version": 2,
            "checkpoint_payload": {"offset": 10, "f": 1e-7},
            "context_format": 1,
            "context_schema": "oxide_batch.empty.v1",
            "context_schema_version": 1,
            "context_payload": {},
            "read_retry_count": 1,
            "process_retry_count": 0,
            "write_retry_count": 0,
            "read_skip_count": 0,
            "process_skip_count": 0,
            "write_skip_count": 0,
            "no_rollback_count": 0,
        }
    )
    return row


def changed(row: Row, **changes: Any) -> Row:
    result = copy.deepcopy(row)
    result.update(changes)
    return result


def refused(decoder: Callable[[Row], object], row: Row, column: str) -> None:
    with pytest.raises(DecodeError) as error:
        decoder(row)
    assert error.value.column == column


# --------------------------------------------------------------------------- columns


def test_column_lists() -> None:
    assert set(instance_row()) - {"hold_actor"} == set(JOB_INSTANCE_COLUMNS)
    assert set(execution_row()) == set(JOB_EXECUTION_COLUMNS)
    assert set(step_row()) == set(STEP_EXECUTION_COLUMNS)
    assert len(STEP_EXECUTION_COLUMNS) == len(set(STEP_EXECUTION_COLUMNS))


@pytest.mark.parametrize(
    ("decoder", "make", "columns"),
    [
        (decode_job_instance, instance_row, JOB_INSTANCE_COLUMNS),
        (decode_job_execution, execution_row, JOB_EXECUTION_COLUMNS),
        (decode_step_execution, step_row, STEP_EXECUTION_COLUMNS),
    ],
)
def test_a_missing_column_fails_loudly(
    decoder: Callable[[Row], object], make: Callable[[], Row], columns: tuple[str, ...]
) -> None:
    for column in columns:
        row = make()
        del row[column]
        with pytest.raises(KeyError):
            decoder(row)


# --------------------------------------------------------------------------- instances


def test_decode_job_instance() -> None:
    instance = decode_job_instance(instance_row())
    assert instance.id == 11
    assert instance.key == golden_key()
    assert instance.instance_key.hex() == (
        "71f12db9e3887de2cf92e93bb63fd4e9e7c536df8fa202212445d18bf2e43604"
    )
    assert instance.created_at == T0


def test_instance_key_must_match_the_parameters() -> None:
    refused(decode_job_instance, changed(instance_row(), instance_key=b"\x00" * 32), "instance_key")
    refused(decode_job_instance, changed(instance_row(), instance_key=b"\x00" * 31), "instance_key")
    refused(decode_job_instance, changed(instance_row(), job_name="other"), "instance_key")
    refused(decode_job_instance, changed(instance_row(), job_name=" bad"), "job_name")
    refused(decode_job_instance, changed(instance_row(), id=0), "id")
    refused(
        decode_job_instance,
        changed(instance_row(), created_at=datetime(2026, 1, 1)),
        "created_at",
    )


def test_identifying_parameters_round_trip() -> None:
    key = golden_key()
    document = encode_identifying_parameters(key)
    assert document == {
        "active": {"type": "bool", "identifying": True, "value": True},
        "count": {"type": "i64", "identifying": True, "value": -2},
        "limit": {"type": "u64", "identifying": True, "value": 2**63},
        "region": {"type": "string", "identifying": True, "value": "서울"},
    }
    assert decode_identifying_parameters(document) == key.parameters
    columns = encode_job_instance_key(key)
    assert columns["job_name"] == "golden_job"
    assert columns["instance_key"] == key.digest()
    wrapper = columns["identifying_parameters"]
    assert isinstance(wrapper, CanonicalJsonb)
    assert repr(wrapper) == "CanonicalJsonb(<redacted>)"
    assert wrapper.dumps is not None
    assert wrapper.dumps(wrapper.obj) == canonical_json(document)


def test_encode_identifying_parameters_refuses_over_one_mib() -> None:
    big = {f"p{i:02d}": "x" * 65_536 for i in range(17)}
    key = JobInstanceKey(JobName("j"), JobParameters.of(big))
    with pytest.raises(errors.Unavailable):
        encode_identifying_parameters(key)


def _envelope(kind: object, value: object, **extra: object) -> dict[str, object]:
    result: dict[str, object] = {"type": kind, "identifying": True, "value": value}
    result.update(extra)
    return result


MALFORMED_PARAMETERS: list[object] = [
    [],
    "{}",
    {"a": []},
    {"a": "string"},
    {"a": {"type": "i64", "value": 1}},  # identifying missing
    {"a": _envelope("i64", 1, identifying=False)},
    {"a": _envelope("i64", 1, identifying=1)},
    {"a": _envelope("i64", 1, identifying="true")},
    {"a": _envelope("I64", 1)},
    {"a": _envelope("float", 1.5)},
    {"a": _envelope(None, 1)},
    {"a": _envelope("i64", True)},
    {"a": _envelope("i64", 1.0)},
    {"a": _envelope("i64", "1")},
    {"a": _envelope("i64", 2**63)},
    {"a": _envelope("i64", -(2**63) - 1)},
    {"a": _envelope("u64", -1)},
    {"a": _envelope("u64", 2**64)},
    {"a": _envelope("u64", False)},
    {"a": _envelope("bool", 1)},
    {"a": _envelope("bool", "true")},
    {"a": _envelope("string", 5)},
    {"a": _envelope("string", None)},
    {"a": _envelope("string", "x" * 65_537)},
    {"a": _envelope("string", "x", extra="member")},
    {" a": _envelope("i64", 1)},
    {"": _envelope("i64", 1)},
    {"a\x00": _envelope("i64", 1)},
    {"a" * 129: _envelope("i64", 1)},
    {f"p{i:02d}": _envelope("string", "x" * 65_536) for i in range(17)},  # over 1 MiB
]


@pytest.mark.parametrize("document", MALFORMED_PARAMETERS)
def test_malformed_identifying_parameters_are_refused(document: object) -> None:
    with pytest.raises(DecodeError) as error:
        decode_identifying_parameters(document, column="parameters")
    assert error.value.column == "parameters"
    row = changed(instance_row(), identifying_parameters=document)
    refused(decode_job_instance, row, "identifying_parameters")


def test_identifying_parameter_edges_are_accepted() -> None:
    document = {
        "max_u64": _envelope("u64", 2**64 - 1),
        "min_i64": _envelope("i64", -(2**63)),
        "long": _envelope("string", "é" * 32_768),
        "f": _envelope("bool", False),
    }
    parameters = decode_identifying_parameters(document)
    assert parameters["max_u64"].value == ParameterValue.u64(2**64 - 1)
    assert parameters.identifying_count == 4
    assert decode_identifying_parameters({}) == JobParameters()


# --------------------------------------------------------------------------- job executions


def test_decode_job_execution() -> None:
    execution = decode_job_execution(execution_row())
    assert (execution.id, execution.job_instance_id, execution.attempt) == (21, 11, 1)
    assert execution.metadata.status is BatchStatus.STARTED
    assert execution.metadata.exit_status == ExitCode("UNKNOWN")
    assert execution.metadata.counts == ExecutionCounts()
    assert execution.metadata.timestamps.started_at == T0 + timedelta(seconds=1)
    assert (execution.version, execution.updated_at) == (1, T0 + timedelta(seconds=1))
    restarted = decode_job_execution(
        changed(
            execution_row(),
            restart_of_execution_id=20,
            upgrade_from_definition_id=2,
            status="FAILED",
            ended_at=T0 + timedelta(seconds=2),
            failure_category="USER_COMPONENT",
            failure_id=99,
        )
    )
    assert restarted.restart_of_execution_id == 20
    assert restarted.upgrade_from_definition_id == 2
    assert restarted.metadata.failure == FailureSummary(
        FailureCategory.USER_COMPONENT, FailureId(99)
    )


@pytest.mark.parametrize(
    ("decoder", "make"),
    [(decode_job_execution, execution_row), (decode_step_execution, step_row)],
)
def test_enum_and_shape_refusals(decoder: Callable[[Row], object], make: Callable[[], Row]) -> None:
    ended = T0 + timedelta(seconds=5)
    failed = {"status": "FAILED", "ended_at": ended, "updated_at": ended}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"status": "BOGUS"}, "status"),
        ({"status": "started"}, "status"),
        ({"status": None}, "status"),
        ({**failed, "failure_category": "NOT_A_CATEGORY", "failure_id": 1}, "failure_category"),
        ({**failed, "failure_category": "user_component", "failure_id": 1}, "failure_category"),
        ({"exit_code": "E" * 65}, "exit_code"),
        ({"exit_code": ""}, "exit_code"),
        ({"exit_code": None}, "exit_code"),
        ({"failure_category": "TIMEOUT", "failure_id": None}, "failure_id"),
        ({"failure_category": None, "failure_id": 5}, "failure_category"),
        ({"failure_category": "TIMEOUT", "failure_id": 0}, "failure_id"),
        ({"failure_category": "TIMEOUT", "failure_id": -5}, "failure_id"),
        ({**failed}, "failure_category"),  # FAILED without a failure
        ({"ended_at": ended, "updated_at": ended}, "ended_at"),  # active with an end
        ({"status": "COMPLETED"}, "ended_at"),  # finished without an end
        ({"status": "UNKNOWN", "ended_at": ended, "updated_at": ended}, "ended_at"),
        ({"started_at": T0 - timedelta(seconds=1)}, "started_at"),
        (
            {**failed, "failure_category": "TIMEOUT", "failure_id": 1, "ended_at": T0},
            "ended_at",
        ),  # before started_at
        ({"updated_at": T0 - timedelta(microseconds=1)}, "updated_at"),
        ({"created_at": datetime(2026, 1, 1)}, "created_at"),
        ({"version": -1}, "version"),
        ({"version": 2**63}, "version"),
        ({"version": True}, "version"),
        ({"id": 0}, "id"),
        ({"id": -1}, "id"),
    ]
    for changes, column in cases:
        refused(decoder, changed(make(), **changes), column)


def test_job_execution_specific_refusals() -> None:
    cases_0: list[tuple[dict[str, Any], str]] = [
        ({"attempt": 0}, "attempt"),
        ({"attempt": 2**31}, "attempt"),
        ({"job_instance_id": 0}, "job_instance_id"),
        ({"definition_id": None}, "definition_id"),
        ({"restart_of_execution_id": -3}, "restart_of_execution_id"),
        ({"upgrade_from_definition_id": 0}, "upgrade_from_definition_id"),
    ]
    for changes, column in cases_0:
        refused(decode_job_execution, changed(execution_row(), **changes), column)


@pytest.mark.parametrize("status", list(BatchStatus))
def test_every_status_is_decodable(status: BatchStatus) -> None:
    row = changed(execution_row(), status=status.value)
    if status.is_finished:
        row["ended_at"] = row["updated_at"] = T0 + timedelta(seconds=3)
    if status is BatchStatus.FAILED:
        row["failure_category"], row["failure_id"] = "INVARIANT", 1
    assert decode_job_execution(row).metadata.status is status


@pytest.mark.parametrize("category", list(FailureCategory))
def test_every_failure_category_is_decodable(category: FailureCategory) -> None:
    row = changed(execution_row(), failure_category=category.value, failure_id=2**63 - 1)
    failure = decode_job_execution(row).metadata.failure
    assert failure == FailureSummary(category, FailureId(2**63 - 1))


# --------------------------------------------------------------------------- step executions


def test_decode_step_execution() -> None:
    step = decode_step_execution(step_row())
    assert (step.id, step.job_execution_id) == (31, 21)
    assert (step.step_name.value, step.logical_id.value) == ("extract", "extract")
    assert step.metadata.counts == ExecutionCounts(
        read=10, processed=9, written=8, filtered=1, committed=2, rolled_back=0
    )
    assert step.fault_counts == StepFaultCounts(read_retry=1)
    assert step.checkpoint == Checkpoint(
        StateSchemaId("etl.reader.v1"), 2, {"offset": 10, "f": 1e-7}
    )
    assert step.context == ExecutionContext.empty()


COUNT_COLUMNS = [
    "read_count",
    "processed_count",
    "write_count",
    "filter_count",
    "commit_count",
    "rollback_count",
    "read_retry_count",
    "process_retry_count",
    "write_retry_count",
    "read_skip_count",
    "process_skip_count",
    "write_skip_count",
    "no_rollback_count",
]


@pytest.mark.parametrize("column", COUNT_COLUMNS)
@pytest.mark.parametrize("value", [-1, 2**63, None, True, 1.0])
def test_bad_step_counters_are_refused(column: str, value: object) -> None:
    refused(decode_step_execution, changed(step_row(), **{column: value}), column)


@pytest.mark.parametrize("prefix", ["checkpoint", "context"])
def test_bad_step_state_is_refused(prefix: str) -> None:
    deep: dict[str, object] = {}
    cursor = deep
    for _ in range(70):
        cursor["n"] = {}
        cursor = cursor["n"]  # type: ignore[assignment]
    cases_1: list[tuple[dict[str, Any], str]] = [
        ({f"{prefix}_format": 2}, f"{prefix}_format"),
        ({f"{prefix}_format": True}, f"{prefix}_format"),
        ({f"{prefix}_schema": ""}, f"{prefix}_schema"),
        ({f"{prefix}_schema": "a\x01"}, f"{prefix}_schema"),
        ({f"{prefix}_schema_version": 0}, f"{prefix}_schema_version"),
        ({f"{prefix}_schema_version": 2**32}, f"{prefix}_schema_version"),
        ({f"{prefix}_payload": [1]}, f"{prefix}_payload"),
        ({f"{prefix}_payload": None}, f"{prefix}_payload"),
        ({f"{prefix}_payload": deep}, f"{prefix}_payload"),
        ({f"{prefix}_payload": {"x": "y" * 1_048_576}}, f"{prefix}_payload"),
    ]
    for changes, column in cases_1:
        refused(decode_step_execution, changed(step_row(), **changes), column)


def test_step_specific_refusals() -> None:
    refused(decode_step_execution, changed(step_row(), step_name="a" * 129), "step_name")
    refused(decode_step_execution, changed(step_row(), step_logical_id=""), "step_logical_id")
    refused(decode_step_execution, changed(step_row(), job_execution_id=0), "job_execution_id")


# --------------------------------------------------------------------------- encoders


def test_encode_state_columns() -> None:
    checkpoint = Checkpoint(StateSchemaId("etl.reader.v1"), 2, {"offset": 10, "big": 1e16})
    columns = encode_state(checkpoint)
    assert set(columns) == {
        "checkpoint_format",
        "checkpoint_schema",
        "checkpoint_schema_version",
        "checkpoint_payload",
    }
    assert (
        columns["checkpoint_format"],
        columns["checkpoint_schema"],
        columns["checkpoint_schema_version"],
    ) == (1, "etl.reader.v1", 2)
    payload = columns["checkpoint_payload"]
    assert isinstance(payload, CanonicalJsonb) and payload.dumps is not None
    assert payload.dumps(payload.obj) == b'{"big":10000000000000000,"offset":10}'
    assert set(encode_state(ExecutionContext.empty())) == {
        "context_format",
        "context_schema",
        "context_schema_version",
        "context_payload",
    }


def test_encoded_state_decodes_to_the_same_state() -> None:
    checkpoint = Checkpoint(StateSchemaId("s"), 3, {"a": [1, 2.5, -0.0, "x"]})
    columns = encode_state(checkpoint)
    payload = columns["checkpoint_payload"]
    assert isinstance(payload, CanonicalJsonb)
    row = changed(step_row(), **{**columns, "checkpoint_payload": payload.obj})
    assert decode_step_execution(row).checkpoint == checkpoint


def test_encode_execution_metadata_and_counts() -> None:
    metadata = ExecutionMetadata(
        status=BatchStatus.FAILED,
        exit_status=ExitCode("FAILED"),
        timestamps=ExecutionTimestamps(T0, T0, T0 + timedelta(seconds=1)),
        counts=ExecutionCounts(read=4, rolled_back=1),
        failure=FailureSummary(FailureCategory.TIMEOUT, FailureId(8)),
    )
    assert encode_execution_metadata(metadata) == {
        "status": "FAILED",
        "exit_code": "FAILED",
        "started_at": T0,
        "ended_at": T0 + timedelta(seconds=1),
        "failure_category": "TIMEOUT",
        "failure_id": 8,
    }
    assert encode_counts(metadata.counts) == {
        "read_count": 4,
        "processed_count": 0,
        "write_count": 0,
        "filter_count": 0,
        "commit_count": 0,
        "rollback_count": 1,
    }
    assert encode_fault_counts(StepFaultCounts(write_skip=2))["write_skip_count"] == 2
    unstorable = ExecutionMetadata(
        status=BatchStatus.FAILED,
        exit_status=ExitCode("FAILED"),
        timestamps=ExecutionTimestamps(T0, None, T0),
        failure=FailureSummary(FailureCategory.TIMEOUT, FailureId(2**63)),
    )
    with pytest.raises(errors.IdentifierOutOfRange) as error:
        encode_execution_metadata(unstorable)
    assert (error.value.kind, error.value.value) == ("failure", 2**63)


def test_row_round_trip_through_encoders() -> None:
    step = decode_step_execution(step_row())
    row = changed(step_row(), **encode_execution_metadata(step.metadata))
    row.update(encode_counts(step.metadata.counts))
    row.update(encode_fault_counts(step.fault_counts))
    assert decode_step_execution(row) == step
