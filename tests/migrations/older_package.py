"""This package as it ran against an older schema, for the upgrade tests' runs before upgrading.

The current code writes what the current schema has; a run launched before the upgrade must
write only what its schema had. `older_package(monkeypatch, version)` accepts that schema
version and swaps each statement whose columns came later for the text it had then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

import pybatch._job_repository as repository_module
from pybatch._statements import Connection, Statement, load_statements

#: Migration 0012 adds job_execution.owner_host, which the claim of every launch writes.
OWNER_HOST = 12


class ClaimBefore0012:
    """`claim_execution_owner` as the package before migration 0012 ran it: no owner host."""

    def __init__(self, current: Statement) -> None:
        self._query = current.query.replace(b"owner_host = %(owner_host)s,\n", b"")
        assert b"owner_host" not in self._query

    def affected(self, conn: Connection, /, **params: object) -> int:
        del params["owner_host"]
        with conn.cursor() as cursor:
            cursor.execute(self._query, params)
            return cursor.rowcount


@contextlib.contextmanager
def older_package(monkeypatch: pytest.MonkeyPatch, version: int) -> Iterator[None]:
    """Inside: repositories accept schema `version` and write only the columns it has."""
    with monkeypatch.context() as patch:
        patch.setattr(repository_module, "supported_schema_version", lambda: version)
        if version < OWNER_HOST:
            statements = load_statements()._by_name
            claim = ClaimBefore0012(statements["claim_execution_owner"])
            patch.setitem(statements, "claim_execution_owner", claim)
        yield
