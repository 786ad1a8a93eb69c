"""pybatch: a durable, SQL-first job repository on PostgreSQL for synchronous ETL scripts."""

from __future__ import annotations

from pybatch.clock import Clock, SystemClock
from pybatch.config import CaCertificate, ConnectionConfig, TlsMode
from pybatch.migrator import (
    installed_schema_version,
    migrate,
    supported_schema_version,
)
from pybatch.repository import JobRepository
from pybatch.unit_of_work import UnitOfWork

__all__ = [
    "CaCertificate",
    "Clock",
    "ConnectionConfig",
    "JobRepository",
    "SystemClock",
    "TlsMode",
    "UnitOfWork",
    "installed_schema_version",
    "migrate",
    "supported_schema_version",
]
