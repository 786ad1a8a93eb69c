"""Job executions and their recovery decisions: job_execution and recovery_decision rows."""

from __future__ import annotations

import attrs

from pybatch._codecs import _primitives as p
from pybatch._codecs import lifecycle
from pybatch.errors import PyBatchError
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import DefinitionId, JobExecutionId, JobInstanceId
from pybatch.values.records import JobExecution
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import BatchStatus

#: Columns `decode_job_execution` reads (no counters).
JOB_EXECUTION_COLUMNS = (
    *("id", "job_instance_id", "definition_id", "upgrade_from_definition_id"),
    *("restart_of_execution_id", "attempt", "status", "exit_code"),
    *(*lifecycle.FAILURE_COLUMNS, *lifecycle.INSTANT_COLUMNS, "version"),
)

_I32_MAX = 2**31 - 1


def decode_job_execution(row: p.Row) -> JobExecution:
    """Decode a job_execution row (columns `JOB_EXECUTION_COLUMNS`); counters are zero."""
    values = p.row_columns(row, JOB_EXECUTION_COLUMNS)
    upgrade_from = p.optional_int64_at(values, "upgrade_from_definition_id")
    restart_of = p.optional_int64_at(values, "restart_of_execution_id")
    attempt = p.int64_at(values, "attempt")
    if attempt > _I32_MAX:
        raise p.DecodeError("attempt")
    metadata = lifecycle.decode_metadata(values, ExecutionCounts())
    return JobExecution(
        id=JobExecutionId(p.int64_at(values, "id")),
        job_instance_id=JobInstanceId(p.int64_at(values, "job_instance_id")),
        attempt=attempt,
        definition_id=DefinitionId(p.int64_at(values, "definition_id")),
        metadata=metadata,
        updated_at=lifecycle.decode_updated_at(values, metadata),
        version=p.int64_at(values, "version", 0),
        restart_of_execution_id=None if restart_of is None else JobExecutionId(restart_of),
        upgrade_from_definition_id=None if upgrade_from is None else DefinitionId(upgrade_from),
    )


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
