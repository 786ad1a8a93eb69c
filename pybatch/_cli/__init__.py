"""The `pybatch` operator command line: `pybatch._cli:main`.

Exit codes: `_EXIT_CODES` below, docs/operators.md (Exit codes) tells what each means.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import psycopg

from pybatch import _sqlstate
from pybatch import errors as e
from pybatch._cli import dashboard, explore, operator, retention, sql, worker
from pybatch._cli._arguments import check_argv
from pybatch._demo import demo

#: Exit codes and their error families, first match wins; then Unavailable by its SQLSTATE.
_EXIT_CODES: dict[int, tuple[type[BaseException], ...]] = {
    5: (e.CommitOutcomeUnknown, e.ChunkCommitOutcomeUnknown, e.OperationOutcomeUnknown),
    6: (e.PermissionDenied, e.AuthenticationFailed),
    # Retrying cannot help: the server takes no writes, or cancelled the statement.
    7: (e.ReadOnlyServer,),
    8: (e.StatementCancelled,),
    4: (
        *(e.JobNotFound, e.JobInstanceNotFound, e.JobExecutionNotFound),
        *(e.StepExecutionNotFound, e.StepPartitionNotFound, e.PartitionPlanNotPublished),
        e.UnknownStatement,
    ),
    2: (
        *(e.ConfigError, e.DatabaseNotFound, e.TlsVerificationFailed, e.PoolerRefused),
        *(e.SettingsNotApplied, e.PageSizeOutOfRange, e.CursorError),
        *(e.ExplorerAgeBoundTooSmall, e.ParameterFilterInvalid, e.RequestFieldError),
    ),
    3: (e.ExplorerTimeout,),
}
#: Insufficient privilege and the authentication refusals: "permission denied" (exit 6).
_PERMISSION_DENIED = frozenset({"42501", "28000", "28P01"})


def exit_code_for(error: BaseException) -> int:
    """One table from error family to exit code (docs/operators.md)."""
    for code, families in _EXIT_CODES.items():
        if isinstance(error, families):
            return code
    if isinstance(error, e.Unavailable):
        return 6 if error.sqlstate in _PERMISSION_DENIED else 3
    if isinstance(error, e.RetentionError) and not isinstance(error, e.RetentionPlanStale):
        return 2
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a reader that closed the pipe early (`| head`) ends it quietly (exit 0).

    As the "Note on SIGPIPE" of Python's `signal` docs says: stdout then points at devnull.
    """
    try:
        code = _run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


def _run(argv: Sequence[str] | None) -> int:
    """Run one command; every failure prints as one redacted line on stderr."""
    parser = argparse.ArgumentParser(prog="pybatch", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (sql, explore, demo, worker, operator, retention, dashboard):
        group.register(commands)
    try:
        # Before argparse: an undecodable argument would fail where first encoded, a traceback.
        check_argv(sys.argv[1:] if argv is None else argv)
        # A type refusing a value with a pybatch error raises through parse_args, reported below.
        args = parser.parse_args(argv)
        return int(args.handler(args))
    except e.PyBatchError as error:
        failure = error
    except psycopg.Error as error:  # a path that missed its mapping: still one line
        failure = _sqlstate.translate(error)
    if isinstance(failure, e.ExplorerRepositoryError):
        failure = failure.error  # the repository's own error names the cause
    print(f"pybatch: {type(failure).__name__}: {failure}", file=sys.stderr)
    return exit_code_for(failure)
