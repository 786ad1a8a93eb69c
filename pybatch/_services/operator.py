"""The operator request service: idempotent, audited lifecycle requests.

A recorded (action, operation id) replays, or with another digest is OperationIdConflict. An
effect and its APPLIED audit row share one unit of work; a refusal is recorded REJECTED on its
own. After OperationOutcomeUnknown, re-running the same operation id replays, never acts twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from pybatch import _telemetry
from pybatch import errors as e
from pybatch._repository.recovery import evidence_digest
from pybatch._unit_of_work import UnitOfWork
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import JobExecutionId, JobInstanceId
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.operator import (
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
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.records import JobExecution
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import BatchStatus

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository

#: The only reason that may mark an execution with an unknown commit FAILED.
UNKNOWN_EFFECT = "UNKNOWN_EFFECT"

S = BatchStatus
Code = OperatorRejectionCode


def operator_evidence(execution: JobExecution) -> bytes:
    """The evidence of an operator's recovery: any write to the execution since changes it."""
    return evidence_digest(execution, "OPERATOR", attempt=execution.attempt)


@attrs.frozen
class OperatorOutcome:
    """How a request was settled, with its audit record (and the execution it left)."""

    outcome: OperatorOutcomeClass
    record: OperatorRecord
    #: The execution after an APPLIED effect; None on a replay or a rejection.
    execution: JobExecution | None = None
    #: APPLIED, but nothing changed: the effect was already in place (a stop on a finished run).
    noop: bool = False

    @property
    def rejection(self) -> OperatorRejection | None:
        """The recorded rejection, when the request was REJECTED."""
        return self.record.rejection

    def describe(self) -> str:
        """One line: the outcome (NOOP: APPLIED, nothing changed), action, operation id, result."""
        record = self.record
        word = "NOOP" if self.noop else self.outcome.value
        line = f"{word} {record.action.value} operation {record.operation_id.value}"
        if (rejection := self.rejection) is not None:
            fields = {
                "current_version": rejection.current_version,
                "status": None if rejection.status is None else rejection.status.value,
                "execution_id": rejection.execution_id,
            }
            details = [f"{name}={value}" for name, value in fields.items() if value is not None]
            return f"{line}: rejected {rejection.code.value} {' '.join(details)}".rstrip()
        if (status := record.result_status) is None:
            return line
        if self.noop:
            return f"{line}: execution is already {status.value}, nothing to change"
        return f"{line}: execution is {status.value}"


class _Rejected(Exception):
    def __init__(self, rejection: OperatorRejection) -> None:
        self.rejection = rejection


@attrs.frozen
class _Effect:
    prior_status: BatchStatus | None
    execution: JobExecution
    #: Launch: the instance of the execution it created (the audit names it).
    instance_id: int | None = None
    #: False when the effect was already in place and nothing was written but the audit row.
    changed: bool = True


@attrs.frozen
class _Request:
    action: OperatorAction
    operation_id: OperationId
    actor: ActorRef
    reason: ReasonCode | None
    target: RequestTarget
    expected_version: int | None
    arguments: DefinitionIdentity | RecoveryArguments | None
    execution_id: int | None = None
    digest: RequestDigest = attrs.field(init=False)

    @digest.default
    def _digest(self) -> RequestDigest:
        return RequestDigest.compute(
            self.action,
            self.target,
            expected_version=self.expected_version,
            reason=self.reason,
            arguments=self.arguments,
        )


class OperatorService:
    """Launch, stop and recover as idempotent, audited requests."""

    def __init__(self, repository: JobRepository) -> None:
        self.repository = repository

    def stop(
        self,
        operation_id: OperationId,
        actor: ActorRef,
        execution_id: int,
        *,
        expected_version: int | None = None,
    ) -> OperatorOutcome:
        """Ask a running execution to stop; repeated, or on a finished run, it is a no-op."""
        action, target = OperatorAction.STOP, RequestTarget.execution(JobExecutionId(execution_id))
        request = _Request(
            action, operation_id, actor, None, target, expected_version, None, execution_id
        )

        def effect(uow: UnitOfWork) -> _Effect:
            current = self._execution(uow, execution_id, expected_version)
            if current.status in (S.STARTING, S.STARTED):
                stopped = uow.stop_requests.request(
                    execution_id, current.version, actor, uow.clock.now()
                )
                return _Effect(current.status, stopped)
            if current.status is S.UNKNOWN:
                raise _Rejected(OperatorRejection(Code.INVALID_STATE, status=S.UNKNOWN))
            return _Effect(current.status, current, changed=False)  # finished or stopping

        return self._submit(request, effect)

    def recover(
        self,
        operation_id: OperationId,
        actor: ActorRef,
        execution_id: int,
        recovery: RecoveryRequest,
        *,
        unknown_commit: bool = False,
        force: bool = False,
    ) -> OperatorOutcome:
        """Resolve an orphaned or ambiguous execution FAILED or ABANDONED, audited.

        With `unknown_commit`, FAILED needs reason UNKNOWN_EFFECT. A fresh lease is a live owner:
        refused unless `force`, which fences it (its next commit and renewal are refused).
        """
        target = RequestTarget.execution(JobExecutionId(execution_id))
        reason = ReasonCode(recovery.reason_code)
        arguments = RecoveryArguments(request=recovery, unknown_commit=unknown_commit, force=force)
        action, version = OperatorAction.RECOVER, recovery.expected_version
        request = _Request(
            action, operation_id, actor, reason, target, version, arguments, execution_id
        )

        def effect(uow: UnitOfWork) -> _Effect:
            current = self._execution(uow, execution_id, recovery.expected_version)
            if (
                unknown_commit
                and recovery.failure is not None
                and recovery.reason_code != UNKNOWN_EFFECT
            ):
                raise _Rejected(OperatorRejection(Code.UNRESOLVED_RECOVERY_REQUIRED))
            _, lease = uow.ownership.lock(execution_id)
            if lease.has_lease and not lease.lease_expired and not force:
                raise _Rejected(
                    OperatorRejection(
                        Code.EXECUTION_ALREADY_ACTIVE,
                        execution_id=JobExecutionId(execution_id),
                        status=current.status,
                    )
                )
            recovered = uow.recovery.recover(execution_id, recovery).execution
            _telemetry.recovered(recovery.reason_code)
            return _Effect(current.status, recovered)

        return self._submit(request, effect)

    def launch(
        self,
        operation_id: OperationId,
        actor: ActorRef,
        key: JobInstanceKey,
        definition: DefinitionIdentity | None = None,
    ) -> OperatorOutcome:
        """Create the first (or next) execution of an instance key, STARTING."""
        definition = definition or DefinitionIdentity.LEGACY
        action, target = OperatorAction.LAUNCH, RequestTarget.instance_key(key)
        request = _Request(action, operation_id, actor, None, target, None, definition)

        def effect(uow: UnitOfWork) -> _Effect:
            instance = uow.instances.select_or_create(key).instance
            created = uow.executions.create(instance.id, definition)
            return _Effect(None, created, instance.id)

        return self._submit(request, effect)

    @staticmethod
    def _execution(uow: UnitOfWork, execution_id: int, expected: int | None) -> JobExecution:
        if (current := uow.executions.get(execution_id)) is None:
            raise _Rejected(OperatorRejection(Code.EXECUTION_NOT_FOUND))
        if expected is not None and current.version != expected:
            raise _Rejected(
                OperatorRejection(Code.OPTIMISTIC_CONFLICT, current_version=current.version)
            )
        return current

    def _probe(self, request: _Request) -> OperatorOutcome | None:
        """Replay a recorded request with the same digest; refuse one with another digest."""
        with self.repository.begin() as uow:
            recorded = uow.operator_requests.find(request.action, request.operation_id)
        if recorded is None:
            return None
        if recorded.digest != request.digest:
            raise e.OperationIdConflict(
                action=request.action.value, operation_id=request.operation_id.value
            )
        return OperatorOutcome(OperatorOutcomeClass.REPLAYED, recorded)

    def _submit(
        self, request: _Request, effect: Callable[[UnitOfWork], _Effect]
    ) -> OperatorOutcome:
        if (replay := self._probe(request)) is not None:
            return replay
        rejection: OperatorRejection | None = None
        with self.repository.begin() as uow:
            try:
                applied = effect(uow)
            except _Rejected as rejected:
                rejection = rejected.rejection
            except e.PyBatchError as error:
                if (rejection := OperatorRejection.from_repository(error)) is None:
                    raise
            if rejection is None:
                return self._record(uow, request, effect=applied)
        with self.repository.begin() as uow:  # the refusal, audited on its own (effect undone)
            return self._record(uow, request, rejection=rejection)

    def _record(
        self,
        uow: UnitOfWork,
        request: _Request,
        *,
        effect: _Effect | None = None,
        rejection: OperatorRejection | None = None,
    ) -> OperatorOutcome:
        """Append the audit row and commit; replay when another caller recorded it first."""
        instance_id = effect.instance_id if effect else None
        execution_id = effect.execution.id if effect else request.execution_id
        # A missing target cannot be referenced (the audit row's foreign keys).
        if rejection is not None and rejection.code is Code.EXECUTION_NOT_FOUND:
            execution_id = None
        draft = OperatorRecordDraft(
            action=request.action,
            operation_id=request.operation_id,
            actor=request.actor,
            reason=request.reason,
            digest=request.digest,
            job_instance_id=None if instance_id is None else JobInstanceId(instance_id),
            job_execution_id=None if execution_id is None else JobExecutionId(execution_id),
            observed_version=request.expected_version,
            prior_status=effect.prior_status if effect else None,
            result_status=effect.execution.status if effect else None,
            outcome=OperatorOutcomeClass.REJECTED if rejection else OperatorOutcomeClass.APPLIED,
            rejection=rejection,
            requested_at=uow.clock.now(),
        )
        try:
            record = uow.operator_requests.append(draft)
        except e.ConcurrentModification:
            uow.rollback()  # another caller recorded the operation id first: replay it
            if (replay := self._probe(request)) is None:
                raise e.ConcurrentModification() from None
            return replay
        try:
            uow.commit()
        except e.CommitOutcomeUnknown:
            raise e.OperationOutcomeUnknown() from None
        return OperatorOutcome(
            draft.outcome,
            record,
            effect.execution if effect else None,
            noop=effect is not None and not effect.changed,
        )
