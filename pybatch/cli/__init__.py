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

import psycopg

from pybatch import _sqlstate
from pybatch.cli import demo, explore, operator, retention, schema, sql, worker
from pybatch.cli._arguments import check_argv
from pybatch.errors import (
    AuthenticationFailed,
    ChunkCommitOutcomeUnknown,
    CommitOutcomeUnknown,
    ConfigError,
    CursorError,
    DatabaseNotFound,
    ExplorerAgeBoundTooSmall,
    ExplorerRepositoryError,
    ExplorerTimeout,
    JobExecutionNotFound,
    JobInstanceNotFound,
    OperationOutcomeUnknown,
    PageSizeOutOfRange,
    PartitionPlanNotPublished,
    PermissionDenied,
    PyBatchError,
    RequestFieldError,
    RetentionError,
    RetentionPlanStale,
    StepExecutionNotFound,
    StepPartitionNotFound,
    TlsVerificationFailed,
    Unavailable,
    UnknownStatement,
)

#: SQLSTATEs reported as "permission denied" (exit 6): insufficient privilege and the
#: authentication refusals.
_PERMISSION_DENIED = frozenset({"42501", "28000", "28P01"})


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


EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_CONFIGURATION = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_OUTCOME_UNKNOWN = 5
EXIT_PERMISSION_DENIED = 6

_NOT_FOUND = (
    JobInstanceNotFound,
    JobExecutionNotFound,
    StepExecutionNotFound,
    StepPartitionNotFound,
    PartitionPlanNotPublished,
    UnknownStatement,
)


def exit_code_for(error: BaseException) -> int:
    """One table from error family to exit code (docs/operators.md)."""
    if isinstance(error, ExplorerRepositoryError):
        error = error.error
    if isinstance(
        error, CommitOutcomeUnknown | ChunkCommitOutcomeUnknown | OperationOutcomeUnknown
    ):
        return EXIT_OUTCOME_UNKNOWN
    if isinstance(error, PermissionDenied | AuthenticationFailed):
        return EXIT_PERMISSION_DENIED
    if isinstance(error, _NOT_FOUND):
        return EXIT_NOT_FOUND
    if isinstance(error, ConfigError | DatabaseNotFound | TlsVerificationFailed):
        return EXIT_CONFIGURATION
    if isinstance(error, Unavailable):
        return EXIT_PERMISSION_DENIED if error.sqlstate in _PERMISSION_DENIED else EXIT_UNAVAILABLE
    if isinstance(error, ExplorerTimeout):
        return EXIT_UNAVAILABLE
    if isinstance(error, RetentionError) and not isinstance(error, RetentionPlanStale):
        return EXIT_CONFIGURATION
    if isinstance(
        error, PageSizeOutOfRange | CursorError | ExplorerAgeBoundTooSmall | RequestFieldError
    ):
        return EXIT_CONFIGURATION
    return EXIT_REFUSED


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure prints as one redacted line on stderr."""
    parser = build_parser()
    failure: PyBatchError | None = None
    try:
        # Before argparse: an undecodable argument would otherwise fail wherever it is
        # first encoded (psycopg, a print) with a UnicodeEncodeError traceback.
        check_argv(sys.argv[1:] if argv is None else argv)
        # A type that refuses a value with a pybatch error (a duration beyond its bound)
        # raises through parse_args and is reported below like any other refusal.
        args = parser.parse_args(argv)
        result: int = args.handler(args)
    except PyBatchError as error:
        failure = error
    except psycopg.Error as error:  # a path that missed its mapping: still one line
        failure = _sqlstate.translate(error)
    if failure is None:
        return result
    if isinstance(failure, ExplorerRepositoryError):
        failure = failure.error  # the repository's own error names the cause
    print(f"pybatch: {type(failure).__name__}: {failure}", file=sys.stderr)
    return exit_code_for(failure)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
