"""pybatch: a durable, SQL-first job repository on PostgreSQL for synchronous ETL scripts.

The names here are the supported surface: the ETL API (`Job`, `JobRun`, `StepRun`,
`PartitionRun`, `Chunk`), the repository (`JobRepository`, `UnitOfWork`, `JobExplorer`),
configuration and migrations, and the error families with the leaves an ETL script or an
operator tool catches. Every other error is importable from `pybatch.errors`, and the values
from `pybatch.values`; every underscored module is machinery that may change
(tests/sql/test_public_surface.py pins this).
"""

from __future__ import annotations

from pybatch._clock import Clock, SystemClock
from pybatch._config import CaCertificate, ConnectionConfig, Pooler, TlsMode
from pybatch._explorer import JobExplorer
from pybatch._job_repository import JobRepository
from pybatch._migrator import installed_schema_version, migrate, supported_schema_version
from pybatch._unit_of_work import UnitOfWork
from pybatch.errors import (
    AbandonedInstance,
    BusinessTransactionError,
    Cancelled,
    ChunkCommitOutcomeUnknown,
    ChunkTransactionError,
    CommitOutcomeUnknown,
    CompletedInstance,
    ConcurrentModification,
    ConfigError,
    DomainError,
    ExecutionAlreadyActive,
    ExecutionOwnershipLost,
    FaultStateError,
    IllegalTransition,
    Infrastructure,
    IntegrityViolation,
    JobExecutionNotFound,
    JobInstanceNotFound,
    LifecycleError,
    MigrationError,
    MigrationRequired,
    NewerSchema,
    NotCommitted,
    PyBatchError,
    Rejected,
    RepositoryError,
    RetryableConflict,
    SchemaUninitialized,
    StaleVersion,
    StateError,
    StepExecutionNotFound,
    StopRequested,
    TransactionAborted,
    Unavailable,
    UnsupportedCapability,
)
from pybatch.etl import Chunk, Job, JobRun, PartitionRun, StepOutcome, StepRun

__all__ = [
    "AbandonedInstance",
    "BusinessTransactionError",
    "CaCertificate",
    "Cancelled",
    "Chunk",
    "ChunkCommitOutcomeUnknown",
    "ChunkTransactionError",
    "Clock",
    "CommitOutcomeUnknown",
    "CompletedInstance",
    "ConcurrentModification",
    "ConfigError",
    "ConnectionConfig",
    "DomainError",
    "ExecutionAlreadyActive",
    "ExecutionOwnershipLost",
    "FaultStateError",
    "IllegalTransition",
    "Infrastructure",
    "IntegrityViolation",
    "Job",
    "JobExecutionNotFound",
    "JobExplorer",
    "JobInstanceNotFound",
    "JobRepository",
    "JobRun",
    "LifecycleError",
    "MigrationError",
    "MigrationRequired",
    "NewerSchema",
    "NotCommitted",
    "PartitionRun",
    "Pooler",
    "PyBatchError",
    "Rejected",
    "RepositoryError",
    "RetryableConflict",
    "SchemaUninitialized",
    "StaleVersion",
    "StateError",
    "StepExecutionNotFound",
    "StepOutcome",
    "StepRun",
    "StopRequested",
    "SystemClock",
    "TlsMode",
    "TransactionAborted",
    "Unavailable",
    "UnitOfWork",
    "UnsupportedCapability",
    "installed_schema_version",
    "migrate",
    "supported_schema_version",
]
