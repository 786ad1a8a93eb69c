"""The public surface is curated: a short top level, a few public modules, the rest underscored.

A user imports from `pybatch` (the top level), `pybatch.etl`, `pybatch.errors`,
`pybatch.testing` and `pybatch.values` (the value types a job builds). Every other module is
private machinery and its name says so with a leading underscore, so that a reader of an
import line knows at once whether it leans on a supported name. Changing the top level is a
deliberate act: this test pins it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pybatch

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = {"pybatch", "pybatch.etl", "pybatch.errors", "pybatch.testing", "pybatch.values"}

TOP_LEVEL = sorted(
    """
    AbandonedInstance BusinessTransactionError CaCertificate Cancelled Chunk
    ChunkCommitOutcomeUnknown ChunkTransactionError Clock CommitOutcomeUnknown
    CompletedInstance ConcurrentModification ConfigError ConnectionConfig DomainError
    ExecutionAlreadyActive ExecutionOwnershipLost FaultStateError IllegalTransition
    Infrastructure IntegrityViolation Job JobExecutionNotFound JobExplorer JobInstanceNotFound
    JobRepository JobRun LifecycleError MigrationError MigrationRequired NewerSchema
    NotCommitted PartitionRun Pooler PyBatchError Rejected RepositoryError RetryableConflict
    SchemaUninitialized StaleVersion StateError StepExecutionNotFound StepOutcome StepRun
    StopRequested SystemClock TlsMode TransactionAborted Unavailable UnitOfWork
    UnsupportedCapability installed_schema_version migrate supported_schema_version
    """.split()
)


def _modules() -> list[str]:
    found = []
    for path in sorted((ROOT / "pybatch").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] in {"__init__", "__main__"}:
            parts = parts[:-1]
        found.append(".".join(parts))
    return found


def test_the_top_level_names_are_pinned_and_at_most_eighty() -> None:
    assert sorted(pybatch.__all__) == TOP_LEVEL
    assert len(TOP_LEVEL) <= 80


def test_every_top_level_name_resolves() -> None:
    missing = [name for name in pybatch.__all__ if not hasattr(pybatch, name)]
    assert missing == []


def test_a_module_outside_the_public_ones_is_underscored() -> None:
    def public(module: str) -> bool:
        parts = module.split(".")
        return not any(part.startswith("_") for part in parts)

    exposed = [
        module
        for module in _modules()
        if public(module)
        and module not in PUBLIC_MODULES
        and not any(module.startswith(f"{p}.") for p in ("pybatch.values",))
    ]
    assert exposed == [], "name private machinery with a leading underscore"


def test_every_public_module_imports() -> None:
    for module in PUBLIC_MODULES:
        importlib.import_module(module)
