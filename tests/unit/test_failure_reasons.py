"""The reason a failure records: the class, a redacted and bounded message, the server's names."""

from __future__ import annotations

import psycopg

from pybatch._failure_reasons import failure_reason
from pybatch.errors import Rejected

SECRET = "Zq9-hunter2"


def test_credentials_secret_pairs_and_known_secrets_are_redacted() -> None:
    error = RuntimeError(
        f"connect postgresql://etl:{SECRET}@db:5432/x failed; password={SECRET} "
        f"api_key: abc123 token '{SECRET}' for business date {SECRET}\\n"
    )
    reason = failure_reason(error, [SECRET, "ab"])
    assert SECRET not in reason.message and "abc123" not in reason.message
    assert "postgresql://<redacted>@db:5432/x" in reason.message
    assert "password=<redacted>" in reason.message and "api_key: <redacted>" in reason.message
    assert reason.error_class == "RuntimeError"


def test_a_long_message_is_bounded_to_a_thousand_bytes() -> None:
    reason = failure_reason(ValueError("é" * 5000), [])
    assert len(reason.message.encode()) <= 1000 and reason.message.endswith("...")


def test_a_driver_error_keeps_its_sqlstate_but_never_its_message() -> None:
    error = psycopg.errors.InvalidTextRepresentation(f'invalid input syntax: "{SECRET}"')
    reason = failure_reason(error, [])
    assert SECRET not in str(reason)
    assert reason.error_class == "psycopg.errors.InvalidTextRepresentation"
    assert str(reason).endswith("(SQLSTATE 22P02)")


def test_a_rejected_write_keeps_the_servers_names() -> None:
    error = Rejected(sqlstate="23505", constraint="orders_pkey", table="orders")
    reason = failure_reason(error, [])
    assert (reason.sqlstate, reason.constraint, reason.table, reason.column) == (
        "23505",
        "orders_pkey",
        "orders",
        None,
    )
    assert str(reason) == (
        "pybatch.errors.Rejected: business statement was rejected (SQLSTATE 23505): "
        "constraint orders_pkey, table orders"
    )
