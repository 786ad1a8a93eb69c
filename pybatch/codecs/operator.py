"""Codec of operator_request rows.

See docs/tables.md 2.10, 3.3; docs/contract.md, Operator vocabulary; Fail closed.

The decoder fails closed: an unknown action, class, outcome, status or rejection code, an
authorization class that contradicts the action, or a rejection whose details do not match
its code raises `DecodeError(column)`, which the unit of work maps to `Unavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pybatch.codecs._primitives import (
    DecodeError,
    decode_aware,
    decode_digest,
    decode_enum,
    decode_int64,
    decode_optional_int64,
    decode_text_value,
)
from pybatch.values.ids import JobExecutionId, JobInstanceId, OperatorRequestId
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.operator import (
    AuthorizationClass,
    OperatorAction,
    OperatorOutcomeClass,
    OperatorRecord,
    OperatorRecordDraft,
    OperatorRejection,
    OperatorRejectionCode,
    RequestDigest,
)
from pybatch.values.status import BatchStatus

#: Columns `decode_operator_record` reads (operator_requests.sql find_operator_request).
OPERATOR_REQUEST_COLUMNS = (
    "id",
    "job_instance_id",
    "job_execution_id",
    "action",
    "authorization_class",
    "operation_id",
    "actor_ref",
    "reason_code",
    "request_digest",
    "observed_version",
    "prior_status",
    "result_status",
    "outcome_class",
    "rejection_code",
    "rejection_current_version",
    "rejection_status",
    "rejection_execution_id",
    "requested_at",
)

_T = TypeVar("_T")


def _decode_optional_status(value: object, *, column: str) -> BatchStatus | None:
    return None if value is None else decode_enum(BatchStatus, value, column=column)


def _decode_rejection(values: Mapping[str, object]) -> OperatorRejection | None:
    """The rejection and its details, refusing a detail its code does not carry."""
    raw_code = values["rejection_code"]
    current = decode_optional_int64(
        values["rejection_current_version"], column="rejection_current_version", minimum=0
    )
    status = _decode_optional_status(values["rejection_status"], column="rejection_status")
    execution_id = decode_optional_int64(
        values["rejection_execution_id"], column="rejection_execution_id", minimum=1
    )
    if raw_code is None:
        code = None
    else:
        code = decode_enum(OperatorRejectionCode, raw_code, column="rejection_code")
    if (current is not None) != (code is not None and code.carries_current_version):
        raise DecodeError("rejection_current_version")
    if (status is not None) != (code is not None and code.carries_status):
        raise DecodeError("rejection_status")
    if (execution_id is not None) != (code is not None and code.carries_execution_id):
        raise DecodeError("rejection_execution_id")
    if code is None:
        return None
    return OperatorRejection(
        code=code,
        current_version=current,
        status=status,
        execution_id=None if execution_id is None else JobExecutionId(execution_id),
    )


def decode_operator_record(row: Mapping[str, object]) -> OperatorRecord:
    """Decode an operator_request row (columns `OPERATOR_REQUEST_COLUMNS`)."""
    values = {column: row[column] for column in OPERATOR_REQUEST_COLUMNS}
    action = decode_enum(OperatorAction, values["action"], column="action")
    authorization = decode_enum(
        AuthorizationClass, values["authorization_class"], column="authorization_class"
    )
    if authorization is not action.authorization_class:
        raise DecodeError("authorization_class")
    outcome = decode_enum(OperatorOutcomeClass, values["outcome_class"], column="outcome_class")
    rejection = _decode_rejection(values)
    if (outcome is OperatorOutcomeClass.REJECTED) != (rejection is not None):
        raise DecodeError("outcome_class")
    reason = values["reason_code"]
    instance_id = decode_optional_int64(
        values["job_instance_id"], column="job_instance_id", minimum=1
    )
    execution_id = decode_optional_int64(
        values["job_execution_id"], column="job_execution_id", minimum=1
    )
    return OperatorRecord(
        id=OperatorRequestId(decode_int64(values["id"], column="id", minimum=1)),
        action=action,
        operation_id=decode_text_value(OperationId, values["operation_id"], column="operation_id"),
        actor=decode_text_value(ActorRef, values["actor_ref"], column="actor_ref"),
        reason=None
        if reason is None
        else decode_text_value(ReasonCode, reason, column="reason_code"),
        digest=RequestDigest(decode_digest(values["request_digest"], column="request_digest")),
        job_instance_id=None if instance_id is None else JobInstanceId(instance_id),
        job_execution_id=None if execution_id is None else JobExecutionId(execution_id),
        observed_version=decode_optional_int64(
            values["observed_version"], column="observed_version", minimum=0
        ),
        prior_status=_decode_optional_status(values["prior_status"], column="prior_status"),
        result_status=_decode_optional_status(values["result_status"], column="result_status"),
        outcome=outcome,
        rejection=rejection,
        requested_at=decode_aware(values["requested_at"], column="requested_at"),
    )


def encode_operator_record_draft(draft: OperatorRecordDraft) -> dict[str, object]:
    """The parameters of operator_requests.sql insert_operator_request for `draft`.

    The authorization class is derived from the action here, so no caller can store another.
    """
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
