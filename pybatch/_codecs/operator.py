"""Codec of operator_request rows; unknown codes and contradicting details are DecodeError."""

from __future__ import annotations

from pybatch._codecs import _primitives as p
from pybatch.values import operator
from pybatch.values.ids import JobExecutionId, JobInstanceId, OperatorRequestId
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.status import BatchStatus

#: Columns `decode_operator_record` reads (operator_requests.sql find_operator_request).
OPERATOR_REQUEST_COLUMNS = tuple(
    """id job_instance_id job_execution_id action authorization_class operation_id actor_ref
    reason_code request_digest observed_version prior_status result_status outcome_class
    rejection_code rejection_current_version rejection_status rejection_execution_id
    requested_at""".split()
)


def _decode_rejection(values: p.Row) -> operator.OperatorRejection | None:
    """The rejection and its details; the value refuses a detail its code does not carry."""
    code = p.optional_enum_at(operator.OperatorRejectionCode, values, "rejection_code")
    current = p.optional_int64_at(values, "rejection_current_version", 0)
    status = p.optional_enum_at(BatchStatus, values, "rejection_status")
    execution_id = p.optional_int64_at(values, "rejection_execution_id")
    if code is None and (current, status, execution_id) == (None, None, None):
        return None
    if code is None:
        raise p.DecodeError("rejection_code")
    try:
        return operator.OperatorRejection(
            code=code,
            current_version=current,
            status=status,
            execution_id=None if execution_id is None else JobExecutionId(execution_id),
        )
    except ValueError:
        raise p.DecodeError("rejection_code") from None


def decode_operator_record(row: p.Row) -> operator.OperatorRecord:
    """Decode an operator_request row (columns `OPERATOR_REQUEST_COLUMNS`)."""
    values = {column: row[column] for column in OPERATOR_REQUEST_COLUMNS}
    action = p.enum_at(operator.OperatorAction, values, "action")
    authorization = p.enum_at(operator.AuthorizationClass, values, "authorization_class")
    if authorization is not action.authorization_class:
        raise p.DecodeError("authorization_class")
    outcome = p.enum_at(operator.OperatorOutcomeClass, values, "outcome_class")
    rejection = _decode_rejection(values)
    if (outcome is operator.OperatorOutcomeClass.REJECTED) != (rejection is not None):
        raise p.DecodeError("outcome_class")
    instance_id = p.optional_int64_at(values, "job_instance_id")
    execution_id = p.optional_int64_at(values, "job_execution_id")
    return operator.OperatorRecord(
        id=OperatorRequestId(p.int64_at(values, "id")),
        action=action,
        operation_id=p.text_value_at(OperationId, values, "operation_id"),
        actor=p.text_value_at(ActorRef, values, "actor_ref"),
        reason=None
        if values["reason_code"] is None
        else p.text_value_at(ReasonCode, values, "reason_code"),
        digest=operator.RequestDigest(p.digest_at(values, "request_digest")),
        job_instance_id=None if instance_id is None else JobInstanceId(instance_id),
        job_execution_id=None if execution_id is None else JobExecutionId(execution_id),
        observed_version=p.optional_int64_at(values, "observed_version", 0),
        prior_status=p.optional_enum_at(BatchStatus, values, "prior_status"),
        result_status=p.optional_enum_at(BatchStatus, values, "result_status"),
        outcome=outcome,
        rejection=rejection,
        requested_at=p.aware_at(values, "requested_at"),
    )


def encode_operator_record_draft(draft: operator.OperatorRecordDraft) -> dict[str, object]:
    """insert_operator_request parameters; the class is derived here, so no caller can pick one."""
    rejection = draft.rejection
    return {
        "job_instance_id": draft.job_instance_id,
        "job_execution_id": draft.job_execution_id,
        "action": draft.action.value,
        "authorization_class": draft.authorization_class.value,
        "operation_id": draft.operation_id.value,
        "actor_ref": draft.actor.value,
        "reason_code": None if draft.reason is None else draft.reason.value,
        "request_digest": draft.digest.value,
        "observed_version": draft.observed_version,
        "prior_status": None if draft.prior_status is None else draft.prior_status.value,
        "result_status": None if draft.result_status is None else draft.result_status.value,
        "outcome_class": draft.outcome.value,
        "rejection_code": None if rejection is None else rejection.code.value,
        "rejection_current_version": None if rejection is None else rejection.current_version,
        "rejection_status": (
            None if rejection is None or rejection.status is None else rejection.status.value
        ),
        "rejection_execution_id": None if rejection is None else rejection.execution_id,
        "requested_at": draft.requested_at,
    }
