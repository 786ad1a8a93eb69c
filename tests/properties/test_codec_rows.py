"""Row decoders: whatever a stored row holds, a valid value or the decoder's typed refusal.

What users rely on: a corrupt row fails closed. Every row decoder of `pybatch._codecs` reads
the columns it declares (`*_COLUMNS`) and, for any cells at all in those columns, returns a
valid value of its type or refuses with its documented error: `DecodeError` naming one of
its own columns (the unit of work and the explorer report it as Unavailable), or the
decoder's own corruption error (`FlowStateCorrupt`, `PartitionStateCorrupt`,
`FaultStateEnvelopeInvalid`, `FaultStateCorrupt`). A TypeError, ValueError, KeyError,
OverflowError or decimal error escaping instead would crash a reader on a bad row.

And the other way round: a row holding what pybatch writes decodes to exactly the value
it was written from.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybatch._codecs import explorer as ex
from pybatch._codecs._primitives import DecodeError
from pybatch._codecs.chunks import COMMITTED_STEP_STATE_COLUMNS, decode_committed_step_state
from pybatch._codecs.executions import (
    JOB_EXECUTION_COLUMNS,
    RECOVERY_DECISION_COLUMNS,
    decode_job_execution,
    decode_recovery_decision,
)
from pybatch._codecs.fault_state import (
    FAULT_STATE_COLUMNS,
    LOCKED_FAULT_STATE_COLUMNS,
    decode_fault_state,
    decode_locked_fault_state,
    encode_fault_state,
)
from pybatch._codecs.flow import (
    FLOW_DECISION_COLUMNS,
    decode_flow_decision,
    encode_flow_decision_request,
)
from pybatch._codecs.instances import (
    JOB_INSTANCE_COLUMNS,
    decode_job_instance,
    encode_identifying_parameters,
)
from pybatch._codecs.lifecycle import encode_execution_metadata
from pybatch._codecs.operator import (
    OPERATOR_REQUEST_COLUMNS,
    decode_operator_record,
    encode_operator_record_draft,
)
from pybatch._codecs.partitions import (
    STEP_PARTITION_COLUMNS,
    context_checksum,
    decode_step_partition,
)
from pybatch._codecs.steps import (
    STEP_EXECUTION_COLUMNS,
    decode_step_execution,
    encode_counts,
)
from pybatch.errors import (
    FaultStateCorrupt,
    FaultStateEnvelopeInvalid,
    FlowStateCorrupt,
    PartitionStateCorrupt,
    Unavailable,
)
from pybatch.values.chunks import CommittedStepState
from pybatch.values.counts import StepFaultCounts
from pybatch.values.explorer import (
    DefinitionDescriptor,
    InstanceTombstone,
    JobExecutionProjection,
    JobInstanceProjection,
    JobNameSummary,
    ParameterDescriptor,
    ProjectionCounts,
    RetentionHold,
    StateEnvelopeDescriptor,
    StepExecutionProjection,
    StepPartitionProjection,
    StepSkip,
)
from pybatch.values.fault import FaultStateEnvelope, LockedFaultState
from pybatch.values.flow import FlowDecision
from pybatch.values.ids import (
    INT64_MAX,
    DefinitionId,
    JobExecutionId,
    JobInstanceId,
    StepExecutionId,
)
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.operator import OperatorRecord
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.partitions import StepPartition
from pybatch.values.records import JobExecution, JobInstance, StepExecution
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus, FailureSummary
from tests.properties import strategies as s
from tests.support.rows import encode_fault_counts

Row = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Decoder:
    """A row decoder, its declared columns, its refusals and rows built from valid values."""

    name: str
    decode: Callable[[Row], object]
    columns: tuple[str, ...]
    result: type
    refusals: tuple[type[Exception], ...]
    #: (row, the value the row must decode to) from a valid value.
    valid: st.SearchStrategy[tuple[Row, object]]
    #: Names a DecodeError may carry besides the declared columns (a whole-row refusal).
    whole_row: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.name


# --------------------------------------------------------------------------- valid rows


def _state_columns(prefix: str, state: Checkpoint | ExecutionContext) -> Row:
    """A state envelope's four columns as the driver returns them (jsonb read as a dict)."""
    return {
        f"{prefix}_format": 1,
        f"{prefix}_schema": state.schema.value,
        f"{prefix}_schema_version": state.schema_version,
        f"{prefix}_payload": state.payload,
    }


def _fault_columns(envelope: FaultStateEnvelope) -> Row:
    return dict(encode_fault_state(envelope))


def _operator(record: OperatorRecord) -> tuple[Row, object]:
    return {"id": record.id, **encode_operator_record_draft(record)}, record


def _flow(decision: FlowDecision) -> tuple[Row, object]:
    row = encode_flow_decision_request(decision)
    row["source_node_id"] = row.pop("node_id")
    return {"id": decision.id, **row}, decision


def _recovery(decision: RecoveryDecision) -> tuple[Row, object]:
    return {
        "id": decision.id,
        "job_execution_id": decision.job_execution_id,
        "execution_version": decision.execution_version,
        "prior_status": decision.prior_status.value,
        "resulting_status": decision.resulting_status.value,
        "reason_code": decision.reason_code,
        "operator_reference": decision.operator_reference,
        "evidence_digest": decision.evidence_digest,
        "decided_at": decision.decided_at,
    }, decision


def _partition(partition: StepPartition) -> tuple[Row, object]:
    return {
        "id": partition.id,
        "step_execution_id": partition.step_execution_id,
        "worker_step_execution_id": partition.worker_step_execution_id,
        "partition_key": partition.key.value,
        "partition_ordinal": partition.ordinal,
        "status": partition.status.value,
        "exit_code": partition.exit_status.value,
        **encode_counts(partition.counts),
        **_state_columns("context", partition.context),
        "context_checksum": context_checksum(partition.context),
        "version": partition.version,
    }, partition


@st.composite
def _locked_fault_state(draw: st.DrawFn) -> tuple[Row, object]:
    envelope, checkpoint = draw(s.fault_envelopes()), draw(s.checkpoints)
    status, version = draw(s.statuses), draw(s.versions)
    row = {
        "status": status.value,
        "version": version,
        **_state_columns("checkpoint", checkpoint),
        **_fault_columns(envelope),
    }
    locked = LockedFaultState(
        status=status,
        version=version,
        checkpoint_digest=checkpoint.generation_digest(),
        envelope=envelope,
    )
    return row, locked


@st.composite
def _committed_step_state(draw: st.DrawFn) -> tuple[Row, object]:
    state = CommittedStepState(
        step_execution_id=draw(s.ids),
        job_execution_id=draw(s.ids),
        status=draw(s.statuses),
        version=draw(s.versions),
        counts=draw(s.partition_counts),
        checkpoint=draw(s.checkpoints),
        context=draw(s.step_contexts),
        fault_state=draw(s.fault_envelopes()),
    )
    row = {
        "id": state.step_execution_id,
        "job_execution_id": state.job_execution_id,
        "status": state.status.value,
        "version": state.version,
        **encode_counts(state.counts),
        **_state_columns("checkpoint", state.checkpoint),
        **_state_columns("context", state.context),
        **_fault_columns(state.fault_state),
    }
    return row, state


@st.composite
def _instance(draw: st.DrawFn) -> tuple[Row, JobInstance]:
    key: JobInstanceKey = draw(s.instance_keys)
    instance = JobInstance(
        id=JobInstanceId(draw(s.ids)),
        job_name=key.job_name,
        instance_key=key.digest(),
        created_at=draw(s.instants),
        parameters=key.parameters,
    )
    row = {
        "id": instance.id,
        "job_name": key.job_name.value,
        "instance_key": key.digest(),
        "identifying_parameters": encode_identifying_parameters(key),
        "created_at": instance.created_at,
    }
    return row, instance


def _metadata_columns(metadata: ExecutionMetadata) -> Row:
    return {
        **encode_execution_metadata(metadata),
        "created_at": metadata.timestamps.created_at,
    }


def _optional(kind: Callable[[int], T]) -> Callable[[int | None], T | None]:
    return lambda value: None if value is None else kind(value)


@st.composite
def _execution(draw: st.DrawFn) -> tuple[Row, object]:
    metadata: ExecutionMetadata = draw(s.metadata)
    updated_at = metadata.timestamps.created_at + draw(
        st.timedeltas(dt.timedelta(0), dt.timedelta(days=1000))
    )
    execution = JobExecution(
        id=JobExecutionId(draw(s.ids)),
        job_instance_id=JobInstanceId(draw(s.ids)),
        attempt=draw(st.integers(1, 2**31 - 1)),
        definition_id=DefinitionId(draw(s.ids)),
        metadata=metadata,
        version=draw(s.versions),
        updated_at=updated_at,
        restart_of_execution_id=draw(s.optional_ids.map(_optional(JobExecutionId))),
        upgrade_from_definition_id=draw(s.optional_ids.map(_optional(DefinitionId))),
    )
    row = {
        "id": execution.id,
        "job_instance_id": execution.job_instance_id,
        "definition_id": execution.definition_id,
        "upgrade_from_definition_id": execution.upgrade_from_definition_id,
        "restart_of_execution_id": execution.restart_of_execution_id,
        "attempt": execution.attempt,
        **_metadata_columns(metadata),
        "updated_at": updated_at,
        "version": execution.version,
    }
    return row, execution


@st.composite
def _step(draw: st.DrawFn) -> tuple[Row, object]:
    metadata = attrs.evolve(draw(s.metadata), counts=draw(s.partition_counts))
    fault_counts = StepFaultCounts(
        **{
            name: draw(s.counters)
            for name in (
                "read_retry",
                "process_retry",
                "write_retry",
                "read_skip",
                "process_skip",
                "write_skip",
                "no_rollback",
            )
        }
    )
    step = StepExecution(
        id=StepExecutionId(draw(s.ids)),
        job_execution_id=JobExecutionId(draw(s.ids)),
        step_name=draw(s.step_names),
        logical_id=draw(s.node_ids),
        metadata=metadata,
        version=draw(s.versions),
        updated_at=metadata.timestamps.created_at
        + draw(st.timedeltas(dt.timedelta(0), dt.timedelta(days=1000))),
        checkpoint=draw(s.checkpoints),
        context=draw(s.step_contexts),
        fault_counts=fault_counts,
    )
    row = {
        "id": step.id,
        "job_execution_id": step.job_execution_id,
        "step_name": step.step_name.value,
        "step_logical_id": step.logical_id.value,
        **encode_counts(metadata.counts),
        **_state_columns("checkpoint", step.checkpoint),
        **_state_columns("context", step.context),
        **_metadata_columns(metadata),
        "updated_at": step.updated_at,
        "version": step.version,
        **encode_fault_counts(fault_counts),
    }
    return row, step


# --------------------------------------------------------------------------- explorer rows

_texts = s.storable_text
_maybe_instant = st.none() | s.instants


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC)


def _maybe_utc(moment: dt.datetime | None) -> dt.datetime | None:
    return None if moment is None else _utc(moment)


@st.composite
def _job_name_summary(draw: st.DrawFn) -> tuple[Row, object]:
    status = draw(st.none() | s.statuses)
    summary = JobNameSummary(
        job_name=draw(_texts),
        latest_execution_id=draw(s.optional_ids),
        latest_status=status,
        latest_updated_at=_maybe_utc(draw(_maybe_instant)),
    )
    row = attrs.asdict(summary, recurse=False)
    row["latest_status"] = None if status is None else status.value
    return row, summary


def _parameter_cells(draw: st.DrawFn) -> tuple[Row, tuple[ParameterDescriptor, ...]]:
    """An identifying-parameter document as a launch stores it, and its descriptors."""
    key: JobInstanceKey = draw(s.instance_keys)
    descriptors = tuple(
        ParameterDescriptor(name.value, parameter.kind.json_tag, parameter.value.value)
        for name, parameter in key.parameters.items()
    )
    return {"identifying_parameters": encode_identifying_parameters(key)}, descriptors


@st.composite
def _instance_projection(draw: st.DrawFn) -> tuple[Row, object]:
    cells, parameters = _parameter_cells(draw)
    hold = draw(st.none() | st.builds(RetentionHold, _texts, _texts, s.instants.map(_utc)))
    done = (BatchStatus.STOPPED, BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.ABANDONED)
    finished = st.sampled_from(done)
    tombstone = draw(
        st.none()
        | st.builds(InstanceTombstone, finished, s.instants.map(_utc), st.integers(0, 2**31 - 1))
    )
    projection = JobInstanceProjection(
        id=draw(s.ids),
        job_name=draw(_texts),
        instance_key_digest=draw(s.digests),
        parameters=parameters,
        created_at=draw(s.instants.map(_utc)),
        hold=hold,
        tombstone=tombstone,
    )
    row = {
        "id": projection.id,
        "job_name": projection.job_name,
        "instance_key": projection.instance_key_digest,
        "created_at": projection.created_at,
        "hold_actor": None if hold is None else hold.actor,
        "hold_reason": None if hold is None else hold.reason,
        "hold_placed_at": None if hold is None else hold.placed_at,
        "last_attempt": 0 if tombstone is None else tombstone.last_attempt,
        "final_status": None if tombstone is None else tombstone.final_status.value,
        "purged_at": None if tombstone is None else tombstone.purged_at,
        **cells,
    }
    return row, projection


_projection_counts = st.builds(ProjectionCounts, *(st.integers(0, INT64_MAX) for _ in range(6)))
_COUNT_COLUMNS = {
    "read": "read_count",
    "processed": "processed_count",
    "written": "write_count",
    "filtered": "filter_count",
    "commits": "commit_count",
    "rollbacks": "rollback_count",
}


def _count_cells(draw: st.DrawFn, counts: ProjectionCounts) -> Row:
    """Stored counters are bigint; derived totals arrive as numeric (Decimal)."""
    as_decimal = draw(st.booleans())
    return {
        column: decimal.Decimal(getattr(counts, name)) if as_decimal else getattr(counts, name)
        for name, column in _COUNT_COLUMNS.items()
    }


def _descriptor(kind: str) -> st.SearchStrategy[StateEnvelopeDescriptor]:
    return st.builds(StateEnvelopeDescriptor, st.just(kind), s.ids, _texts, s.ids, s.versions)


def _descriptor_cells(descriptor: StateEnvelopeDescriptor) -> Row:
    prefix = descriptor.kind
    return {
        f"{prefix}_format": descriptor.format_version,
        f"{prefix}_schema": descriptor.schema_id,
        f"{prefix}_schema_version": descriptor.schema_version,
        f"{prefix}_bytes": descriptor.encoded_len,
    }


def _failure_cells(failure: FailureSummary | None) -> Row:
    return {
        "failure_category": None if failure is None else failure.category.value,
        "failure_id": None if failure is None else failure.failure_id,
    }


def _lifecycle(draw: st.DrawFn) -> dict[str, Any]:
    """The lifecycle fields the projections share (no order between instants is required)."""
    return {
        "status": draw(s.statuses),
        "exit_code": draw(_texts),
        "counts": draw(_projection_counts),
        "version": draw(s.versions),
        "created_at": draw(s.instants.map(_utc)),
        "started_at": _maybe_utc(draw(_maybe_instant)),
        "ended_at": _maybe_utc(draw(_maybe_instant)),
        "updated_at": draw(s.instants.map(_utc)),
        "failure": draw(st.none() | s.failures),
    }


def _lifecycle_cells(draw: st.DrawFn, fields: dict[str, Any]) -> Row:
    return {
        "status": fields["status"].value,
        "exit_code": fields["exit_code"],
        "version": fields["version"],
        "created_at": fields["created_at"],
        "started_at": fields["started_at"],
        "ended_at": fields["ended_at"],
        "updated_at": fields["updated_at"],
        **_count_cells(draw, fields["counts"]),
        **_failure_cells(fields["failure"]),
    }


@st.composite
def _execution_projection(draw: st.DrawFn) -> tuple[Row, object]:
    fields = _lifecycle(draw)
    stop_at = _maybe_utc(draw(_maybe_instant))
    cells, parameters = _parameter_cells(draw)
    owner_recorded = draw(st.booleans())
    projection = JobExecutionProjection(
        id=draw(s.ids),
        instance_id=draw(s.ids),
        job_name=draw(_texts),
        parameters=parameters,
        attempt=draw(s.ids),
        definition=draw(st.builds(DefinitionDescriptor, _texts, s.ids, s.digests)),
        context=draw(_descriptor("context")),
        stop_requested_at=stop_at,
        stop_requested_by=None if stop_at is None else draw(_texts),
        owner_recorded=owner_recorded,
        owner_host=draw(st.none() | st.just("etl-7.example:4242")) if owner_recorded else None,
        **fields,
    )
    row = {
        "id": projection.id,
        "job_instance_id": projection.instance_id,
        "job_name": projection.job_name,
        "attempt": projection.attempt,
        **_lifecycle_cells(draw, fields),
        "stop_requested_at": stop_at,
        "stop_requested_by": projection.stop_requested_by,
        "definition_revision": projection.definition.revision,
        "manifest_format": projection.definition.manifest_format,
        "manifest_digest": projection.definition.manifest_digest,
        **_descriptor_cells(projection.context),
        "owner_recorded": projection.owner_recorded,
        "owner_host": projection.owner_host,
        **cells,
    }
    return row, projection


@st.composite
def _step_projection(draw: st.DrawFn) -> tuple[Row, object]:
    fields = _lifecycle(draw)
    projection = StepExecutionProjection(
        id=draw(s.ids),
        job_execution_id=draw(s.ids),
        step_name=draw(_texts),
        node_id=draw(_texts),
        checkpoint=draw(_descriptor("checkpoint")),
        context=draw(_descriptor("context")),
        **fields,
    )
    row = {
        "id": projection.id,
        "job_execution_id": projection.job_execution_id,
        "step_name": projection.step_name,
        "step_logical_id": projection.node_id,
        **_lifecycle_cells(draw, fields),
        **_descriptor_cells(projection.checkpoint),
        **_descriptor_cells(projection.context),
    }
    return row, projection


@st.composite
def _partition_projection(draw: st.DrawFn) -> tuple[Row, object]:
    status = draw(s.statuses)
    projection = StepPartitionProjection(
        id=draw(s.ids),
        step_execution_id=draw(s.ids),
        partition_key=draw(_texts),
        ordinal=draw(s.ids),
        status=status,
        exit_code=draw(_texts),
        counts=draw(_projection_counts),
        version=draw(s.versions),
        worker_step_execution_id=draw(s.optional_ids),
        context=draw(_descriptor("context")),
    )
    row = {
        "id": projection.id,
        "step_execution_id": projection.step_execution_id,
        "worker_step_execution_id": projection.worker_step_execution_id,
        "partition_key": projection.partition_key,
        "partition_ordinal": projection.ordinal,
        "status": status.value,
        "exit_code": projection.exit_code,
        **_count_cells(draw, projection.counts),
        "version": projection.version,
        **_descriptor_cells(projection.context),
    }
    return row, projection


_maybe_name = st.none() | st.text(min_size=1, max_size=63)


@st.composite
def _step_skip(draw: st.DrawFn) -> tuple[Row, object]:
    skip = StepSkip(
        id=draw(s.ids),
        step_execution_id=draw(s.ids),
        step_name=draw(_texts),
        item_position=draw(st.integers(0, INT64_MAX)),
        item_key=draw(_texts),
        sqlstate=draw(st.from_regex(r"[0-9A-Z]{5}", fullmatch=True)),
        constraint=draw(_maybe_name),
        table=draw(_maybe_name),
        column=draw(_maybe_name),
        message=draw(_texts),
        created_at=draw(s.instants.map(_utc)),
    )
    row = attrs.asdict(skip)
    for field in ("constraint", "table", "column"):
        row[f"{field}_name"] = row.pop(field)
    return row, skip


# --------------------------------------------------------------------------- the decoders

DECODERS = [
    Decoder(
        "operator_record",
        decode_operator_record,
        OPERATOR_REQUEST_COLUMNS,
        OperatorRecord,
        (DecodeError,),
        s.operator_records.map(_operator),
    ),
    Decoder(
        "recovery_decision",
        decode_recovery_decision,
        RECOVERY_DECISION_COLUMNS,
        RecoveryDecision,
        (DecodeError,),
        s.recovery_decisions.map(_recovery),
        whole_row=frozenset({"recovery_decision"}),
    ),
    Decoder(
        "flow_decision",
        decode_flow_decision,
        FLOW_DECISION_COLUMNS,
        FlowDecision,
        (FlowStateCorrupt,),
        s.flow_decisions.map(_flow),
    ),
    Decoder(
        "step_partition",
        decode_step_partition,
        STEP_PARTITION_COLUMNS,
        StepPartition,
        (PartitionStateCorrupt,),
        s.step_partitions().map(_partition),
    ),
    Decoder(
        "fault_state",
        decode_fault_state,
        FAULT_STATE_COLUMNS,
        FaultStateEnvelope,
        (FaultStateEnvelopeInvalid,),
        s.fault_envelopes().map(lambda envelope: (_fault_columns(envelope), envelope)),
    ),
    Decoder(
        "locked_fault_state",
        decode_locked_fault_state,
        LOCKED_FAULT_STATE_COLUMNS,
        LockedFaultState,
        (FaultStateEnvelopeInvalid, DecodeError),
        _locked_fault_state(),
    ),
    Decoder(
        "committed_step_state",
        decode_committed_step_state,
        COMMITTED_STEP_STATE_COLUMNS,
        CommittedStepState,
        (FaultStateCorrupt, Unavailable),
        _committed_step_state(),
    ),
    Decoder(
        "job_instance",
        decode_job_instance,
        JOB_INSTANCE_COLUMNS,
        JobInstance,
        (DecodeError,),
        _instance(),
    ),
    Decoder(
        "job_execution",
        decode_job_execution,
        JOB_EXECUTION_COLUMNS,
        JobExecution,
        (DecodeError,),
        _execution(),
    ),
    Decoder(
        "step_execution",
        decode_step_execution,
        STEP_EXECUTION_COLUMNS,
        StepExecution,
        (DecodeError,),
        _step(),
    ),
    Decoder(
        "explorer.job_name_summary",
        ex.decode_job_name_summary,
        ex.JOB_NAME_SUMMARY_COLUMNS,
        JobNameSummary,
        (DecodeError,),
        _job_name_summary(),
    ),
    Decoder(
        "explorer.instance_projection",
        ex.decode_instance_projection,
        ex.INSTANCE_PROJECTION_COLUMNS,
        JobInstanceProjection,
        (DecodeError,),
        _instance_projection(),
    ),
    Decoder(
        "explorer.execution_projection",
        ex.decode_execution_projection,
        ex.EXECUTION_PROJECTION_COLUMNS,
        JobExecutionProjection,
        (DecodeError,),
        _execution_projection(),
    ),
    Decoder(
        "explorer.step_projection",
        ex.decode_step_projection,
        ex.STEP_PROJECTION_COLUMNS,
        StepExecutionProjection,
        (DecodeError,),
        _step_projection(),
    ),
    Decoder(
        "explorer.partition_projection",
        ex.decode_partition_projection,
        ex.PARTITION_PROJECTION_COLUMNS,
        StepPartitionProjection,
        (DecodeError,),
        _partition_projection(),
    ),
    Decoder(
        "explorer.step_skip",
        ex.decode_step_skip,
        ex.STEP_SKIP_COLUMNS,
        StepSkip,
        (DecodeError,),
        _step_skip(),
    ),
]


def _well_formed(value: object) -> None:
    """What every decoded value guarantees: instants in UTC, integers in the 64-bit ranges."""
    if isinstance(value, dt.datetime):
        assert value.utcoffset() == dt.timedelta(0)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        assert -(2**63) <= value <= 2**64 - 1
    elif isinstance(value, tuple):
        for item in value:
            _well_formed(item)
    elif attrs.has(type(value)):
        for field in attrs.fields(type(value)):  # type: ignore[arg-type]
            _well_formed(getattr(value, field.name))


def _outcome(decoder: Decoder, row: Row) -> object | None:
    """Decode `row`; None when the decoder refused it the way it is allowed to."""
    try:
        value = decoder.decode(row)
    except decoder.refusals as refusal:
        if isinstance(refusal, DecodeError):
            assert refusal.column in decoder.columns or refusal.column in decoder.whole_row, (
                f"DecodeError names {refusal.column!r}, not a column of {decoder.name}"
            )
        return None
    assert isinstance(value, decoder.result)
    _well_formed(value)
    return value


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@given(data=st.data())
def test_a_row_pybatch_writes_decodes_to_the_value_it_was_written_from(
    decoder: Decoder, data: st.DataObject
) -> None:
    row, value = data.draw(decoder.valid, label="row")
    assert set(row) == set(decoder.columns)
    assert decoder.decode(row) == value


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@settings(max_examples=30)  # random cells are mostly refused at the first column read
@given(data=st.data())
def test_any_cells_decode_to_a_value_or_the_decoders_refusal(
    decoder: Decoder, data: st.DataObject
) -> None:
    row = {column: data.draw(s.cells, label=column) for column in decoder.columns}
    _outcome(decoder, row)


@pytest.mark.parametrize("decoder", DECODERS, ids=str)
@given(data=st.data())
def test_one_corrupted_column_gives_a_value_or_the_decoders_refusal(
    decoder: Decoder, data: st.DataObject
) -> None:
    row, _ = data.draw(decoder.valid, label="row")
    column = data.draw(st.sampled_from(decoder.columns), label="column")
    row[column] = data.draw(s.cells, label="cell")
    _outcome(decoder, row)
