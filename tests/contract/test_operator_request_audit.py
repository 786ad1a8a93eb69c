"""Operator request audit and idempotency (H1, H2, H13, H15, L4).

Only `find_operator_request` and `append_operator_request` are exercised here; the operator
service's scenarios build on them. Two rules are checked on the way:
every code is storable, every rejection detail round-trips, and only the identity key's
unique violation is ConcurrentModification.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from datetime import timedelta
from typing import Any, TypeVar

import attrs
import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch._codecs.operator import decode_operator_record
from pybatch.errors import (
    CompletedInstance,
    ConcurrentModification,
    ExecutionAlreadyActive,
    IllegalTransition,
    IntegrityViolation,
    RecoveryNotAllowed,
    RestartStateNotFound,
    StaleVersion,
    Unavailable,
)
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import FailureId, JobExecutionId, JobInstanceId
from pybatch.values.names import ActorRef, JobName, OperationId, ReasonCode
from pybatch.values.operator import (
    AuthorizationClass,
    OperatorAction,
    OperatorOutcomeClass,
    OperatorRecord,
    OperatorRecordDraft,
    OperatorRejection,
    OperatorRejectionCode,
    RecoveryArguments,
    RequestDigest,
    RequestTarget,
)
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.race import Contender, race_units_of_work

S = BatchStatus
A = OperatorAction
Code = OperatorRejectionCode
Outcome = OperatorOutcomeClass
TABLE = "pybatch.operator_request"

_V = TypeVar("_V")
_operations = itertools.count(1)
_runs = itertools.count(1)

#: One rejection per code, each with the details its code carries (details are stored losslessly).
EVERY_REJECTION: dict[OperatorRejectionCode, OperatorRejection] = {
    Code.OPTIMISTIC_CONFLICT: OperatorRejection(Code.OPTIMISTIC_CONFLICT, current_version=7),
    Code.INVALID_STATE: OperatorRejection(Code.INVALID_STATE, status=S.UNKNOWN),
    Code.INSTANCE_COMPLETED: OperatorRejection(Code.INSTANCE_COMPLETED),
    Code.INSTANCE_ABANDONED: OperatorRejection(Code.INSTANCE_ABANDONED),
    Code.EXECUTION_ALREADY_ACTIVE: OperatorRejection(
        Code.EXECUTION_ALREADY_ACTIVE, execution_id=JobExecutionId(2**63 - 1), status=S.STOPPING
    ),
    Code.INCOMPATIBLE_DEFINITION: OperatorRejection(Code.INCOMPATIBLE_DEFINITION),
    Code.RESTART_WITHOUT_PRIOR_ATTEMPT: OperatorRejection(Code.RESTART_WITHOUT_PRIOR_ATTEMPT),
    Code.START_LIMIT_EXCEEDED: OperatorRejection(Code.START_LIMIT_EXCEEDED),
    Code.UNRESOLVED_RECOVERY_REQUIRED: OperatorRejection(Code.UNRESOLVED_RECOVERY_REQUIRED),
    Code.EXECUTION_NOT_FOUND: OperatorRejection(Code.EXECUTION_NOT_FOUND),
    Code.INSTANCE_NOT_FOUND: OperatorRejection(Code.INSTANCE_NOT_FOUND),
    Code.UNSUPPORTED_ACTION: OperatorRejection(Code.UNSUPPORTED_ACTION),
}


# --------------------------------------------------------------------------- helpers


def new_operation_id() -> OperationId:
    return OperationId(f"op-{next(_operations)}")


def digest_of(action: OperatorAction, target: str = "execution:1") -> RequestDigest:
    return RequestDigest.compute(action, RequestTarget(target), expected_version=0)


def draft(clock: ManualClock, **fields: Any) -> OperatorRecordDraft:
    """An APPLIED LAUNCH with no target, unless `fields` say otherwise."""
    action = fields.get("action", A.LAUNCH)
    values: dict[str, Any] = {
        "action": action,
        "operation_id": new_operation_id(),
        "actor": ActorRef("ops@example.org"),
        "reason": None,
        "digest": digest_of(action),
        "job_instance_id": None,
        "job_execution_id": None,
        "observed_version": None,
        "prior_status": None,
        "result_status": None,
        "outcome": Outcome.APPLIED,
        "rejection": None,
        "requested_at": clock.now(),
    }
    values.update(fields)
    return OperatorRecordDraft(**values)


def rejected(
    clock: ManualClock, rejection: OperatorRejection, **fields: Any
) -> OperatorRecordDraft:
    return draft(clock, outcome=Outcome.REJECTED, rejection=rejection, **fields)


def arrange_execution(repository: JobRepository) -> tuple[JobInstanceId, JobExecutionId]:
    key = JobInstanceKey(JobName("operator"), JobParameters.of({"run": next(_runs)}))
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        uow.commit()
    return instance.id, execution.id


def count_rows(
    admin: psycopg.Connection[Any], action: OperatorAction, operation_id: OperationId
) -> int:
    row = admin.execute(
        f"SELECT count(*) FROM {TABLE} WHERE action = %s AND operation_id = %s",
        (action.value, operation_id.value),
    ).fetchone()
    assert row is not None
    return int(row[0])


def append_committed(repository: JobRepository, value: OperatorRecordDraft) -> OperatorRecord:
    with repository.begin() as uow:
        record = uow.operator_requests.append(value)
        uow.commit()
    return record


def find(
    repository: JobRepository, action: OperatorAction, operation_id: OperationId
) -> OperatorRecord | None:
    with repository.begin() as uow:
        return uow.operator_requests.find(action, operation_id)


def forced(value: _V, **fields: Any) -> _V:
    """A draft its validators would refuse: the only way to reach a schema CHECK (H15)."""
    for name, field_value in fields.items():
        object.__setattr__(value, name, field_value)
    return value


# --------------------------------------------------------------------------- values


def test_actions_derive_their_authorization_class() -> None:
    lifecycle, destructive = AuthorizationClass.LIFECYCLE, AuthorizationClass.DESTRUCTIVE
    assert {action: action.authorization_class for action in A} == {
        A.LAUNCH: lifecycle,
        A.RESTART: lifecycle,
        A.STOP: lifecycle,
        A.ABANDON: destructive,
        A.RECOVER: destructive,
    }


def test_rejection_details_are_present_exactly_for_the_codes_that_carry_them() -> None:
    for code in Code:
        assert details_present(EVERY_REJECTION[code]) == (
            "current_version" in code.details,
            "status" in code.details,
            "execution_id" in code.details,
        )
    with pytest.raises(ValueError):
        OperatorRejection(code=Code.INVALID_STATE)
    with pytest.raises(ValueError):
        OperatorRejection(code=Code.EXECUTION_ALREADY_ACTIVE, status=S.STARTED)
    with pytest.raises(ValueError):
        OperatorRejection(code=Code.INSTANCE_COMPLETED, current_version=1)
    with pytest.raises(ValueError):
        OperatorRejection(code=Code.OPTIMISTIC_CONFLICT, current_version=1, status=S.STARTED)


def details_present(rejection: OperatorRejection) -> tuple[bool, bool, bool]:
    return (
        rejection.current_version is not None,
        rejection.status is not None,
        rejection.execution_id is not None,
    )


def test_repository_errors_map_to_rejections_with_their_details() -> None:
    from_repository = OperatorRejection.from_repository
    assert from_repository(
        ExecutionAlreadyActive(instance_id=1, execution_id=9, status="STARTED")
    ) == OperatorRejection(
        Code.EXECUTION_ALREADY_ACTIVE, execution_id=JobExecutionId(9), status=S.STARTED
    )
    assert from_repository(StaleVersion(expected=1, actual=4)) == (
        OperatorRejection(Code.OPTIMISTIC_CONFLICT, current_version=4)
    )
    assert from_repository(
        IllegalTransition(from_status="COMPLETED", to_status="STARTED")
    ) == OperatorRejection(Code.INVALID_STATE, status=S.COMPLETED)
    assert from_repository(RecoveryNotAllowed(id=3, status="FAILED")) == (
        OperatorRejection(Code.INVALID_STATE, status=S.FAILED)
    )
    assert from_repository(CompletedInstance(id=1)) == OperatorRejection(Code.INSTANCE_COMPLETED)
    assert from_repository(RestartStateNotFound(execution_id=1, step_name="x")) == (
        OperatorRejection(Code.INCOMPATIBLE_DEFINITION)
    )
    assert from_repository(ConcurrentModification()) is None
    assert from_repository(Unavailable()) is None


def test_outcome_shape_is_validated(clock: ManualClock) -> None:
    with pytest.raises(ValueError):
        draft(clock, outcome=Outcome.REJECTED)
    with pytest.raises(ValueError):
        draft(clock, outcome=Outcome.APPLIED, rejection=EVERY_REJECTION[Code.INSTANCE_NOT_FOUND])
    with pytest.raises(ValueError):
        RequestDigest(b"\x00" * 31)


def test_request_digest_follows_the_canonical_writer_and_omits_the_actor() -> None:
    def field(data: bytes) -> bytes:
        return struct.pack(">Q", len(data)) + data

    definition = DefinitionIdentity.LEGACY
    key = JobInstanceKey(JobName("orders"), JobParameters.of({"day": "2026-01-01"}))
    target = RequestTarget.instance_key(key)
    assert target.value == f"instance-key:{key.digest().hex()}"
    computed = RequestDigest.compute(
        A.LAUNCH, target, expected_version=3, reason=ReasonCode("NIGHTLY"), arguments=definition
    )
    expected = b"".join(
        [
            field(b"oxide-batch.operator-request.v1"),
            field(b"LAUNCH"),
            field(target.value.encode()),
            b"\x01" + struct.pack(">Q", 3),
            field(b"NIGHTLY"),
            field(b"DEFINITION"),
            field(definition.revision.value.encode()),
            field(definition.digest),
        ]
    )
    assert computed.value == hashlib.sha256(expected).digest()

    evidence = bytes(range(32))
    request = RecoveryRequest(
        5,
        "UNKNOWN_EFFECT",
        "ticket-1",
        evidence,
        FailureSummary(FailureCategory.TIMEOUT, FailureId(9)),
    )
    recovery = RequestDigest.compute(
        A.RECOVER,
        RequestTarget.execution(JobExecutionId(12)),
        expected_version=5,
        arguments=RecoveryArguments(request=request, unknown_commit=True),
    )
    expected = b"".join(
        [
            field(b"oxide-batch.operator-request.v1"),
            field(b"RECOVER"),
            field(b"execution:12"),
            b"\x01" + struct.pack(">Q", 5),
            field(b""),
            field(b"RECOVERY"),
            field(b"FAILED"),
            field(evidence),
            struct.pack(">Q", 1),
            field(b"timeout"),
            struct.pack(">Q", 9),
        ]
    )
    assert recovery.value == hashlib.sha256(expected).digest()

    stop = RequestDigest.compute(A.STOP, RequestTarget.execution(JobExecutionId(4)))
    assert (
        stop.value
        == hashlib.sha256(
            field(b"oxide-batch.operator-request.v1")
            + field(b"STOP")
            + field(b"execution:4")
            + b"\x00"
            + field(b"")
            + field(b"NONE")
        ).digest()
    )
    assert repr(stop) == f"RequestDigest({stop.value.hex()})"


# --------------------------------------------------------------------------- H1, H2


def test_find_is_none_on_an_empty_store_then_returns_the_appended_record(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario H1."""
    instance_id, execution_id = arrange_execution(repository)
    value = draft(
        clock,
        action=A.ABANDON,
        reason=ReasonCode("OPERATOR_ABANDON"),
        digest=digest_of(A.ABANDON, f"execution:{execution_id}"),
        job_instance_id=instance_id,
        job_execution_id=execution_id,
        observed_version=2**63 - 1,
        prior_status=S.FAILED,
        result_status=S.ABANDONED,
        requested_at=clock.advance(timedelta(microseconds=1)),
    )
    with repository.begin() as uow:
        assert uow.operator_requests.find(value.action, value.operation_id) is None
        record = uow.operator_requests.append(value)
        assert record.id >= 1 and record == OperatorRecord.from_draft(record.id, value)
        assert uow.operator_requests.find(value.action, value.operation_id) == record
        uow.commit()
    stored = find(repository, value.action, value.operation_id)
    assert stored == record
    assert stored.authorization_class is AuthorizationClass.DESTRUCTIVE
    assert stored.requested_at == value.requested_at and stored.requested_at.tzinfo is not None


def test_a_duplicate_key_is_concurrent_modification_and_another_action_is_another_key(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario H2."""
    first = draft(clock, action=A.STOP)
    with repository.begin() as uow:
        recorded = uow.operator_requests.append(first)
        with pytest.raises(ConcurrentModification):
            uow.operator_requests.append(attrs.evolve(first, actor=ActorRef("someone-else")))
        # The failed append rolled back to its savepoint: the unit of work goes on.
        other = uow.operator_requests.append(
            attrs.evolve(first, action=A.ABANDON, digest=digest_of(A.ABANDON))
        )
        assert other.id != recorded.id
        uow.commit()
    assert find(repository, A.STOP, first.operation_id) == recorded
    assert find(repository, A.ABANDON, first.operation_id) == other
    assert find(repository, A.LAUNCH, first.operation_id) is None
    assert count_rows(admin, A.STOP, first.operation_id) == 1
    # A committed key is refused the same way by a later unit of work.
    with repository.begin() as uow, pytest.raises(ConcurrentModification):
        uow.operator_requests.append(first)


# ------------------------------------------------------------------------ every code storable, H15


@pytest.mark.parametrize("code", list(Code), ids=lambda code: code.value)
def test_rule12_every_rejection_round_trips_with_its_details(
    repository: JobRepository, clock: ManualClock, code: OperatorRejectionCode
) -> None:
    value = rejected(clock, EVERY_REJECTION[code], action=A.RESTART, observed_version=4)
    record = append_committed(repository, value)
    stored = find(repository, A.RESTART, value.operation_id)
    assert stored == record
    assert stored.rejection == EVERY_REJECTION[code]
    assert stored.outcome is Outcome.REJECTED


def test_replayed_and_unsupported_action_rows_are_storable(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario H15."""
    replayed = draft(clock, action=A.RECOVER, outcome=Outcome.REPLAYED, result_status=S.FAILED)
    unsupported = rejected(clock, EVERY_REJECTION[Code.UNSUPPORTED_ACTION])
    for value in (replayed, unsupported):
        record = append_committed(repository, value)
        assert find(repository, value.action, value.operation_id) == record
    stored = find(repository, A.RECOVER, replayed.operation_id)
    assert stored is not None and stored.outcome is Outcome.REPLAYED


#: Drafts the validators refuse, forced through to the schema: (fields, violated constraint).
FORCED: dict[str, tuple[dict[str, Any], str]] = {
    "negative observed version": (
        {"observed_version": -1},
        "operator_request_observed_version_nonnegative",
    ),
    "rejected without a rejection": (
        {"outcome": Outcome.REJECTED},
        "operator_request_outcome_shape",
    ),
    "rejection missing its status": (
        {
            "outcome": Outcome.REJECTED,
            "rejection": forced(
                OperatorRejection(Code.INVALID_STATE, status=S.UNKNOWN), status=None
            ),
        },
        "operator_request_rejection_shape",
    ),
    "detail on a code that carries none": (
        {
            "outcome": Outcome.REJECTED,
            "rejection": forced(OperatorRejection(Code.INSTANCE_NOT_FOUND), current_version=3),
        },
        "operator_request_rejection_shape",
    ),
    "unknown job instance": ({"job_instance_id": 2**63 - 1}, "operator_request_job_instance_fk"),
    "unknown job execution": (
        {"job_execution_id": 2**63 - 1},
        "operator_request_job_execution_fk",
    ),
}


@pytest.mark.parametrize("case", list(FORCED))
def test_rule11_other_integrity_violations_are_never_concurrent_modification(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], case: str
) -> None:
    fields, constraint = FORCED[case]
    value = forced(draft(clock), **fields)
    with repository.begin() as uow:
        with pytest.raises(IntegrityViolation) as caught:
            uow.operator_requests.append(value)
        assert not isinstance(caught.value, ConcurrentModification)
        assert caught.value.constraint == constraint
        # Nothing was staged, and the unit of work is still usable.
        assert uow.operator_requests.find(value.action, value.operation_id) is None
        healthy = draft(clock)
        uow.operator_requests.append(healthy)
        uow.commit()
    assert count_rows(admin, value.action, value.operation_id) == 0
    assert count_rows(admin, healthy.action, healthy.operation_id) == 1


def test_rule11_a_check_violation_on_a_recorded_key_is_not_concurrent_modification(
    repository: JobRepository, clock: ManualClock
) -> None:
    value = draft(clock)
    append_committed(repository, value)
    with repository.begin() as uow, pytest.raises(IntegrityViolation) as caught:
        uow.operator_requests.append(forced(attrs.evolve(value), observed_version=-1))
    assert not isinstance(caught.value, ConcurrentModification)


# --------------------------------------------------------------------------- corrupt rows


#: Each case drops the CHECKs that guard its column, then corrupts one healthy row.
CORRUPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "unknown action": (("operator_request_action_valid",), "action = 'PAUSE'"),
    "lower-case action": (("operator_request_action_valid",), "action = 'launch'"),
    "class contradicts the action": (
        ("operator_request_authorization",),
        "authorization_class = 'DESTRUCTIVE'",
    ),
    "unknown class": (
        ("operator_request_authorization_class_valid",),
        "authorization_class = 'ROOT'",
    ),
    "unknown outcome": (
        ("operator_request_outcome_class_valid", "operator_request_outcome_shape"),
        "outcome_class = 'DONE'",
    ),
    "rejected without a rejection code": (
        ("operator_request_outcome_shape",),
        "outcome_class = 'REJECTED'",
    ),
    "applied with a rejection code": (
        ("operator_request_outcome_shape",),
        "rejection_code = 'INSTANCE_NOT_FOUND'",
    ),
    "unknown rejection code": (
        ("operator_request_rejection_code_valid",),
        "outcome_class = 'REJECTED', rejection_code = 'TOO_LATE'",
    ),
    "rejection missing its status": (
        ("operator_request_rejection_shape",),
        "outcome_class = 'REJECTED', rejection_code = 'INVALID_STATE'",
    ),
    "rejection missing its current version": (
        ("operator_request_rejection_shape",),
        "outcome_class = 'REJECTED', rejection_code = 'OPTIMISTIC_CONFLICT'",
    ),
    "active-execution rejection missing its execution id": (
        ("operator_request_rejection_shape",),
        "outcome_class = 'REJECTED', rejection_code = 'EXECUTION_ALREADY_ACTIVE', "
        "rejection_status = 'STARTED'",
    ),
    "detail on a code that carries none": (
        ("operator_request_rejection_shape",),
        "outcome_class = 'REJECTED', rejection_code = 'INSTANCE_NOT_FOUND', "
        "rejection_status = 'STARTED'",
    ),
    "unknown rejection status": (
        ("operator_request_rejection_status_valid",),
        "outcome_class = 'REJECTED', rejection_code = 'INVALID_STATE', rejection_status = 'PAUSED'",
    ),
    "unknown prior status": (("operator_request_prior_status_valid",), "prior_status = 'RUNNING'"),
    "unknown result status": (
        ("operator_request_result_status_valid",),
        "result_status = 'DONE'",
    ),
    "negative observed version": (
        ("operator_request_observed_version_nonnegative",),
        "observed_version = -1",
    ),
    "digest of 31 bytes": (
        ("operator_request_request_digest_length",),
        "request_digest = substring(request_digest FROM 2)",
    ),
    "actor outside its character set": ((), "actor_ref = 'ops desk'"),
    "reason outside its character set": ((), "reason_code = 'lower'"),
    "operation id outside its character set": ((), "operation_id = operation_id || '/x'"),
}


#: Cases that change the key itself: the typed find cannot name the row, so the stored key is
#: looked up with the same statement and decoder, under the same unit-of-work error mapping.
KEY_CORRUPTIONS = frozenset(
    {"unknown action", "lower-case action", "operation id outside its character set"}
)


def find_by_stored_key(uow: UnitOfWork, action: str, operation_id: str) -> OperatorRecord | None:
    with uow.operation() as conn:
        row = uow.statements.find_operator_request.one(
            conn, action=action, operation_id=operation_id
        )
        return None if row is None else decode_operator_record(row)


def test_corrupt_operator_request_rows_are_unavailable_on_find(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    rows = {
        case: append_committed(repository, draft(clock, reason=ReasonCode("NIGHTLY")))
        for case in ["control", *CORRUPTIONS]
    }
    for case, (constraints, assignment) in CORRUPTIONS.items():
        for constraint in constraints:
            admin.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {constraint}")
        changed = admin.execute(f"UPDATE {TABLE} SET {assignment} WHERE id = %s", (rows[case].id,))
        assert changed.rowcount == 1, case
    observed: dict[str, str] = {}
    for case, record in rows.items():
        stored_key = admin.execute(
            f"SELECT action, operation_id FROM {TABLE} WHERE id = %s", (record.id,)
        ).fetchone()
        assert stored_key is not None
        with repository.begin() as uow:
            try:
                if case in KEY_CORRUPTIONS:
                    found = find_by_stored_key(uow, *stored_key)
                else:
                    found = uow.operator_requests.find(record.action, record.operation_id)
            except Unavailable as error:
                # Fail closed without leaking the stored value into the message.
                assert str(error) == "repository is unavailable", str(error)
                observed[case] = "Unavailable"
            else:
                observed[case] = "ok" if found == record else f"decoded {found!r}"
            # The failed read rolled back to its savepoint: the unit of work is still usable.
            assert uow.operator_requests.find(A.LAUNCH, rows["control"].operation_id) is not None
    assert observed == {case: "ok" if case == "control" else "Unavailable" for case in rows}


# --------------------------------------------------------------------------- L4


def test_two_units_of_work_appending_the_same_operation_id_have_one_winner(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L4."""
    for _ in range(8):
        base = draft(clock, action=A.STOP)
        racers = [
            attrs.evolve(base, actor=ActorRef(f"racer-{index}"), requested_at=clock.advance())
            for index in range(2)
        ]

        def append(
            uow: UnitOfWork, index: int, racers: list[OperatorRecordDraft] = racers
        ) -> OperatorRecord:
            # Each racer commits its own unit of work, so the loser's wait on the key ends.
            return uow.operator_requests.append(racers[index])

        outcomes = race_units_of_work(repository, 2, append)
        winners = [outcome for outcome in outcomes if outcome.ok]
        losers = [outcome for outcome in outcomes if not outcome.ok]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert isinstance(losers[0].error, ConcurrentModification), losers[0].error
        assert count_rows(admin, base.action, base.operation_id) == 1
        winner = winners[0].value
        assert winner is not None
        assert winner == OperatorRecord.from_draft(winner.id, racers[winners[0].index])
        assert find(repository, base.action, base.operation_id) == winner


@pytest.mark.parametrize("winner_commits", [True, False], ids=["commit", "rollback"])
def test_the_loser_waits_on_the_identity_key_until_the_winner_finishes(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    winner_commits: bool,
) -> None:
    first = draft(clock, action=A.RESTART)
    second = attrs.evolve(first, actor=ActorRef("second"), requested_at=clock.advance())
    with repository.begin() as uow:
        recorded = uow.operator_requests.append(first)
        # The contender's insert blocks on operator_request_identity_unique (a lock wait, not
        # an error) while this transaction is open; it commits its own unit of work.
        contender = Contender(repository, lambda other: other.operator_requests.append(second))
        contender.start_blocked(admin)
        if winner_commits:
            uow.commit()
    outcome = contender.outcome()
    if winner_commits:
        assert isinstance(outcome.error, ConcurrentModification), outcome
        assert find(repository, first.action, first.operation_id) == recorded
    else:
        assert outcome.ok, outcome
        assert outcome.value is not None
        assert outcome.value == OperatorRecord.from_draft(outcome.value.id, second)
        assert find(repository, first.action, first.operation_id) == outcome.value
    assert count_rows(admin, first.action, first.operation_id) == 1
