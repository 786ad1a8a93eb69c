"""The `pybatch` operator command line: `pybatch.cli:main`.

Commands call the migrator, the repository, the explorer or the services; none holds SQL. Exit
codes (docs/operators.md): 0 done (an empty result included), 1 refused (a pybatch error),
2 usage or configuration, 3 database unavailable, 4 not found, 5 outcome unknown,
6 permission denied.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pybatch.cli import demo, explore, operator, retention, schema, sql, worker
from pybatch.errors import (
    ChunkCommitOutcomeUnknown,
    CommitOutcomeUnknown,
    ConfigError,
    CursorError,
    ExplorerAgeBoundTooSmall,
    ExplorerRepositoryError,
    ExplorerTimeout,
    JobExecutionNotFound,
    JobInstanceNotFound,
    OperationOutcomeUnknown,
    PageSizeOutOfRange,
    PyBatchError,
    RequestFieldError,
    RetentionError,
    RetentionPlanStale,
    StepExecutionNotFound,
    StepPartitionNotFound,
    Unavailable,
    UnknownStatement,
)

#: SQLSTATEs reported as "permission denied" (exit 6): insufficient privilege and the
#: authentication refusals.
_PERMISSION_DENIED = frozenset({"42501", "28000", "28P01"})

__all__ = ["build_parser", "exit_code_for", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command group."""
    parser = argparse.ArgumentParser(prog="pybatch", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    schema.register(commands)
    explore.register(commands)
    sql.register(commands)
    demo.register(commands)
    worker.register(commands)
    operator.register(commands)
    retention.register(commands)
    return parser


def exit_code_for(error: BaseException) -> int:
    """One table from error family to exit code (docs/operators.md)."""
    if isinstance(error, ExplorerRepositoryError):
        error = error.error
    if isinstance(
        error, CommitOutcomeUnknown | ChunkCommitOutcomeUnknown | OperationOutcomeUnknown
    ):
        return 5
    if isinstance(
        error,
        JobInstanceNotFound
        | JobExecutionNotFound
        | StepExecutionNotFound
        | StepPartitionNotFound
        | UnknownStatement,
    ):
        return 4
    if isinstance(error, Unavailable):
        return 6 if error.sqlstate in _PERMISSION_DENIED else 3
    if isinstance(error, ExplorerTimeout):
        return 3
    if isinstance(error, RetentionError) and not isinstance(error, RetentionPlanStale):
        return 2
    if isinstance(
        error,
        ConfigError
        | PageSizeOutOfRange
        | CursorError
        | ExplorerAgeBoundTooSmall
        | RequestFieldError,
    ):
        return 2
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; errors print as one redacted line on stderr."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except PyBatchError as error:
        print(f"pybatch: {type(error).__name__}: {error}", file=sys.stderr)
        return exit_code_for(error)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
