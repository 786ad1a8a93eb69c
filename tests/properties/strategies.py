"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from pybatch.errors import PyBatchError
from pybatch.values import names as _names
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    FaultStateEnvelope,
    RetryKey,
    RetryOrdinal,
)
from pybatch.values.flow import FlowDecision, FlowTarget, FlowTransitionKind, TerminalKind
from pybatch.values.ids import (
    FailureId,
    JobExecutionId,
    JobInstanceId,
    OperatorRequestId,
)
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.names import ExitCode, JobName
from pybatch.values.operator import (
    OperatorAction,
    OperatorOutcomeClass,
    OperatorRecord,
    OperatorRecordDraft,
    OperatorRejection,
    OperatorRejectionCode,
    RequestDigest,
)
from pybatch.values.parameters import JobInstanceKey, JobParameter, JobParameters, ParameterValue
from pybatch.values.partitions import MAX_PARTITIONS, PartitionKey, StepPartition
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.state import Checkpoint, ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from pybatch.values.timestamps import ExecutionTimestamps

#: Text PostgreSQL can store: any code point except NUL and lone surrogates.
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))

#: Integers at and around every edge pybatch cares about, plus arbitrary ones.
edge_integers = st.one_of(
    st.sampled_from(
        [0, 1, -1, 2**31 - 1, -(2**31), 2**53, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64]
    ),
    st.integers(min_value=-(10**300), max_value=10**300),
)

#: Finite floats, the subnormal and huge ones included (numeric prints them in plain notation).
finite_floats = st.floats(allow_nan=False, allow_infinity=False).filter(math.isfinite)

json_scalars = st.one_of(st.none(), st.booleans(), edge_integers, finite_floats, storable_text)

json_documents: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(storable_text, children, max_size=5),
    ),
    max_leaves=30,
)

json_objects = st.dictionaries(storable_text, json_documents, max_size=6)

#: Anything at all, for "no exception outside the hierarchy escapes".
anything: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.decimals(),
        st.text(),
        st.binary(),
        st.complex_numbers(),
        st.just(object()),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.frozensets(st.integers(), max_size=3),
        st.dictionaries(st.one_of(st.text(), st.integers(), st.none()), children, max_size=4),
    ),
    max_leaves=20,
)


# --------------------------------------------------------------------------- stored values
# Valid values as pybatch builds and stores them, for the codec and round-trip properties.

T = TypeVar("T")

#: Identifiers and versions that fit a bigint column.
ids = st.integers(min_value=1, max_value=2**63 - 1)
versions = st.integers(min_value=0, max_value=2**63 - 1)
optional_ids: st.SearchStrategy[int | None] = st.none() | ids
counters = st.one_of(st.sampled_from([0, 1, 2**63 - 1]), st.integers(0, 2**63 - 1))
digests = st.binary(min_size=32, max_size=32)

#: Aware instants at microsecond precision whose UTC form is a Python datetime, in any zone.
instants = st.datetimes(
    min_value=dt.datetime(2, 1, 1),
    max_value=dt.datetime(9998, 12, 31),
    timezones=st.one_of(
        st.just(dt.UTC),
        st.timezones(),
        st.integers(-23 * 60 - 59, 23 * 60 + 59).map(
            lambda minutes: dt.timezone(dt.timedelta(minutes=minutes))
        ),
    ),
)

#: Instants at the edges of Python's datetime range, some of which have no UTC form.
edge_instants = st.builds(
    lambda moment, minutes: moment.replace(tzinfo=dt.timezone(dt.timedelta(minutes=minutes))),
    st.sampled_from([dt.datetime.min, dt.datetime.max, dt.datetime(1, 1, 1, 12)]),
    st.integers(-23 * 60 - 59, 23 * 60 + 59),
)


def built(factory: Callable[[Any], T], source: st.SearchStrategy[Any]) -> st.SearchStrategy[T]:
    """The values `factory` builds from `source`, skipping what it refuses with a typed error."""

    def build(raw: Any) -> T | None:
        try:
            return factory(raw)
        except PyBatchError:
            return None

    return source.map(build).filter(lambda value: value is not None)  # type: ignore[return-value]


_token_text = st.text(
    st.characters(exclude_categories=["Cc", "Cs", "Zs", "Zl", "Zp"]), min_size=1, max_size=24
)
_ascii_token_text = st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)
_mixed_token_text = st.one_of(_ascii_token_text, _token_text)

job_names = built(_names.JobName, _mixed_token_text)
step_names = built(_names.StepName, _mixed_token_text)
node_ids = built(_names.NodeId, _mixed_token_text)
exit_codes = built(
    _names.ExitCode, st.one_of(st.sampled_from(["COMPLETED", "FAILED"]), _token_text)
)
schema_ids = built(_names.StateSchemaId, _mixed_token_text)
revisions = built(_names.DefinitionRevision, _mixed_token_text)
classifier_revisions = built(_names.ClassifierRevision, _mixed_token_text)
actor_refs = st.from_regex(r"[A-Za-z0-9._:@-]{1,128}", fullmatch=True).map(_names.ActorRef)
reason_codes = st.from_regex(r"[A-Z0-9_]{1,64}", fullmatch=True).map(_names.ReasonCode)
operation_ids = st.from_regex(r"[A-Za-z0-9._:-]{1,64}", fullmatch=True).map(_names.OperationId)

schema_versions = st.integers(min_value=1, max_value=2**32 - 1)
#: The schema versions a `*_schema_version` column (integer) can hold.
storable_schema_versions = st.integers(min_value=1, max_value=2**31 - 1)

#: Small JSON objects: state payloads that fit every limit (partition contexts: 4 KiB).
small_json_objects = st.dictionaries(
    storable_text.filter(lambda text: len(text) <= 12),
    st.recursive(
        json_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(
                st.text(max_size=6).filter(lambda k: "\x00" not in k), children, max_size=3
            ),
        ),
        max_leaves=8,
    ),
    max_size=4,
)


def _state(
    cls: Any, limits: StateLimits, versions: st.SearchStrategy[int] = schema_versions
) -> st.SearchStrategy[Any]:
    def build(parts: tuple[_names.StateSchemaId, int, dict[str, Any]]) -> Any:
        schema, version, payload = parts
        return cls(schema, version, payload, limits=limits)

    return built(build, st.tuples(schema_ids, versions, small_json_objects))


checkpoints: st.SearchStrategy[Checkpoint] = _state(Checkpoint, StateLimits.STEP)
step_contexts: st.SearchStrategy[ExecutionContext] = _state(ExecutionContext, StateLimits.STEP)
partition_contexts: st.SearchStrategy[ExecutionContext] = _state(
    ExecutionContext, StateLimits.PARTITION
)
#: Partition contexts a plan can store (schema versions up to 2^31-1, not the whole u32).
storable_partition_contexts: st.SearchStrategy[ExecutionContext] = _state(
    ExecutionContext, StateLimits.PARTITION, storable_schema_versions
)

statuses = st.sampled_from(list(BatchStatus))
failures = st.builds(FailureSummary, st.sampled_from(list(FailureCategory)), ids)
parameter_values = st.one_of(
    built(ParameterValue.string, storable_text),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(ParameterValue.i64),
    st.integers(min_value=0, max_value=2**64 - 1).map(ParameterValue.u64),
    st.booleans().map(ParameterValue.boolean),
)


def _instance_key(parts: tuple[JobName, dict[str, ParameterValue]]) -> JobInstanceKey:
    job, values = parts
    return JobInstanceKey(
        job, JobParameters.from_pairs((name, JobParameter(value)) for name, value in values.items())
    )


#: Job instance keys: a name and up to four identifying parameters of every kind.
instance_keys = built(
    _instance_key,
    st.tuples(
        job_names,
        st.dictionaries(_mixed_token_text, parameter_values, max_size=4),
    ),
)


def _metadata(
    parts: tuple[BatchStatus, ExitCode, dt.datetime, list[dt.timedelta], FailureSummary | None],
) -> ExecutionMetadata:
    status, exit_code, created, gaps, failure = parts
    started = None if status is BatchStatus.STARTING and gaps[0] else created + gaps[1]
    ended = started + gaps[2] if status.is_finished and started is not None else None
    if status.is_finished and ended is None:
        ended = created + gaps[2]
    if status is BatchStatus.FAILED and failure is None:
        failure = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(1))
    return ExecutionMetadata(
        status=status,
        exit_status=exit_code,
        timestamps=ExecutionTimestamps(created, started, ended),
        failure=failure,
    )


_gaps = st.lists(
    st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=3)), min_size=3, max_size=3
)

#: Lifecycle metadata in every status, timestamps in order (counters are zero).
metadata = built(
    _metadata,
    st.tuples(
        statuses,
        exit_codes,
        st.datetimes(
            min_value=dt.datetime(1970, 1, 1),
            max_value=dt.datetime(2200, 1, 1),
            timezones=st.just(dt.UTC),
        ),
        _gaps,
        st.none() | failures,
    ),
)


@st.composite
def rejections(draw: st.DrawFn) -> OperatorRejection:
    """A rejection with exactly the details its code carries."""
    code = draw(st.sampled_from(list(OperatorRejectionCode)))
    return OperatorRejection(
        code=code,
        current_version=draw(versions) if "current_version" in code.details else None,
        status=draw(statuses) if "status" in code.details else None,
        execution_id=JobExecutionId(draw(ids)) if "execution_id" in code.details else None,
    )


@st.composite
def operator_drafts(
    draw: st.DrawFn,
    instance_ids: st.SearchStrategy[int | None] = optional_ids,
    execution_ids: st.SearchStrategy[int | None] = optional_ids,
) -> OperatorRecordDraft:
    """Any operator audit row the domain accepts: every action, outcome and rejection code."""
    outcome = draw(st.sampled_from(list(OperatorOutcomeClass)))
    instance_id, execution_id = draw(instance_ids), draw(execution_ids)
    return OperatorRecordDraft(
        action=draw(st.sampled_from(list(OperatorAction))),
        operation_id=draw(operation_ids),
        actor=draw(actor_refs),
        reason=draw(st.none() | reason_codes),
        digest=RequestDigest(draw(digests)),
        job_instance_id=None if instance_id is None else JobInstanceId(instance_id),
        job_execution_id=None if execution_id is None else JobExecutionId(execution_id),
        observed_version=draw(st.none() | versions),
        prior_status=draw(st.none() | statuses),
        result_status=draw(st.none() | statuses),
        outcome=outcome,
        rejection=draw(rejections()) if outcome is OperatorOutcomeClass.REJECTED else None,
        requested_at=draw(instants),
    )


operator_records = st.builds(
    lambda draft, record_id: OperatorRecord.from_draft(OperatorRequestId(record_id), draft),
    operator_drafts(),
    ids,
)

#: Recovery text fields: 1..64 (reason) or 1..128 (reference) bytes, no control character,
#: no surrounding white space.
recovery_texts = st.text(
    st.characters(exclude_categories=["Cc", "Cs", "Zs", "Zl", "Zp"]), min_size=1, max_size=16
)

recovery_decisions = built(
    lambda parts: RecoveryDecision(
        id=parts[0],
        job_execution_id=parts[1],
        execution_version=parts[2],
        prior_status=parts[3],
        resulting_status=parts[4],
        reason_code=parts[5],
        operator_reference=parts[6],
        evidence_digest=parts[7],
        decided_at=parts[8],
    ),
    st.tuples(
        ids,
        ids,
        versions,
        st.sampled_from([s for s in BatchStatus if s.is_unresolved]),
        st.sampled_from([BatchStatus.FAILED, BatchStatus.ABANDONED]),
        recovery_texts,
        recovery_texts,
        digests,
        instants,
    ),
)

flow_targets = st.one_of(
    node_ids.map(FlowTarget.to_node), st.sampled_from(list(TerminalKind)).map(FlowTarget.end)
)

flow_decisions = st.builds(
    FlowDecision,
    id=ids,
    job_execution_id=ids,
    sequence=ids,
    source_node_id=node_ids,
    source_step_execution_id=st.none() | ids,
    kind=st.sampled_from(list(FlowTransitionKind)),
    observed_outcome=exit_codes,
    target=flow_targets,
    plan_fingerprint=digests,
    input_digest=digests,
    reused_decision_id=st.none() | ids,
    decided_at=instants,
)

partition_keys = built(
    PartitionKey, st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20)
)

partition_counts = st.builds(
    ExecutionCounts,
    read=counters,
    processed=counters,
    written=counters,
    filtered=counters,
    committed=counters,
    rolled_back=counters,
)


@st.composite
def step_partitions(draw: st.DrawFn) -> StepPartition:
    """A stored partition: STARTING exactly when it has no worker."""
    status = draw(statuses)
    return StepPartition(
        id=draw(ids),
        step_execution_id=draw(ids),
        worker_step_execution_id=None if status is BatchStatus.STARTING else draw(ids),
        key=draw(partition_keys),
        ordinal=draw(st.integers(1, MAX_PARTITIONS)),
        status=status,
        exit_status=draw(exit_codes),
        counts=draw(partition_counts),
        context=draw(partition_contexts),
        version=draw(versions),
    )


fault_entries = st.builds(
    FaultEntry,
    key=digests.map(RetryKey),
    phase=st.sampled_from(list(FaultPhase)),
    category=st.sampled_from(list(FailureCategory)),
    ordinal=st.integers(1, 2**16 - 1).map(RetryOrdinal),
    revision=classifier_revisions,
)


@st.composite
def fault_envelopes(draw: st.DrawFn) -> FaultStateEnvelope:
    """An envelope a reservation could have written: sorted unique keys, a non-zero digest."""
    entries = draw(st.lists(fault_entries, max_size=6, unique_by=lambda entry: entry.key))
    if not entries:
        return FaultStateEnvelope.EMPTY
    checkpoint = draw(digests.filter(lambda digest: any(digest)))
    return FaultStateEnvelope(checkpoint, tuple(sorted(entries, key=lambda entry: entry.key)))


#: What a stored column could hold, for the decoders: anything at all, plus the driver's own
#: types (datetimes, bytes, Decimals) and near misses of valid cells (codes of every stored
#: enumeration, digests one byte off, documents, [name, kind] pairs, edge instants).
cells: st.SearchStrategy[Any] = st.one_of(
    anything,
    st.datetimes(timezones=st.one_of(st.none(), st.timezones())),
    edge_instants,
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from(
        [
            member.value
            for enum_cls in (
                BatchStatus,
                FailureCategory,
                OperatorAction,
                OperatorOutcomeClass,
                OperatorRejectionCode,
                FlowTransitionKind,
                TerminalKind,
                FaultPhase,
            )
            for member in enum_cls
        ]
        + ["LIFECYCLE", "DESTRUCTIVE", "READ", "string", "i64", "u64", "bool", "started"]
    ),
    st.binary(min_size=31, max_size=33),
    st.decimals(),
    json_objects,
    st.lists(st.tuples(st.sampled_from(["n", "é"]), anything).map(list), max_size=3),
    st.sampled_from(
        [
            decimal.Decimal("sNaN"),
            decimal.Decimal("NaN"),
            decimal.Decimal("-Infinity"),
            decimal.Decimal("1.5"),
            decimal.Decimal("-0"),
            decimal.Decimal(2**63),
            float("nan"),
            -0.0,
            True,
            False,
            "",
            "\x00",
            [],
            {},
            memoryview(b"\x00" * 32),
            bytearray(32),
        ]
    ),
)
