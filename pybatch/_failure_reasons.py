"""What a failed step or run records about its exception, redacted and bounded.

A driver error keeps only its SQLSTATE and the server's names (its text can quote rows); any
other text is scrubbed of credentials and the run's secrets, then bounded to 1,000 bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import psycopg

from pybatch.errors import PyBatchError
from pybatch.values.status import FailureReason

_MAX_MESSAGE_BYTES = 1000
_SQLSTATE = re.compile(r"[0-9A-Z]{5}\Z")
_URI_CREDENTIALS = re.compile(r"(\b[A-Za-z][\w+.-]*://)[^\s/@]*@")
_SECRET_PAIR = re.compile(
    r"\b(password|passwd|pwd|secret|token|api[_-]?key|sslpassword)(\s*[=:]\s*)('[^']*'|\S+)",
    re.IGNORECASE,
)
#: Control characters: a recorded message or skipped item's key is one line of text.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
REDACTED = "<redacted>"


def server_name(value: object) -> str | None:
    """A server identifier as the columns hold it (1..63 bytes), else None."""
    if type(value) is not str or not 1 <= len(value.encode()) <= 63:
        return None
    return value


def bounded(text: str, limit: int = _MAX_MESSAGE_BYTES) -> str:
    """`text` cut to `limit` UTF-8 bytes, "..." marking a cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` without credentials, secret pairs, control characters or any of `secrets`."""
    for secret in sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URI_CREDENTIALS.sub(rf"\1{REDACTED}@", text)
    text = _SECRET_PAIR.sub(rf"\1\2{REDACTED}", text)
    return CONTROL.sub(" ", text)


def failure_reason(error: BaseException, secrets: Iterable[str]) -> FailureReason:
    """The reason recorded for `error`: class, redacted message, the server's names."""
    cls = type(error)
    module = "" if cls.__module__ == "builtins" else f"{cls.__module__}."
    error_class = f"{module}{cls.__qualname__}"[:200]
    sqlstate = getattr(error, "sqlstate", None)
    keys = ("constraint", "table", "column")
    if isinstance(error, psycopg.Error):
        names = [getattr(error.diag, f"{key}_name") for key in keys]
        message = "the driver's message is withheld: it may quote row values"
    else:
        names = [getattr(error, key, None) for key in keys]
        # pybatch's own messages are built from names and bounds only (pybatch/errors.py).
        text = str(error) if isinstance(error, PyBatchError) else redact(str(error), secrets)
        message = bounded(text) or "(no message)"
    return FailureReason(
        error_class=error_class,
        message=message,
        sqlstate=sqlstate if isinstance(sqlstate, str) and _SQLSTATE.match(sqlstate) else None,
        constraint=server_name(names[0]),
        table=server_name(names[1]),
        column=server_name(names[2]),
    )
