"""Job executions: job_execution rows (docs/tables.md 2.6)."""

from __future__ import annotations

from pybatch._codecs import lifecycle
from pybatch._codecs._primitives import DecodeError, Row, int64_at, optional_int64_at, row_columns
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import DefinitionId, JobExecutionId, JobInstanceId
from pybatch.values.records import JobExecution

#: Columns `decode_job_execution` reads (no counters).
JOB_EXECUTION_COLUMNS = (
    "id",
    "job_instance_id",
    "definition_id",
    "upgrade_from_definition_id",
    "restart_of_execution_id",
    "attempt",
    "status",
    "exit_code",
    *lifecycle.FAILURE_COLUMNS,
    *lifecycle.INSTANT_COLUMNS,
    "version",
)

_I32_MAX = 2**31 - 1


def decode_job_execution(row: Row) -> JobExecution:
    """Decode a job_execution row (columns `JOB_EXECUTION_COLUMNS`); counters are zero."""
    values = row_columns(row, JOB_EXECUTION_COLUMNS)
    upgrade_from = optional_int64_at(values, "upgrade_from_definition_id")
    restart_of = optional_int64_at(values, "restart_of_execution_id")
    attempt = int64_at(values, "attempt")
    if attempt > _I32_MAX:
        raise DecodeError("attempt")
    metadata = lifecycle.decode_metadata(values, ExecutionCounts())
    return JobExecution(
        id=JobExecutionId(int64_at(values, "id")),
        job_instance_id=JobInstanceId(int64_at(values, "job_instance_id")),
        attempt=attempt,
        definition_id=DefinitionId(int64_at(values, "definition_id")),
        metadata=metadata,
        updated_at=lifecycle.decode_updated_at(values, metadata),
        version=int64_at(values, "version", 0),
        restart_of_execution_id=None if restart_of is None else JobExecutionId(restart_of),
        upgrade_from_definition_id=None if upgrade_from is None else DefinitionId(upgrade_from),
    )
