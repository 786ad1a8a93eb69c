"""Values written through pybatch's operations read back equal, through every read path.

What users rely on: whatever valid value they hand to a writing operation (an operator audit
row, a recovery, a flow decision, a partition plan, a retry reservation, a hold, a definition
with its instance key, a lifecycle transition) is what every read operation and every explorer
projection returns afterwards: equal values, byte-exact digests and documents (compared by
their canonical encodings), instants as the same instant in UTC. Each example writes new rows
of the test's one database under its own job name.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import attrs
import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from pybatch import JobRepository
from pybatch._chunks import load_committed_state
from pybatch._explorer import JobExplorer
from pybatch._fault_state import FaultState, RetryPolicy
from pybatch.values._canonical import canonical_json, sha256
from pybatch.values.chunks import ChunkContext
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.explorer import (
    DefinitionDescriptor,
    ParameterDescriptor,
    ParameterFilter,
    RetentionHold,
)
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    FaultStateEnvelope,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.flow import FlowDecisionRequest, FlowTarget, FlowTransitionKind
from pybatch.values.ids import JobExecutionId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    ActorRef,
    DefinitionRevision,
    ExitCode,
    JobName,
    NodeId,
    OperationId,
    ReasonCode,
    StepName,
)
from pybatch.values.operator import OperatorRecord, OperatorRecordDraft
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.partitions import PartitionPlanEntry
from pybatch.values.records import StepExecution
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.properties import strategies as s
from tests.properties.launching import launch, unique_key
from tests.support.clock import ManualClock
from tests.support.owners import TEST_OWNER
from tests.support.rows import write_exit_code
from tests.support.statements import create_step

S = BatchStatus
DB_EXAMPLES = settings(max_examples=20)
_runs = itertools.count(1)

#: A zone for instants handed to operations: UTC, a fixed offset or a named zone.
zones = st.one_of(
    st.just(dt.UTC),
    st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m))),
    st.timezones(),
)
gaps = st.timedeltas(dt.timedelta(microseconds=1), dt.timedelta(days=30))


def _started_step(repository: JobRepository, clock: ManualClock) -> StepExecution:
    execution = launch(repository, clock, unique_key("steps"))
    with repository.begin() as uow:
        step = create_step(uow, execution.id, StepName("load"))
        step = uow.steps.transition(step.id, 0, LifecycleTransition.new(S.STARTED, clock.advance()))
        uow.commit()
    return step


# --------------------------------------------------------------------------- operator requests


def test_operator_requests_read_back_equal(repository: JobRepository, clock: ManualClock) -> None:
    execution = launch(repository, clock, unique_key("operator"))
    explorer = JobExplorer(repository)
    drafts = s.operator_drafts(
        instance_ids=st.sampled_from([None, execution.job_instance_id]),
        execution_ids=st.sampled_from([None, execution.id]),
    )

    @DB_EXAMPLES
    @given(draft=drafts)
    def append_and_read(draft: OperatorRecordDraft) -> None:
        # Each example its own idempotency key: the pair (action, operation id) is unique.
        unique = OperationId(f"{next(_runs)}.{draft.operation_id.value}"[:64])
        draft = attrs.evolve(draft, operation_id=unique)
        with repository.begin() as uow:
            record = uow.operator_requests.append(draft)
            uow.commit()
        assert record == OperatorRecord.from_draft(record.id, draft)
        with repository.begin() as uow:
            assert uow.operator_requests.find(draft.action, unique) == record
        if draft.job_execution_id is not None:
            listed = _all_items(lambda after: explorer.operator_requests(execution.id, after=after))
            assert [item for item in listed if item.id == record.id] == [record]

    append_and_read()


def _all_items(page_of: Any) -> list[Any]:
    items: list[Any] = []
    cursor = None
    while True:
        page = page_of(cursor)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return items


# --------------------------------------------------------------------------- recovery


@DB_EXAMPLES
@given(
    prior=st.sampled_from([(), (S.STARTED,), (S.STARTED, S.STOPPING), (S.STARTED, S.UNKNOWN)]),
    mark_failed=st.booleans(),
    reason=s.recovery_texts,
    reference=s.recovery_texts,
    evidence=s.digests,
    failure=s.failures,
)
def test_recovery_decisions_read_back_equal(
    repository: JobRepository,
    clock: ManualClock,
    prior: tuple[BatchStatus, ...],
    mark_failed: bool,
    reason: str,
    reference: str,
    evidence: bytes,
    failure: FailureSummary,
) -> None:
    execution = launch(repository, clock, unique_key("recovery"), path=prior)
    request = RecoveryRequest(
        expected_version=execution.version,
        reason_code=reason,
        operator_reference=reference,
        evidence_digest=evidence,
        failure=failure if mark_failed else None,
    )
    clock.advance()
    with repository.begin() as uow:
        result = uow.recovery.recover(execution.id, request)
        uow.commit()
    decision = result.decision
    assert (decision.reason_code, decision.operator_reference) == (reason, reference)
    assert decision.evidence_digest == evidence
    assert (decision.prior_status, decision.resulting_status) == (
        execution.status,
        BatchStatus.FAILED if mark_failed else BatchStatus.ABANDONED,
    )
    with repository.begin() as uow:
        assert uow.recovery.decision(execution.id) == decision
        assert uow.executions.get(execution.id) == result.execution
    assert result.execution.metadata.failure == request.failure
    page = JobExplorer(repository).recovery_decisions(execution.id)
    assert page.items == (decision,)


# --------------------------------------------------------------------------- flow decisions


@st.composite
def decision_chains(draw: st.DrawFn) -> list[tuple[NodeId, ExitCode, Any]]:
    """Decision nodes d1 -> d2 -> ... each deciding on an outcome; the last one ends or goes on."""
    nodes = draw(st.lists(s.node_ids, min_size=1, max_size=3, unique_by=lambda n: n.value))
    outcomes = draw(st.lists(s.exit_codes, min_size=len(nodes), max_size=len(nodes)))
    last = draw(s.flow_targets)
    targets = [*(FlowTarget.to_node(node) for node in nodes[1:]), last]
    return list(zip(nodes, outcomes, targets, strict=True))


def _flow_manifest(chain: list[tuple[NodeId, ExitCode, Any]]) -> dict[str, Any]:
    transitions = []
    for node, outcome, target in chain:
        transition: dict[str, Any] = {"source": node.value, "pattern": outcome.value}
        if target.node is not None:
            transition["to"] = target.node.value
        else:
            transition["end"] = target.terminal.value.lower()
        transitions.append(transition)
    return {
        "format": 2,
        "nodes": [{"id": node.value, "kind": "decision"} for node, _, _ in chain],
        "transitions": transitions,
    }


@DB_EXAMPLES
@given(chain=decision_chains(), inputs=st.lists(s.digests, min_size=3, max_size=3), data=st.data())
def test_flow_decisions_read_back_equal(
    repository: JobRepository,
    clock: ManualClock,
    chain: list[tuple[NodeId, ExitCode, Any]],
    inputs: list[bytes],
    data: st.DataObject,
) -> None:
    key = unique_key("flows")
    definition = DefinitionIdentity.from_manifest(
        key.job_name, DefinitionRevision("r1"), _flow_manifest(chain)
    )
    execution = launch(repository, clock, key, definition=definition)
    decisions = []
    for sequence, ((node, outcome, target), input_digest) in enumerate(
        zip(chain, inputs, strict=False), 1
    ):
        request = FlowDecisionRequest(
            job_execution_id=execution.id,
            sequence=sequence,
            source_node_id=node,
            kind=FlowTransitionKind.DECIDER,
            observed_outcome=outcome,
            target=target,
            plan_fingerprint=definition.digest,
            input_digest=input_digest,
            decided_at=data.draw(s.instants, label="decided_at"),
        )
        with repository.begin() as uow:
            decisions.append(uow.flow.append_decision(request))
            uow.commit()
    with repository.begin() as uow:
        assert uow.flow.decisions(execution.id) == decisions
    assert list(JobExplorer(repository).flow_decisions(execution.id).items) == decisions


# --------------------------------------------------------------------------- partitions


@DB_EXAMPLES
@given(
    entries=st.lists(
        st.builds(PartitionPlanEntry, s.partition_keys, s.storable_partition_contexts),
        min_size=1,
        max_size=8,
        unique_by=lambda entry: entry.key.value,
    )
)
def test_partition_plans_read_back_equal(
    repository: JobRepository, clock: ManualClock, entries: list[PartitionPlanEntry]
) -> None:
    parent = _started_step(repository, clock)
    with repository.begin() as uow:
        created = uow.partitions.create_plan(parent.id, entries)
        uow.commit()
    assert [(p.ordinal, p.key) for p in created] == [
        (ordinal, entry.key) for ordinal, entry in enumerate(entries, 1)
    ]
    for partition, entry in zip(created, entries, strict=True):
        assert partition.context.encode() == entry.context.encode()
        assert (partition.status, partition.worker_step_execution_id) == (S.STARTING, None)
    with repository.begin() as uow:
        plan = uow.partitions.plan(parent.id)
    assert plan == sorted(created, key=lambda p: p.key.sort_key)
    assert [p.context.encode() for p in plan] == [
        p.context.encode() for p in sorted(created, key=lambda p: p.key.sort_key)
    ]
    projections = JobExplorer(repository).step_partitions(parent.id).items
    assert [
        (p.id, p.partition_key, p.ordinal, p.status, p.version, p.worker_step_execution_id)
        for p in projections
    ] == [
        (p.id, p.key.value, p.ordinal, p.status, p.version, None)
        for p in sorted(created, key=lambda p: p.id)
    ]
    by_id = {p.id: p for p in created}
    for projection in projections:
        context = by_id[projection.id].context
        assert projection.context.schema_id == context.schema.value
        assert projection.context.schema_version == context.schema_version
        assert projection.context.format_version == 1


# --------------------------------------------------------------------------- fault state

RESERVABLE = [FaultPhase.READ, FaultPhase.PROCESS, FaultPhase.WRITE]
POLICY = RetryPolicy(RetryLimit(2**16 - 1), RetryStateLimit(256))


@st.composite
def reservations(draw: st.DrawFn) -> list[FaultEntry]:
    """Reservations a step could make in order: each key's ordinals count up from 1."""
    keys = draw(st.lists(s.digests.map(RetryKey), min_size=1, max_size=4, unique=True))
    picks = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=8))
    spent: dict[RetryKey, int] = {}
    entries = []
    for key in picks:
        spent[key] = spent.get(key, 0) + 1
        entries.append(
            FaultEntry(
                key=key,
                phase=draw(st.sampled_from(RESERVABLE)),
                category=draw(st.sampled_from(list(FailureCategory))),
                ordinal=RetryOrdinal(spent[key]),
                revision=draw(s.classifier_revisions),
            )
        )
    return entries


@DB_EXAMPLES
@given(entries=reservations())
def test_retry_reservations_read_back_equal(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    entries: list[FaultEntry],
) -> None:
    step = _started_step(repository, clock)
    context = ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
    digest = load_committed_state(repository, context).checkpoint.generation_digest()
    fault_state = FaultState(repository, POLICY)
    fault_state.bind(context)
    expected = FaultStateEnvelope.EMPTY
    for entry in entries:
        fault_state.reserve(entry)
        expected = expected.reserved(entry, digest, POLICY.state_limit)
    stored = load_committed_state(repository, context).fault_state
    assert stored == expected
    assert stored.canonical_bytes() == expected.canonical_bytes()
    row = admin.execute(
        "SELECT fault_state_payload, fault_state_checksum FROM pybatch.step_execution"
        " WHERE id = %s",
        (step.id,),
    ).fetchone()
    assert row is not None
    assert canonical_json(row[0]) == expected.canonical_bytes()
    assert bytes(row[1]) == sha256(expected.canonical_bytes())
    for entry in entries:
        assert fault_state.reserved_ordinal(entry.key) == expected.ordinal_for(entry.key)


# --------------------------------------------------------------------------- holds


@DB_EXAMPLES
@given(actor=s.actor_refs, reason=s.reason_codes, placed_at=s.instants)
def test_holds_read_back_equal(
    repository: JobRepository,
    clock: ManualClock,
    actor: ActorRef,
    reason: ReasonCode,
    placed_at: dt.datetime,
) -> None:
    key = unique_key("holds")
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        placed, _ = uow.holds.place_unless_held(instance.id, actor, reason, placed_at)
        uow.commit()
    assert (placed.actor, placed.reason, placed.placed_at) == (actor, reason, placed_at)
    with repository.begin() as uow:
        assert uow.holds.get(instance.id) == placed
    (projection,) = JobExplorer(repository).instances(key.job_name.value).items
    assert projection.hold == RetentionHold(actor.value, reason.value, placed_at)
    assert projection.hold.placed_at.utcoffset() == dt.timedelta(0)
    with repository.begin() as uow:
        assert uow.holds.release(instance.id) == placed
        assert uow.holds.get(instance.id) is None
        uow.commit()


# ------------------------------------------------------------------- definitions and instances


def _manifests() -> st.SearchStrategy[dict[str, Any]]:
    without_floats = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), s.storable_text),
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(s.storable_text, children, max_size=4)
        ),
        max_leaves=20,
    )
    return st.builds(
        lambda body, manifest_format: {**body, "format": manifest_format},
        st.dictionaries(s.storable_text, without_floats, max_size=5),
        st.integers(1, 3),
    )


@DB_EXAMPLES
@given(key=s.instance_keys, revision=s.revisions, manifest=_manifests())
def test_definitions_and_instances_read_back_equal(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    key: JobInstanceKey,
    revision: DefinitionRevision,
    manifest: dict[str, Any],
) -> None:
    key = JobInstanceKey(JobName(f"d{next(_runs)}-{key.job_name.value}"), key.parameters)
    definition = DefinitionIdentity.from_manifest(key.job_name, revision, manifest)
    execution = launch(repository, clock, key, definition=definition, path=())
    stored = admin.execute(
        "SELECT manifest, manifest_digest, manifest_format FROM pybatch.job_definition"
        " WHERE id = %s",
        (execution.definition_id,),
    ).fetchone()
    assert stored is not None
    assert canonical_json(stored[0]) == definition.canonical_manifest == canonical_json(manifest)
    assert (bytes(stored[1]), stored[2]) == (definition.digest, manifest["format"])
    projection = JobExplorer(repository).execution(execution.id)
    assert projection is not None
    assert projection.definition == DefinitionDescriptor(
        revision.value, manifest["format"], sha256(canonical_json(manifest))
    )
    with repository.begin() as uow:
        instance = uow.instances.find(key)
    assert instance is not None
    assert (instance.job_name, instance.parameters) == (key.job_name, key.parameters)
    assert instance.instance_key == key.digest()
    (listed,) = JobExplorer(repository).instances(key.job_name.value).items
    assert listed.instance_key_digest == key.digest()
    assert listed.parameters == tuple(
        sorted(
            (
                ParameterDescriptor(name.value, p.kind.json_tag, p.value.value)
                for name, p in key.parameters.items()
            ),
            key=lambda descriptor: descriptor.name.encode(),
        )
    )
    assert projection.parameters == listed.parameters
    # Each value, as an operator types it, finds the instance whatever its stored kind.
    texts = [
        (d.name, str(d.value).lower() if d.kind == "bool" else str(d.value))
        for d in listed.parameters
    ]
    for chosen in (texts[:8], texts[-1:]) if texts else ():
        found = JobExplorer(repository).instances(
            key.job_name.value, parameters=ParameterFilter(tuple(chosen))
        )
        assert [item.id for item in found.items] == [listed.id]


# --------------------------------------------------------------------------- lifecycle


@DB_EXAMPLES
@given(
    path=st.sampled_from(
        [
            (S.STARTED, S.COMPLETED),
            (S.STARTED, S.FAILED),
            (S.STARTED, S.STOPPING, S.STOPPED),
            (S.STARTED, S.UNKNOWN),
            (S.STOPPING,),
        ]
    ),
    steps=st.lists(st.tuples(gaps, zones), min_size=3, max_size=3),
    failure=s.failures,
    exit_code=s.exit_codes,
)
def test_lifecycle_transitions_read_back_equal(
    repository: JobRepository,
    clock: ManualClock,
    path: tuple[BatchStatus, ...],
    steps: list[tuple[dt.timedelta, Any]],
    failure: FailureSummary,
    exit_code: ExitCode,
) -> None:
    execution = launch(repository, clock, unique_key("lifecycle"), path=())
    with repository.begin() as uow:
        for target, (gap, zone) in zip(path, steps, strict=False):
            at = clock.advance(gap).astimezone(zone)
            transition = (
                LifecycleTransition.failed(at, failure)
                if target is S.FAILED
                else LifecycleTransition.new(target, at)
            )
            execution = uow.executions.transition(execution.id, execution.version, transition)
            assert execution.metadata.timestamps.started_at is None or (
                execution.metadata.timestamps.started_at.utcoffset() == dt.timedelta(0)
            )
        execution = write_exit_code(uow, execution, exit_code.value)
        uow.commit()
    assert execution.metadata.exit_status == exit_code
    with repository.begin() as uow:
        assert uow.executions.get(execution.id) == execution
        assert uow.executions.of_instance(execution.job_instance_id) == [execution]
    projection = JobExplorer(repository).execution(execution.id)
    assert projection is not None
    timestamps = execution.metadata.timestamps
    assert (projection.status, projection.exit_code, projection.failure) == (
        execution.status,
        exit_code.value,
        execution.metadata.failure,
    )
    assert (projection.created_at, projection.started_at, projection.ended_at) == (
        timestamps.created_at,
        timestamps.started_at,
        timestamps.ended_at,
    )
    assert (projection.updated_at, projection.version, projection.attempt) == (
        execution.updated_at,
        execution.version,
        execution.attempt,
    )
    assert JobExecutionId(projection.id) == execution.id
