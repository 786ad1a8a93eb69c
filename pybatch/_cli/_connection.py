"""The connection options of every command that talks to PostgreSQL; the DSN is never printed."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg
import psycopg.conninfo

from pybatch._config import ConnectionConfig, TlsMode
from pybatch._explorer import JobExplorer
from pybatch._job_repository import JobRepository
from pybatch._migrator import installed_schema_version
from pybatch.errors import DsnFileInsecure, DsnFileUnreadable

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]


def add_connection_arguments(
    parser: argparse.ArgumentParser,
    dsn_help: str = "libpq DSN or URI; defaults to $PYBATCH_DSN (never printed). A password in "
    "it is visible to local users in /proc/PID/cmdline: prefer --dsn-file or PYBATCH_DSN",
) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--dsn", help=dsn_help)
    source.add_argument(
        "--dsn-file",
        metavar="PATH",
        help="read the DSN from this file, which must have mode 0600 (never printed)",
    )
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="connect without TLS (isolated environments only; default is verify-full)",
    )


def add_command(
    commands: Commands, name: str, handler: Handler, *, connects: bool = True, **options: Any
) -> argparse.ArgumentParser:
    """A subcommand run by `handler`, with the connection options unless `connects` is False."""
    parser = commands.add_parser(name, **options)
    if connects:
        add_connection_arguments(parser)
    parser.set_defaults(handler=handler)
    return parser


def positive_id(what: str) -> Callable[[str], int]:
    """An argparse `type` for a positive id, refusing anything else as 'must be a positive ...'."""

    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"must be a positive {what}")
        return int(text)

    return parse


def progress(on_terminal: str, in_log: str) -> None:
    """Report progress on stderr: `on_terminal` without a newline on a terminal, else a line."""
    if sys.stderr.isatty():
        print(on_terminal, end="", file=sys.stderr, flush=True)
    else:
        print(in_log, file=sys.stderr)


def connect(args: argparse.Namespace) -> JobRepository:
    return JobRepository.connect(config_from_args(args))


@contextmanager
def open_explorer(args: argparse.Namespace) -> Iterator[JobExplorer]:
    """An explorer; one direct connection first reports a down server or refused login at once."""
    config = config_from_args(args)
    installed_schema_version(config)
    with JobRepository.connect(config) as repository:
        yield JobExplorer(repository)


def config_from_args(args: argparse.Namespace) -> ConnectionConfig:
    """The environment's PYBATCH_* settings, with `--dsn`/`--dsn-file` and `--plaintext` on top."""
    environ = dict(os.environ)
    if args.dsn is not None:
        if _has_password(args.dsn):
            print(
                "pybatch: warning: the password given with --dsn is visible to every local user "
                "in /proc/PID/cmdline; prefer PYBATCH_DSN or --dsn-file",
                file=sys.stderr,
            )
        environ["PYBATCH_DSN"] = args.dsn
    elif getattr(args, "dsn_file", None) is not None:
        environ["PYBATCH_DSN"] = read_dsn_file(args.dsn_file)
    if args.plaintext:
        environ["PYBATCH_TLS"] = TlsMode.PLAINTEXT.value
    return ConnectionConfig.from_env(environ)


def _has_password(dsn: str) -> bool:
    """Whether a DSN carries a password (a DSN that does not parse is treated as if it did)."""
    try:
        return bool(psycopg.conninfo.conninfo_to_dict(dsn).get("password"))
    except (psycopg.Error, UnicodeError, ValueError):  # not UTF-8: ConnectionConfig refuses it
        return True


def read_dsn_file(path: str) -> str:
    """The DSN in `path` (no symlink), refused unless only its owner may read or write it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise DsnFileUnreadable() from None
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise DsnFileUnreadable()
        if status.st_mode & 0o077:
            raise DsnFileInsecure(mode=oct(stat.S_IMODE(status.st_mode)))
        try:
            return handle.read(64 * 1024).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise DsnFileUnreadable() from None
