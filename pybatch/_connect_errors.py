"""Classifying a failed connection attempt: permanent refusals fail fast, the rest retry.

A wrong password, an unknown database or an untrusted certificate will not heal by
waiting for the acquire timeout, so they get their own `Unavailable` subclasses and
are raised at once. Everything else (server down, too many connections, a restart in
progress) stays a plain `Unavailable` that callers may retry.
"""

from __future__ import annotations

import psycopg

from pybatch.errors import (
    AuthenticationFailed,
    DatabaseNotFound,
    PermissionDenied,
    PyBatchError,
    TlsVerificationFailed,
    Unavailable,
)

__all__ = ["classify_connect_failure", "is_permanent"]

_AUTHENTICATION = frozenset({"28P01", "28000"})

# libpq raises connection failures without a SQLSTATE (the server's FATAL reaches the client
# only as text), so the server's and libpq's fixed English phrases are the only signal.
# They choose the error class; the text itself is never shown. A server with localized
# lc_messages yields plain Unavailable, which is retried as before: a miss, never a
# misclassification.
_PHRASES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("authentication failed for user",), "28P01"),
    (("fe_sendauth: no password supplied",), "28P01"),
    (("is not permitted to log in",), "28000"),
    (("no pg_hba.conf entry for",), "28000"),
    (("pg_hba.conf rejects connection",), "28000"),
    (('FATAL:  role "', '" does not exist'), "28000"),  # trust or peer authentication
    (('FATAL:  database "', '" does not exist'), "3D000"),
    (("permission denied for database",), "42501"),
)

_TLS_VERIFICATION_PHRASES = (
    "certificate verify failed",
    "does not match host name",
    "root certificate file",
    "server does not support SSL",
    "certificate has expired",
    "self-signed certificate",
    "self signed certificate",
)


def _sqlstate_of_connect_failure(error: psycopg.Error) -> str | None:
    state: str | None = getattr(error, "sqlstate", None)
    if state is not None:
        return state
    text = str(error)
    for phrases, phrase_state in _PHRASES:
        if all(phrase in text for phrase in phrases):
            return phrase_state
    return None


def classify_connect_failure(error: psycopg.Error) -> PyBatchError:
    """The pybatch error for a failed `psycopg.connect` (message text never copied)."""
    state = _sqlstate_of_connect_failure(error)
    if state in _AUTHENTICATION:
        return AuthenticationFailed(sqlstate=state)
    if state == "3D000":
        return DatabaseNotFound(sqlstate=state)
    if state == "42501":
        return PermissionDenied()
    if state is None and any(phrase in str(error) for phrase in _TLS_VERIFICATION_PHRASES):
        return TlsVerificationFailed()
    return Unavailable(sqlstate=state)


def is_permanent(error: PyBatchError) -> bool:
    """True for refusals that waiting cannot fix."""
    return isinstance(
        error, AuthenticationFailed | DatabaseNotFound | TlsVerificationFailed | PermissionDenied
    )
