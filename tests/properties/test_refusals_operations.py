"""Writing operations refuse invalid input with their documented error and change nothing.

What users rely on: an operation handed something it must not store (an unknown or
out-of-range id, a stale version, a repeated idempotency key, a flow decision its manifest
does not lead to, a bad partition plan, a retry ordinal out of turn, a drifted definition,
an illegal transition, an instant with no UTC form) raises the typed error its docstring
names, from the `pybatch.errors` hierarchy and nothing else, and the database holds exactly
what it held before (row counts and the touched rows are compared).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import psycopg
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pybatch import JobRepository
from pybatch._fault_state import FaultState, RetryPolicy
from pybatch.errors import (
    CapacityExhausted,
    ConcurrentModification,
    DefinitionDrift,
    DefinitionJobMismatch,
    DuplicatePartitionKey,
    EmptyPartitionPlan,
    FlowStateCorrupt,
    IdentifierOutOfRange,
    IllegalTransition,
    IntegrityViolation,
    InvalidTransitionTime,
    JobExecutionNotFound,
    JobInstanceNotFound,
    NaiveTimestamp,
    NegativeIdentifier,
    PartitionParentNotActive,
    PartitionPlanExists,
    PartitionPlanTooLarge,
    PyBatchError,
    RecoveryNotAllowed,
    RepositoryDomainError,
    StaleReservation,
    StaleVersion,
    StepExecutionNotFound,
    TimestampOutOfRange,
    UnsupportedManifestVersion,
    ZeroIdentifier,
)
from pybatch.values.chunks import ChunkContext
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.flow import FlowDecisionRequest, FlowTarget, FlowTransitionKind, TerminalKind
from pybatch.values.ids import INT64_MAX, JobExecutionId, JobInstanceId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    ActorRef,
    ClassifierRevision,
    DefinitionRevision,
    ExitCode,
    JobName,
    NodeId,
    OperationId,
    ReasonCode,
    StepName,
)
from pybatch.values.operator import OperatorRecordDraft
from pybatch.values.partitions import MAX_PARTITIONS, PartitionPlanEntry
from pybatch.values.records import StepExecution
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.state import ExecutionContext
from pybatch.values.status import BatchStatus, FailureCategory
from tests.properties import strategies as s
from tests.properties.launching import launch, unique_key
from tests.support.clock import ManualClock
from tests.support.owners import TEST_OWNER
from tests.support.statements import create_step

S = BatchStatus
DB_EXAMPLES = settings(max_examples=25)
_runs = itertools.count(1)

TABLES = (
    "job_definition",
    "job_instance",
    "job_execution",
    "step_execution",
    "step_partition",
    "flow_decision",
    "recovery_decision",
    "operator_request",
    "definition_upgrade",
    "audit_chain",
    "audit_chain_head",
)


def _snapshot(admin: psycopg.Connection[Any]) -> dict[str, Any]:
    """Row counts of every table an operation below writes, and a digest of their contents."""
    counts = {}
    for table in TABLES:
        row = admin.execute(
            f"SELECT COUNT(*), MD5(COALESCE(STRING_AGG(t::text, '|' ORDER BY t::text), ''))"
            f" FROM pybatch.{table} AS t"
        ).fetchone()
        assert row is not None
        counts[table] = tuple(row)
    return counts


@contextmanager
def refused(admin: psycopg.Connection[Any], *expected: type[PyBatchError]) -> Iterator[None]:
    """The block raises one of `expected` (and nothing else), and the database is unchanged."""
    before = _snapshot(admin)
    with pytest.raises(PyBatchError) as raised:
        yield
    error = raised.value
    # Inside a unit of work a refused domain value is RepositoryDomainError(error=...).
    cause = error.error if isinstance(error, RepositoryDomainError) else error
    assert isinstance(cause, expected), f"{type(error).__name__}, expected one of {expected}"
    assert _snapshot(admin) == before


def _write(repository: JobRepository, operation: Callable[[Any], object]) -> object:
    """Run one writing operation in its own unit of work and commit it."""
    with repository.begin() as uow:
        result = operation(uow)
        uow.commit()
    return result


#: Ids no row has: zero, negative, above bigint, above u64, or simply never issued.
absent_ids = st.one_of(
    st.sampled_from([0, -1, -(2**63), INT64_MAX + 1, 2**64, 2**64 + 1]),
    st.integers(min_value=10**12, max_value=INT64_MAX),
)
ID_ERRORS = (ZeroIdentifier, NegativeIdentifier, IdentifierOutOfRange)


# --------------------------------------------------------------------------- operator requests


def test_operator_requests_refuse_a_repeated_key_and_a_missing_target(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    drafts = s.operator_drafts(st.none(), st.none())

    @DB_EXAMPLES
    @given(
        draft=drafts,
        other=drafts,
        missing=st.integers(10**12, INT64_MAX),
        target=st.sampled_from(["instance", "execution", "repeat"]),
    )
    def append(
        draft: OperatorRecordDraft, other: OperatorRecordDraft, missing: int, target: str
    ) -> None:
        draft = attrs.evolve(draft, operation_id=OperationId(f"r{next(_runs)}"))
        if target == "repeat":
            _write(repository, lambda uow: uow.operator_requests.append(draft))
            # The same (action, operation id) with any other content.
            repeated = attrs.evolve(other, action=draft.action, operation_id=draft.operation_id)
            with refused(admin, ConcurrentModification):
                _write(repository, lambda uow: uow.operator_requests.append(repeated))
        else:
            dangling = (
                attrs.evolve(draft, job_instance_id=JobInstanceId(missing))
                if target == "instance"
                else attrs.evolve(draft, job_execution_id=JobExecutionId(missing))
            )
            with refused(admin, IntegrityViolation):
                _write(repository, lambda uow: uow.operator_requests.append(dangling))

    append()


# --------------------------------------------------------------------------- recovery


@DB_EXAMPLES
@given(
    case=st.sampled_from(["stale", "finished", "absent"]),
    finished=st.sampled_from(
        [(S.STARTED, S.COMPLETED), (S.STARTED, S.FAILED), (S.STARTED, S.STOPPING, S.STOPPED)]
    ),
    offset=st.integers(1, 5),
    absent=absent_ids,
    evidence=s.digests,
)
def test_recovery_refuses_stale_finished_and_absent_executions(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    finished: tuple[BatchStatus, ...],
    offset: int,
    absent: int,
    evidence: bytes,
) -> None:
    path = finished if case == "finished" else (S.STARTED,)
    execution = launch(repository, clock, unique_key("recovery"), path)
    version = execution.version + offset if case == "stale" else execution.version
    request = RecoveryRequest(version, "REASON", "operator", evidence)
    target = absent if case == "absent" else execution.id
    expected = {
        "stale": (StaleVersion,),
        "finished": (RecoveryNotAllowed,),
        "absent": (JobExecutionNotFound, *ID_ERRORS),
    }[case]
    with refused(admin, *expected):
        _write(repository, lambda uow: uow.recovery.recover(target, request))


# --------------------------------------------------------------------------- flow decisions

MANIFEST = {
    "format": 2,
    "nodes": [{"id": "check", "kind": "decision"}],
    "transitions": [
        {"source": "check", "pattern": "GO", "to": "load"},
        {"source": "check", "pattern": "*", "end": "fail"},
    ],
}


@DB_EXAMPLES
@given(
    case=st.sampled_from(["fingerprint", "target", "node", "sequence", "absent"]),
    outcome=s.exit_codes,
    digest=s.digests,
    sequence=st.integers(2, INT64_MAX),
    absent=st.integers(10**12, INT64_MAX),
    at=s.instants,
)
def test_flow_decisions_refuse_what_the_manifest_does_not_lead_to(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    outcome: ExitCode,
    digest: bytes,
    sequence: int,
    absent: int,
    at: dt.datetime,
) -> None:
    key = unique_key("flows")
    definition = DefinitionIdentity.from_manifest(key.job_name, DefinitionRevision("r1"), MANIFEST)
    execution = launch(repository, clock, key, definition=definition)
    # The manifest's own answer for this outcome, then one thing changed per case.
    target = (
        FlowTarget.to_node("load") if outcome.value == "GO" else FlowTarget.end(TerminalKind.FAIL)
    )
    wrong_target = (
        FlowTarget.end(TerminalKind.COMPLETE)
        if target.node is not None
        else FlowTarget.to_node("load")
    )
    request = FlowDecisionRequest(
        job_execution_id=absent if case == "absent" else execution.id,
        sequence=sequence if case == "sequence" else 1,
        source_node_id=NodeId("elsewhere" if case == "node" else "check"),
        kind=FlowTransitionKind.DECIDER,
        observed_outcome=outcome,
        target=wrong_target if case == "target" else target,
        plan_fingerprint=digest if case == "fingerprint" else definition.digest,
        input_digest=digest,
        decided_at=at,
    )
    expected = {
        "fingerprint": (FlowStateCorrupt,),
        "target": (FlowStateCorrupt,),
        "node": (FlowStateCorrupt,),
        "sequence": (ConcurrentModification,),
        "absent": (JobExecutionNotFound,),
    }[case]
    with refused(admin, *expected):
        _write(repository, lambda uow: uow.flow.append_decision(request))


# --------------------------------------------------------------------------- partitions


def _step(
    repository: JobRepository, clock: ManualClock, path: tuple[BatchStatus, ...] = (S.STARTED,)
) -> StepExecution:
    execution = launch(repository, clock, unique_key("steps"))
    with repository.begin() as uow:
        step = create_step(uow, execution.id, StepName("load"))
        for target in path:
            step = uow.steps.transition(
                step.id, step.version, LifecycleTransition.new(target, clock.advance())
            )
        uow.commit()
    return step


TOO_LARGE_PLAN = [
    PartitionPlanEntry(f"k{index}", ExecutionContext.empty()) for index in range(MAX_PARTITIONS + 1)
]


@DB_EXAMPLES
@given(
    case=st.sampled_from(["empty", "duplicate", "too large", "exists", "inactive", "absent"]),
    entries=st.lists(
        st.builds(PartitionPlanEntry, s.partition_keys, s.storable_partition_contexts),
        min_size=1,
        max_size=5,
        unique_by=lambda entry: entry.key.value,
    ),
    absent=absent_ids,
)
def test_partition_plans_refuse_bad_entries_and_parents(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    entries: list[PartitionPlanEntry],
    absent: int,
) -> None:
    parent = _step(
        repository, clock, (S.STARTED, S.COMPLETED) if case == "inactive" else (S.STARTED,)
    )
    if case == "exists":
        _write(repository, lambda uow: uow.partitions.create_plan(parent.id, entries))
    plan: list[PartitionPlanEntry] = {
        "empty": [],
        "duplicate": [*entries, entries[-1]],
        "too large": TOO_LARGE_PLAN,
    }.get(case, entries)
    target = absent if case == "absent" else parent.id
    expected = {
        "empty": (EmptyPartitionPlan,),
        "duplicate": (DuplicatePartitionKey,),
        "too large": (PartitionPlanTooLarge,),
        "exists": (PartitionPlanExists,),
        "inactive": (PartitionParentNotActive,),
        "absent": (StepExecutionNotFound, *ID_ERRORS),
    }[case]
    with refused(admin, *expected):
        _write(repository, lambda uow: uow.partitions.create_plan(target, plan))


# --------------------------------------------------------------------------- fault state


def _entry(key: RetryKey, ordinal: int, phase: FaultPhase = FaultPhase.PROCESS) -> FaultEntry:
    return FaultEntry(
        key=key,
        phase=phase,
        category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
        ordinal=RetryOrdinal(ordinal),
        revision=ClassifierRevision("classifier-1"),
    )


@DB_EXAMPLES
@given(
    case=st.sampled_from(["ordinal", "capacity"]),
    keys=st.lists(s.digests.map(RetryKey), min_size=3, max_size=3, unique=True),
    ordinal=st.integers(0, 2**16 - 1),
)
def test_retry_reservations_refuse_out_of_turn_ordinals(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    keys: list[RetryKey],
    ordinal: int,
) -> None:
    step = _step(repository, clock)
    fault_state = FaultState(repository, RetryPolicy(RetryLimit(2**16 - 1), RetryStateLimit(2)))
    fault_state.bind(ChunkContext(step.id, step.job_execution_id, TEST_OWNER))
    fault_state.reserve(_entry(keys[0], 1))
    fault_state.reserve(_entry(keys[1], 1))
    expected: type[PyBatchError]
    if case == "ordinal":
        assume(ordinal != 2)  # 2 is the one ordinal that follows the stored one
        entry, expected = _entry(keys[0], ordinal), StaleReservation
    else:
        entry, expected = _entry(keys[2], 1), CapacityExhausted
    with refused(admin, expected):
        fault_state.reserve(entry)
    assert fault_state.reserved_ordinal(keys[0]) == RetryOrdinal(1)


# --------------------------------------------------------------------------- holds


def _has_utc_form(moment: dt.datetime) -> bool:
    try:
        moment.astimezone(dt.UTC)
    except OverflowError:
        return False
    return True


@DB_EXAMPLES
@given(
    case=st.sampled_from(["absent", "no UTC form", "naive"]),
    absent=absent_ids,
    edge=s.edge_instants,
)
def test_holds_refuse_absent_instances_and_instants_without_a_utc_form(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    absent: int,
    edge: dt.datetime,
) -> None:
    key = unique_key("holds")
    instance_id = launch(repository, clock, key, path=()).job_instance_id
    placed_at = {"naive": edge.replace(tzinfo=None), "no UTC form": edge}.get(case, clock.now())
    if case == "no UTC form":
        assume(not _has_utc_form(edge))  # otherwise the hold is valid
    target = absent if case == "absent" else instance_id
    expected = {
        "absent": (JobInstanceNotFound, *ID_ERRORS),
        "no UTC form": (TimestampOutOfRange,),
        "naive": (NaiveTimestamp,),
    }[case]
    with refused(admin, *expected):
        _write(
            repository,
            lambda uow: uow.holds.place_unless_held(
                target, ActorRef("ops"), ReasonCode("AUDIT"), placed_at
            ),
        )
    with repository.begin() as uow:
        assert uow.holds.get(instance_id) is None


# --------------------------------------------------------------------------- definitions


@DB_EXAMPLES
@given(
    case=st.sampled_from(["drift", "format", "other job"]),
    manifest_format=st.one_of(st.just(0), st.integers(4, 2**16 - 1)),
    body=st.dictionaries(s.storable_text, st.integers(-(10**6), 10**6), min_size=1, max_size=4),
)
def test_definitions_refuse_drift_unknown_formats_and_other_jobs(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    manifest_format: int,
    body: dict[str, int],
) -> None:
    key = unique_key("definitions")
    first = DefinitionIdentity.from_manifest(key.job_name, DefinitionRevision("r1"), {"format": 1})
    execution = launch(
        repository, clock, key, path=(S.STARTED, S.STOPPING, S.STOPPED), definition=first
    )
    manifest = {**body, "format": manifest_format if case == "format" else 1}
    job = JobName(f"other.{next(_runs)}") if case == "other job" else key.job_name
    revision = DefinitionRevision("r1" if case == "drift" else "r2")
    assume(case != "drift" or manifest != {"format": 1})  # the registered one: no drift
    definition = DefinitionIdentity.from_manifest(job, revision, manifest)
    expected = {
        "drift": DefinitionDrift,
        "format": UnsupportedManifestVersion,
        "other job": DefinitionJobMismatch,
    }[case]
    with refused(admin, expected):
        _write(
            repository,
            lambda uow: uow.executions.create(execution.job_instance_id, definition),
        )


# --------------------------------------------------------------------------- lifecycle


@DB_EXAMPLES
@given(
    case=st.sampled_from(["illegal", "stale", "before creation"]),
    target=st.sampled_from(list(BatchStatus)),
    offset=st.integers(1, 10),
    earlier=st.timedeltas(dt.timedelta(microseconds=1), dt.timedelta(days=365)),
)
def test_transitions_refuse_illegal_stale_and_backdated_changes(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    case: str,
    target: BatchStatus,
    offset: int,
    earlier: dt.timedelta,
) -> None:
    path = {"illegal": (S.STARTED, S.COMPLETED), "stale": (S.STARTED,), "before creation": ()}
    execution = launch(repository, clock, unique_key("lifecycle"), path[case])
    version = execution.version
    expected: type[PyBatchError]
    if case == "illegal":
        # COMPLETED is terminal: every transition out of it is illegal.
        transition, expected = LifecycleTransition.new(target, clock.advance()), IllegalTransition
    elif case == "stale":
        version += offset
        transition, expected = LifecycleTransition.new(S.COMPLETED, clock.advance()), StaleVersion
    else:
        transition = LifecycleTransition.new(S.STARTED, execution.created_at - earlier)
        expected = InvalidTransitionTime
    with refused(admin, expected):
        _write(
            repository,
            lambda uow: uow.executions.transition(execution.id, version, transition),
        )
