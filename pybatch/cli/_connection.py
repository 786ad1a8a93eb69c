"""Connection settings shared by every command that talks to PostgreSQL."""

from __future__ import annotations

import argparse
import os

from pybatch.config import ConnectionConfig, TlsMode

__all__ = ["add_connection_arguments", "config_from_args"]


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Connection options shared by every command that talks to PostgreSQL."""
    parser.add_argument(
        "--dsn",
        help="libpq DSN or URI; defaults to $PYBATCH_DSN (never printed)",
    )
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="connect without TLS (isolated environments only; default is verify-full)",
    )


def config_from_args(args: argparse.Namespace) -> ConnectionConfig:
    """The environment's PYBATCH_* settings, with `--dsn` and `--plaintext` on top."""
    environ = dict(os.environ)
    if args.dsn is not None:
        environ["PYBATCH_DSN"] = args.dsn
    if args.plaintext:
        environ["PYBATCH_TLS"] = TlsMode.PLAINTEXT.value
    return ConnectionConfig.from_env(environ)
