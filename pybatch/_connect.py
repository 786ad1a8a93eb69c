"""Opening connections: TLS material, the forced settings, and redacted failures."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import psycopg

from pybatch.config import ConnectionConfig
from pybatch.errors import Unavailable

__all__ = ["CaFile", "connection_kwargs", "open_connection"]


class CaFile:
    """The configured CA bundle written to a private file for libpq, removed on close."""

    def __init__(self, config: ConnectionConfig) -> None:
        self.path: str | None = None
        self._dir: str | None = None
        if config.ca_certificate is not None:
            self._dir = tempfile.mkdtemp(prefix="pybatch-ca-")
            self.path = os.path.join(self._dir, "root.pem")
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(config.ca_certificate.pem)

    def close(self) -> None:
        """Remove the private copy of the bundle."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def connection_kwargs(
    config: ConnectionConfig, ca_file: CaFile, *, statement_timeout: bool = True
) -> dict[str, Any]:
    """Keyword arguments for `psycopg.connect` under this configuration."""
    return config.connection_kwargs(ca_file=ca_file.path, statement_timeout=statement_timeout)


@contextlib.contextmanager
def open_connection(
    config: ConnectionConfig, *, autocommit: bool
) -> Iterator[psycopg.Connection[Any]]:
    """A dedicated connection for the migrator: no statement timeout, redacted errors."""
    ca_file = CaFile(config)
    try:
        try:
            conn = psycopg.connect(
                **connection_kwargs(config, ca_file, statement_timeout=False),
                autocommit=autocommit,
            )
        except psycopg.Error as error:
            raise Unavailable(sqlstate=getattr(error, "sqlstate", None)) from None
        try:
            yield conn
        finally:
            conn.close()
    finally:
        ca_file.close()
