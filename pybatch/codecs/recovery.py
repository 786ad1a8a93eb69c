"""Recovery decisions: recovery_decision rows (docs/tables.md 2.8).

Statements: recovery.sql insert_recovery_decision, find_latest_recovery_decision.
"""

from __future__ import annotations

from pybatch.codecs._primitives import (
    DecodeError,
    Row,
    decode_aware,
    decode_digest,
    decode_enum,
    decode_int64,
    decode_text,
    row_columns,
)
from pybatch.errors import PyBatchError
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import BatchStatus

#: Columns `decode_recovery_decision` reads.
RECOVERY_DECISION_COLUMNS = (
    "id",
    "job_execution_id",
    "execution_version",
    "prior_status",
    "resulting_status",
    "reason_code",
    "operator_reference",
    "evidence_digest",
    "decided_at",
)


def decode_recovery_decision(row: Row) -> RecoveryDecision:
    """Decode a recovery_decision row (columns `RECOVERY_DECISION_COLUMNS`)."""
    values = row_columns(row, RECOVERY_DECISION_COLUMNS)
    try:
        return RecoveryDecision(
            id=decode_int64(values["id"], column="id", minimum=1),
            job_execution_id=decode_int64(
                values["job_execution_id"], column="job_execution_id", minimum=1
            ),
            execution_version=decode_int64(
                values["execution_version"], column="execution_version", minimum=0
            ),
            prior_status=decode_enum(BatchStatus, values["prior_status"], column="prior_status"),
            resulting_status=decode_enum(
                BatchStatus, values["resulting_status"], column="resulting_status"
            ),
            reason_code=decode_text(values["reason_code"], column="reason_code"),
            operator_reference=decode_text(
                values["operator_reference"], column="operator_reference"
            ),
            evidence_digest=decode_digest(values["evidence_digest"], column="evidence_digest"),
            decided_at=decode_aware(values["decided_at"], column="decided_at"),
        )
    except (PyBatchError, ValueError):
        raise DecodeError("recovery_decision") from None
