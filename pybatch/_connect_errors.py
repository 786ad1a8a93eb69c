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

# libpq reports TLS failures without a SQLSTATE; these fixed phrases of libpq and OpenSSL
# are the only signal. They decide the error class only, the text is never shown.
_TLS_VERIFICATION_PHRASES = (
    "certificate verify failed",
    "does not match host name",
    "root certificate file",
    "server does not support SSL",
    "certificate has expired",
    "self-signed certificate",
    "self signed certificate",
)


def classify_connect_failure(error: psycopg.Error) -> PyBatchError:
    """The pybatch error for a failed `psycopg.connect` (message text never copied)."""
    state = getattr(error, "sqlstate", None)
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
