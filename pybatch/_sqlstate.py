"""The only place that reads driver errors and maps them to pybatch errors.

Meaning comes from the SQLSTATE and constraint name, never from message text (it changes with
version and locale, and can quote row values or the DSN's host: errors are raised `from None`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import psycopg

from pybatch import errors as e

#: Unique constraints that arbitrate a race (another unit of work won); `overrides` add more.
#: Any other constraint is a bug or corrupt input: IntegrityViolation.
CONSTRAINT_ERRORS: Mapping[str, Callable[[], e.PyBatchError]] = dict.fromkeys(
    (
        *("job_instance_identity_unique", "job_definition_revision_unique"),
        *("job_definition_digest_unique", "job_execution_attempt_unique"),
        *("job_execution_one_unresolved", "recovery_decision_version_unique"),
        *("flow_decision_sequence_unique", "flow_decision_source_unique"),
        *("operator_request_identity_unique", "retention_action_identity_unique"),
    ),
    e.ConcurrentModification,
)

_RETRYABLE = frozenset({"40001", "40P01"})
_INTEGRITY = frozenset({"23505", "23514", "23502", "23503", "23P01", "23000", "23001"})
_SCHEMA_MISSING = frozenset({"42P01", "3F000"})
_CONNECTION_LOSS = frozenset({"57P01", "57P02", "57P03", "25P03"})
_AUTHENTICATION = frozenset({"28P01", "28000"})
#: Where a standby raises 0A000 for READ WRITE; elsewhere 0A000 can mean a stale cached plan.
_READ_WRITE_REFUSALS = frozenset({"call_bool_check_hook"})
#: 42501's fixed English phrases name the object (a localized server: no name, never a wrong one).
_DENIED = re.compile(r"(permission denied for|must be owner of) (\w+) ([\w.]+)\Z")


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, if the server sent one."""
    return getattr(exc, "sqlstate", None)


def _diagnostic(exc: BaseException, field: str) -> str | None:
    """A field of the server's diagnostics (`constraint_name`, ...), if it sent one."""
    return getattr(exc.diag, field) if isinstance(exc, psycopg.Error) else None


def is_connection_loss(exc: BaseException, conn: psycopg.Connection[object] | None) -> bool:
    """True when the connection can no longer be trusted (class 08, admin shutdown, closed)."""
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = sqlstate_of(exc)
    if state is None:
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return state.startswith("08") or state in _CONNECTION_LOSS


def translate(
    exc: BaseException,
    *,
    overrides: Mapping[str, Callable[[], e.PyBatchError]] | None = None,
    schema_probe: bool = False,
) -> e.PyBatchError:
    """Map a driver error raised by a pybatch statement to the contract's error."""
    state = sqlstate_of(exc)
    if state in _RETRYABLE:
        return e.RetryableConflict(sqlstate=state)
    if state in _INTEGRITY:
        name = _diagnostic(exc, "constraint_name") or "unnamed"
        if state == "23505":
            factory = (overrides or {}).get(name) or CONSTRAINT_ERRORS.get(name)
            if factory is not None:
                return factory()
        return e.IntegrityViolation(constraint=name)
    if schema_probe and state in _SCHEMA_MISSING:
        return e.SchemaUninitialized()
    if state == "42501":
        return e.PermissionDenied(**_denied_object(exc))
    source = _diagnostic(exc, "source_function")
    if state == "25006" or (state == "0A000" and source in _READ_WRITE_REFUSALS):
        return e.ReadOnlyServer(sqlstate=state)
    if state == "57014":
        return e.StatementCancelled(sqlstate=state)
    return e.Unavailable(sqlstate=state)


def _denied_object(exc: BaseException) -> dict[str, str]:
    """The object the server refused, and the privilege when the server names it."""
    if (match := _DENIED.match(_diagnostic(exc, "message_primary") or "")) is None:
        return {}
    named = {"object_name": f"{match.group(2)} {match.group(3)}"}
    if match.group(1) == "must be owner of":
        named["privilege"] = "OWNER"
    return named


def classify_business_error(
    exc: BaseException, conn: psycopg.Connection[object] | None
) -> e.BusinessTransactionError:
    """Classify an ETL statement's failure in a chunk; only Infrastructure loses the connection."""
    if is_connection_loss(exc, conn):
        return e.Infrastructure()
    state = sqlstate_of(exc)
    if state == "57014":
        return e.Cancelled()
    if state == "55P03":
        return e.LockTimeout()
    if state in _RETRYABLE:  # the connection is healthy; the transaction can only roll back
        return e.TransientConflict(sqlstate=state)
    # 25P02: a later statement after a rejected one; the connection is healthy.
    if state is not None and (state[:2] in {"22", "23", "42"} or state == "25P02"):
        # The constraint, table and column the server's diagnostics name (names, never values).
        at_fault = {
            key: _diagnostic(exc, f"{key}_name") for key in ("constraint", "table", "column")
        }
        return e.Rejected(sqlstate=state, **at_fault)
    if state is None and isinstance(exc, psycopg.ProgrammingError | psycopg.DataError):
        return e.Rejected(sqlstate="22000")
    return e.Infrastructure()


# libpq reports connection failures without a SQLSTATE, so fixed English phrases choose the
# class (never shown); localized lc_messages yield plain Unavailable: a miss, never a wrong one.
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
#: Without a SQLSTATE, phrases that name a cause more precisely than "unavailable" (libpq's
#: and PgBouncer's), first match wins.
_CONNECT_REFUSALS: tuple[tuple[str, Callable[[], e.PyBatchError]], ...] = (
    ("server does not support SSL", e.TlsNotOffered),
    ("unsupported startup parameter", e.PoolerRefused),  # PgBouncer, without ignore_startup_...
    ("Connection refused", e.ServerUnreachable),
    *(
        (phrase, e.TlsVerificationFailed)
        for phrase in (
            *("certificate verify failed", "does not match host name", "root certificate file"),
            *("certificate has expired", "self-signed certificate", "self signed certificate"),
        )
    ),
)


def classify_connect_failure(error: psycopg.Error) -> e.PyBatchError:
    """The pybatch error for a failed `psycopg.connect` (message text never copied)."""
    text = str(error)
    state = sqlstate_of(error)
    if state is None:
        state = next((code for phrases, code in _PHRASES if all(p in text for p in phrases)), None)
    if state in _AUTHENTICATION:
        return e.AuthenticationFailed(sqlstate=state)
    if state == "3D000":
        return e.DatabaseNotFound(sqlstate=state)
    if state == "42501":
        return e.PermissionDenied()
    if state is None:
        for phrase, refusal in _CONNECT_REFUSALS:
            if phrase in text:
                return refusal()
    return e.Unavailable(sqlstate=state)


def is_permanent(error: e.PyBatchError) -> bool:
    """True for refusals that waiting cannot fix."""
    return isinstance(
        error,
        e.AuthenticationFailed
        | e.DatabaseNotFound
        | e.TlsVerificationFailed
        | e.PermissionDenied
        | e.PoolerRefused
        | e.SettingsNotApplied,
    )
