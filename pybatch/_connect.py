"""Opening connections: TLS material, the forced settings, and redacted failures."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

from pybatch._codecs._jsonb import install_strict_json_loads
from pybatch._config import ConnectionConfig
from pybatch._sqlstate import classify_connect_failure, is_permanent
from pybatch.errors import PyBatchError


def _redacted_argument(value: object) -> object:
    """A psycopg.pool log argument with the server host, user and message text removed."""
    if isinstance(value, bool | int | float | str):
        return value  # strings are pool and thread names, never connection details
    if isinstance(value, BaseException):
        state = getattr(value, "sqlstate", None)
        return type(value).__name__ if state is None else f"{type(value).__name__} ({state})"
    if isinstance(value, psycopg.Connection):
        return "<connection>"
    return "<redacted>"


class _PoolRecordRedactor(logging.Filter):
    """Rewrites psycopg.pool log records: connections and driver errors name host and user."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted_argument(value) for value in record.args)
        elif record.args is not None:
            record.args = {key: _redacted_argument(v) for key, v in record.args.items()}
        if not isinstance(record.msg, str):
            record.msg = str(_redacted_argument(record.msg))
        record.exc_info = None
        record.exc_text = None
        return True


logging.getLogger("psycopg.pool").addFilter(_PoolRecordRedactor())


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
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


@contextlib.contextmanager
def open_connection(
    config: ConnectionConfig, *, autocommit: bool
) -> Iterator[psycopg.Connection[Any]]:
    """A dedicated connection (migrator, `sql explain`): no statement timeout, redacted errors."""
    ca_file = CaFile(config)
    try:
        kwargs = config.connection_kwargs(ca_file=ca_file.path, statement_timeout=False)
        with contextlib.closing(connect_or_raise(kwargs, autocommit=autocommit)) as conn:
            install_strict_json_loads(conn)
            yield conn
    finally:
        ca_file.close()


def connect_or_raise(kwargs: Mapping[str, Any], *, autocommit: bool) -> psycopg.Connection[Any]:
    """`psycopg.connect`; a failure is raised outside `except`: the driver's names the host."""
    try:
        return psycopg.connect(**kwargs, autocommit=autocommit)
    except psycopg.Error as error:
        failure = classify_connect_failure(error)
    raise failure


def probe_connection(config: ConnectionConfig, ca_file: CaFile) -> PyBatchError | None:
    """Connect once: raise a permanent refusal, return a transient one (None: it connected)."""
    try:
        connect_or_raise(config.connection_kwargs(ca_file=ca_file.path), autocommit=True).close()
    except PyBatchError as error:
        if is_permanent(error):
            raise
        return error
    return None


# Connections whose server sent a FATAL while they sat idle (libpq hands an unsolicited error
# to the notice processor); weak, so a dropped connection leaves no trace here.
_ENDED: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def watch_for_termination(conn: psycopg.Connection[Any]) -> None:
    """Remember it when the server ends `conn` (a FATAL notice), for the checkout check."""
    ref = weakref.ref(conn)

    def on_notice(diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.severity_nonlocalized in ("FATAL", "PANIC") and (watched := ref()):
            _ENDED.add(watched)

    conn.add_notice_handler(on_notice)


def _readable(fd: int) -> bool:
    """Whether input waits on `fd`: poll takes any descriptor, select none from 1024 on."""
    if not hasattr(select, "poll"):
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def check_idle_connection(conn: psycopg.Connection[Any]) -> None:
    """Pool checkout check, no round trip: refuse (close) a connection ended while idle.

    A readable idle socket means the server sent something unasked, typically a FATAL and
    end of file; the input is consumed and EOF, a broken connection or a FATAL recorded by
    `watch_for_termination` (EOF may still be on the way) is refused. TLS tickets are harmless.
    """
    if not (conn.closed or conn.broken):
        pgconn = conn.pgconn
        with contextlib.suppress(psycopg.Error, OSError):
            if not _readable(pgconn.socket):
                return  # nothing arrived while idle (the common case): a FATAL is parsed only here
            for _ in range(2):  # the FATAL and the end of file may arrive in two reads
                pgconn.consume_input()
                pgconn.is_busy()  # parses what arrived: a FATAL goes to the notice handler
                if not _readable(pgconn.socket):
                    break
            if pgconn.status == psycopg.pq.ConnStatus.OK and conn not in _ENDED:
                return
    conn.close()
    raise psycopg.OperationalError("the server ended the connection")
