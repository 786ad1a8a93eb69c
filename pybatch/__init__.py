"""pybatch: a durable, SQL-first job repository on PostgreSQL for synchronous ETL scripts.

The names here are the supported surface (tests/sql/test_public_surface.py pins them); other
errors live in `pybatch.errors`, values in `pybatch.values`. Underscored modules may change.
"""

import types as _types

from pybatch._clock import Clock as Clock
from pybatch._clock import SystemClock as SystemClock
from pybatch._config import CaCertificate as CaCertificate
from pybatch._config import ConnectionConfig as ConnectionConfig
from pybatch._config import Pooler as Pooler
from pybatch._config import TlsMode as TlsMode
from pybatch._explorer import JobExplorer as JobExplorer
from pybatch._job_repository import JobRepository as JobRepository
from pybatch._migrator import installed_schema_version as installed_schema_version
from pybatch._migrator import migrate as migrate
from pybatch._migrator import supported_schema_version as supported_schema_version
from pybatch._unit_of_work import UnitOfWork as UnitOfWork
from pybatch.errors import AbandonedInstance as AbandonedInstance
from pybatch.errors import BusinessTransactionError as BusinessTransactionError
from pybatch.errors import Cancelled as Cancelled
from pybatch.errors import ChunkCommitOutcomeUnknown as ChunkCommitOutcomeUnknown
from pybatch.errors import ChunkTransactionError as ChunkTransactionError
from pybatch.errors import CommitOutcomeUnknown as CommitOutcomeUnknown
from pybatch.errors import CompletedInstance as CompletedInstance
from pybatch.errors import ConcurrentModification as ConcurrentModification
from pybatch.errors import ConfigError as ConfigError
from pybatch.errors import DomainError as DomainError
from pybatch.errors import ExecutionAlreadyActive as ExecutionAlreadyActive
from pybatch.errors import ExecutionOwnershipLost as ExecutionOwnershipLost
from pybatch.errors import FaultStateError as FaultStateError
from pybatch.errors import IllegalTransition as IllegalTransition
from pybatch.errors import Infrastructure as Infrastructure
from pybatch.errors import IntegrityViolation as IntegrityViolation
from pybatch.errors import JobExecutionNotFound as JobExecutionNotFound
from pybatch.errors import JobInstanceNotFound as JobInstanceNotFound
from pybatch.errors import LifecycleError as LifecycleError
from pybatch.errors import MigrationError as MigrationError
from pybatch.errors import MigrationRequired as MigrationRequired
from pybatch.errors import NewerSchema as NewerSchema
from pybatch.errors import NotCommitted as NotCommitted
from pybatch.errors import PyBatchError as PyBatchError
from pybatch.errors import Rejected as Rejected
from pybatch.errors import RepositoryError as RepositoryError
from pybatch.errors import RetryableConflict as RetryableConflict
from pybatch.errors import SchemaUninitialized as SchemaUninitialized
from pybatch.errors import StaleVersion as StaleVersion
from pybatch.errors import StateError as StateError
from pybatch.errors import StepExecutionNotFound as StepExecutionNotFound
from pybatch.errors import StopRequested as StopRequested
from pybatch.errors import TransactionAborted as TransactionAborted
from pybatch.errors import Unavailable as Unavailable
from pybatch.errors import UnsupportedCapability as UnsupportedCapability
from pybatch.etl import Chunk as Chunk
from pybatch.etl import Job as Job
from pybatch.etl import JobRun as JobRun
from pybatch.etl import PartitionRun as PartitionRun
from pybatch.etl import StepOutcome as StepOutcome
from pybatch.etl import StepRun as StepRun

#: Every name imported above that is not a module (importing pybatch.etl binds `etl` here).
__all__ = sorted(
    name
    for name, value in globals().items()
    if not name.startswith("_") and not isinstance(value, _types.ModuleType)
)
