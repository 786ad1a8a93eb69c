"""Recovery decisions: recovery_decision rows."""

from __future__ import annotations

import attrs

from pybatch._codecs import _primitives as p
from pybatch.errors import PyBatchError
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import BatchStatus

#: A recovery_decision row's columns: the fields of RecoveryDecision, in table order.
RECOVERY_DECISION_COLUMNS = tuple(attrs.fields_dict(RecoveryDecision))


def decode_recovery_decision(row: p.Row) -> RecoveryDecision:
    """Decode a recovery_decision row (columns `RECOVERY_DECISION_COLUMNS`)."""
    values = p.row_columns(row, RECOVERY_DECISION_COLUMNS)
    try:
        return RecoveryDecision(
            id=p.int64_at(values, "id"),
            job_execution_id=p.int64_at(values, "job_execution_id"),
            execution_version=p.int64_at(values, "execution_version", 0),
            prior_status=p.enum_at(BatchStatus, values, "prior_status"),
            resulting_status=p.enum_at(BatchStatus, values, "resulting_status"),
            reason_code=p.text_at(values, "reason_code"),
            operator_reference=p.text_at(values, "operator_reference"),
            evidence_digest=p.digest_at(values, "evidence_digest"),
            decided_at=p.aware_at(values, "decided_at"),
        )
    except (PyBatchError, ValueError):
        raise p.DecodeError("recovery_decision") from None
