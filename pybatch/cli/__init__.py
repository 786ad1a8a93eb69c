"""The `pybatch` operator command line: `pybatch.cli:main`.

Commands call the migrator, the repository or the explorer; none holds SQL. Exit
codes: 0 done, 1 refused (a pybatch error), 2 usage, 3 unavailable, 4 outcome unknown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pybatch.cli import demo, schema, worker
from pybatch.errors import (
    ChunkCommitOutcomeUnknown,
    CommitOutcomeUnknown,
    ConfigError,
    PyBatchError,
    Unavailable,
)

__all__ = ["build_parser", "exit_code_for", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command group."""
    parser = argparse.ArgumentParser(prog="pybatch", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    schema.register(commands)
    demo.register(commands)
    worker.register(commands)
    return parser


def exit_code_for(error: BaseException) -> int:
    """One table from error family to exit code."""
    if isinstance(error, CommitOutcomeUnknown | ChunkCommitOutcomeUnknown):
        return 4
    if isinstance(error, Unavailable):
        return 3
    if isinstance(error, ConfigError):
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
