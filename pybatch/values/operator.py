"""Operator vocabulary: actions, outcomes, lossless rejections, audit records.

The audit row makes requests idempotent, so every value round-trips `operator_request` unchanged.
"""

from __future__ import annotations

import datetime as _dt

import attrs

from pybatch import errors as e
from pybatch.values import ids
from pybatch.values._canonical import CanonicalWriter
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import Code, aware_utc, digest, is_, maybe, version
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.recovery import RecoveryRequest, RecoveryResult
from pybatch.values.status import BatchStatus, FailureSummary

#: Domain-separation tag of the request digest, kept byte for byte (docs/tables.md 3.10).
REQUEST_DIGEST_DOMAIN = "oxide-batch.operator-request.v1"


class AuthorizationClass(Code):
    """How much an operator request may change; derived from the action and stored with it."""

    LIFECYCLE = "LIFECYCLE"  # Launch, restart and stop.
    DESTRUCTIVE = "DESTRUCTIVE"  # Abandon and recover.


class OperatorAction(Code):
    """An operator action; the value is the stored code and half of the idempotency key."""

    LAUNCH = "LAUNCH"  # Create the first (or a new) execution of an instance key.
    RESTART = "RESTART"  # Create a new attempt of an existing instance.
    STOP = "STOP"  # Ask a running execution to stop cooperatively.
    ABANDON = "ABANDON"  # Make a stopped or failed execution terminal.
    RECOVER = "RECOVER"  # Resolve an orphaned or ambiguous execution (docs/contract.md, Recovery).

    @property
    def authorization_class(self) -> AuthorizationClass:
        """LIFECYCLE for launch, restart and stop; DESTRUCTIVE for abandon and recover."""
        if self in (OperatorAction.ABANDON, OperatorAction.RECOVER):
            return AuthorizationClass.DESTRUCTIVE
        return AuthorizationClass.LIFECYCLE


class OperatorOutcomeClass(Code):
    """What became of an operator request."""

    APPLIED = "APPLIED"  # The effect was applied (or was already in place, e.g. a repeated stop).
    REPLAYED = "REPLAYED"  # A recorded request was replayed (no row written, but storable).
    REJECTED = "REJECTED"  # The repository refused the effect; the row carries the rejection.


class OperatorRejectionCode(Code):
    """Why an operator request was rejected; the value is the stored code."""

    OPTIMISTIC_CONFLICT = "OPTIMISTIC_CONFLICT"  # The version moved on; carries the actual one.
    INVALID_STATE = "INVALID_STATE"  # The target's status forbids the action; carries that status.
    INSTANCE_COMPLETED = "INSTANCE_COMPLETED"  # The instance is COMPLETED and never runs again.
    INSTANCE_ABANDONED = "INSTANCE_ABANDONED"  # The instance is ABANDONED and never runs again.
    #: Carries the unresolved one's id and status.
    EXECUTION_ALREADY_ACTIVE = "EXECUTION_ALREADY_ACTIVE"
    INCOMPATIBLE_DEFINITION = "INCOMPATIBLE_DEFINITION"  # Cannot continue the previous attempt.
    #: The instance has no execution.
    RESTART_WITHOUT_PRIOR_ATTEMPT = "RESTART_WITHOUT_PRIOR_ATTEMPT"
    START_LIMIT_EXCEEDED = "START_LIMIT_EXCEEDED"  # A node used up its start limit.
    UNRESOLVED_RECOVERY_REQUIRED = "UNRESOLVED_RECOVERY_REQUIRED"  # UNKNOWN: recover it first.
    EXECUTION_NOT_FOUND = "EXECUTION_NOT_FOUND"  # The target execution does not exist.
    INSTANCE_NOT_FOUND = "INSTANCE_NOT_FOUND"  # The target instance does not exist.
    UNSUPPORTED_ACTION = "UNSUPPORTED_ACTION"  # The action code is outside the vocabulary.

    @property
    def details(self) -> frozenset[str]:
        """The details a rejection of this code records, and no other."""
        return _DETAILS.get(self, frozenset())


_DETAILS = {
    OperatorRejectionCode.OPTIMISTIC_CONFLICT: frozenset({"current_version"}),
    OperatorRejectionCode.INVALID_STATE: frozenset({"status"}),
    OperatorRejectionCode.EXECUTION_ALREADY_ACTIVE: frozenset({"execution_id", "status"}),
}


@attrs.frozen
class OperatorRejection:
    """A rejection code with exactly its details (the actual version, not the expected one)."""

    code: OperatorRejectionCode = attrs.field(validator=is_(OperatorRejectionCode))
    current_version: int | None = attrs.field(
        default=None, kw_only=True, validator=attrs.validators.optional(version)
    )
    status: BatchStatus | None = attrs.field(
        default=None, kw_only=True, validator=maybe(BatchStatus)
    )
    execution_id: ids.JobExecutionId | None = attrs.field(
        default=None, kw_only=True, validator=ids.IdentifierKind.JOB_EXECUTION.optional
    )

    def __attrs_post_init__(self) -> None:
        # The same shape operator_request_rejection_shape enforces in storage.
        details = ("current_version", "status", "execution_id")
        if {name for name in details if getattr(self, name) is not None} != self.code.details:
            raise ValueError(f"{self.code.value} carries exactly {sorted(self.code.details)}")

    @classmethod
    def from_repository(cls, error: BaseException) -> OperatorRejection | None:
        """The audited rejection of a repository error, or None if the error must propagate."""
        for errors, rejected in _REJECTION_CODES:
            if isinstance(error, errors):
                return cls(rejected)
        code = OperatorRejectionCode
        if isinstance(error, e.ExecutionAlreadyActive):
            execution_id, status = ids.JobExecutionId(error.execution_id), BatchStatus(error.status)
            return cls(code.EXECUTION_ALREADY_ACTIVE, execution_id=execution_id, status=status)
        if isinstance(error, e.StaleVersion):
            return cls(code.OPTIMISTIC_CONFLICT, current_version=error.actual)
        if isinstance(error, e.IllegalTransition | e.RestartRequiresNewAttempt):
            return cls(code.INVALID_STATE, status=BatchStatus(error.from_status))
        if isinstance(error, e.RecoveryNotAllowed):
            return cls(code.INVALID_STATE, status=BatchStatus(error.status))
        return None


#: Repository errors audited as a rejection whose code carries no details.
_REJECTION_CODES = (
    (e.CompletedInstance, OperatorRejectionCode.INSTANCE_COMPLETED),
    (e.AbandonedInstance, OperatorRejectionCode.INSTANCE_ABANDONED),
    (
        (e.IncompatibleDefinition, e.RestartStateNotFound, e.InvalidDefinitionUpgrade),
        OperatorRejectionCode.INCOMPATIBLE_DEFINITION,
    ),
    (e.StartLimitExceeded, OperatorRejectionCode.START_LIMIT_EXCEEDED),
    (e.JobExecutionNotFound, OperatorRejectionCode.EXECUTION_NOT_FOUND),
    (e.JobInstanceNotFound, OperatorRejectionCode.INSTANCE_NOT_FOUND),
)


@attrs.frozen
class RequestTarget:
    """What a request acts on, in the text form the request digest covers."""

    value: str = attrs.field(validator=is_(str))

    @classmethod
    def instance_key(cls, key: JobInstanceKey) -> RequestTarget:
        """`instance-key:<hex digest>`: a launch names the key, not an instance id."""
        return cls(f"instance-key:{key.digest().hex()}")

    @classmethod
    def execution(cls, execution_id: ids.JobExecutionId) -> RequestTarget:
        """`execution:<id>`: stop and recover name an execution."""
        checked = ids.check_identifier(ids.IdentifierKind.JOB_EXECUTION, execution_id)
        return cls(f"execution:{checked}")


@attrs.frozen(kw_only=True)
class RecoveryArguments:
    """The recovery arguments a RECOVER request's digest covers."""

    request: RecoveryRequest = attrs.field(validator=is_(RecoveryRequest))
    unknown_commit: bool = attrs.field(validator=is_(bool))
    #: Recover even though the owner's lease is fresh (the owner is fenced first).
    force: bool = attrs.field(default=False, validator=is_(bool))


@attrs.frozen(repr=False)
class RequestDigest:
    """SHA-256 of a request without the actor: equal digests are one request, else a conflict."""

    value: bytes = attrs.field(validator=digest)

    @classmethod
    def compute(
        cls,
        action: OperatorAction,
        target: RequestTarget,
        *,
        expected_version: int | None = None,
        reason: ReasonCode | None = None,
        arguments: DefinitionIdentity | RecoveryArguments | None = None,
    ) -> RequestDigest:
        """Digest a request; `arguments`: a launch's definition, a recovery's arguments or None."""
        writer = CanonicalWriter(REQUEST_DIGEST_DOMAIN, action.value, target.value)
        expected = None if expected_version is None else ids.check_version(expected_version)
        writer.optional_u64(expected)
        writer.text("" if reason is None else reason.value)
        if arguments is None:
            writer.text("NONE")
        elif isinstance(arguments, DefinitionIdentity):
            writer.text("DEFINITION", arguments.revision.value)
            writer.bytes_(arguments.digest)
        else:
            request = arguments.request
            writer.text("RECOVERY", request.status.value)
            writer.bytes_(request.evidence_digest)
            writer.u64(int(arguments.unknown_commit))
            failure: FailureSummary | None = request.failure
            if failure is None:
                writer.text("")
            else:
                writer.text(failure.category.value.lower())
                writer.u64(failure.failure_id)
            if arguments.force:  # only when set: digests of unforced requests are unchanged
                writer.text("FORCE")
        return cls(writer.digest())

    def __repr__(self) -> str:
        return f"RequestDigest({self.value.hex()})"


@attrs.frozen(kw_only=True)
class OperatorRecordDraft:
    """An audit row about to be appended: an operator record without its id."""

    action: OperatorAction = attrs.field(validator=is_(OperatorAction))
    operation_id: OperationId = attrs.field(validator=is_(OperationId))
    actor: ActorRef = attrs.field(validator=is_(ActorRef))
    reason: ReasonCode | None = attrs.field(validator=maybe(ReasonCode))
    digest: RequestDigest = attrs.field(validator=is_(RequestDigest))
    job_instance_id: ids.JobInstanceId | None = attrs.field(
        validator=ids.IdentifierKind.JOB_INSTANCE.optional
    )
    job_execution_id: ids.JobExecutionId | None = attrs.field(
        validator=ids.IdentifierKind.JOB_EXECUTION.optional
    )
    observed_version: int | None = attrs.field(validator=attrs.validators.optional(version))
    prior_status: BatchStatus | None = attrs.field(validator=maybe(BatchStatus))
    result_status: BatchStatus | None = attrs.field(validator=maybe(BatchStatus))
    outcome: OperatorOutcomeClass = attrs.field(validator=is_(OperatorOutcomeClass))
    rejection: OperatorRejection | None = attrs.field(validator=maybe(OperatorRejection))
    requested_at: _dt.datetime = attrs.field(converter=aware_utc)

    def __attrs_post_init__(self) -> None:
        if (self.outcome is OperatorOutcomeClass.REJECTED) != (self.rejection is not None):
            raise ValueError("REJECTED carries a rejection; APPLIED and REPLAYED carry none")

    @property
    def authorization_class(self) -> AuthorizationClass:
        """Derived from the action, never chosen by the caller."""
        return self.action.authorization_class


@attrs.frozen(kw_only=True)
class OperatorRecord(OperatorRecordDraft):
    """One stored operator request (audit row and idempotency record): the draft plus its id."""

    id: ids.OperatorRequestId = attrs.field(validator=ids.IdentifierKind.OPERATOR_REQUEST.validator)

    @classmethod
    def from_draft(
        cls, record_id: ids.OperatorRequestId, draft: OperatorRecordDraft
    ) -> OperatorRecord:
        """The record `draft` became once appended with `record_id`."""
        return cls(id=record_id, **attrs.asdict(draft, recurse=False))


#: The actor and operation-id prefix of recoveries pybatch records on its own.
AUTOMATIC_RECOVERY_ACTOR = "pybatch.etl"


def automatic_recovery_record(result: RecoveryResult, now: _dt.datetime) -> OperatorRecordDraft:
    """The RECOVER request auditing an automatic recovery; its operation id names what it saw."""
    decision = result.decision
    request = RecoveryRequest(  # FAILED with the execution's failure, or ABANDONED without one
        expected_version=decision.execution_version,
        reason_code=decision.reason_code,
        operator_reference=decision.operator_reference,
        evidence_digest=decision.evidence_digest,
        failure=result.execution.metadata.failure,
    )
    operation = OperationId(
        f"{AUTOMATIC_RECOVERY_ACTOR}:recover:{decision.job_execution_id}:"
        f"{decision.execution_version}"
    )
    reason = ReasonCode(decision.reason_code)
    execution = result.execution
    return OperatorRecordDraft(
        action=OperatorAction.RECOVER,
        operation_id=operation,
        actor=ActorRef(AUTOMATIC_RECOVERY_ACTOR),
        reason=reason,
        digest=RequestDigest.compute(
            OperatorAction.RECOVER,
            RequestTarget.execution(execution.id),
            expected_version=decision.execution_version,
            reason=reason,
            arguments=RecoveryArguments(request=request, unknown_commit=False),
        ),
        job_instance_id=execution.job_instance_id,
        job_execution_id=execution.id,
        observed_version=decision.execution_version,
        prior_status=decision.prior_status,
        result_status=decision.resulting_status,
        outcome=OperatorOutcomeClass.APPLIED,
        rejection=None,
        requested_at=now,
    )
