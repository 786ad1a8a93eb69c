"""A long-lived process keeps working after a migration changes what a prepared read returns.

PostgreSQL refuses to run a server-side prepared statement whose result type changed
(SQLSTATE 0A000, "cached plan must not change result type"). What a process relies on: the
one transaction that meets the change fails, its rollback drops the connection's prepared
statements, and the next transaction on the same connection prepares afresh and succeeds;
no restart is needed (docs/dba.md, "Long-lived processes across a migration").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from pybatch._statements import load_statements


def test_a_prepared_read_succeeds_again_after_its_result_type_changes(
    admin: psycopg.Connection[Any], db_dsn: str, tmp_path: Path
) -> None:
    admin.execute("CREATE SCHEMA migrated")
    admin.execute("CREATE TABLE migrated.item (id bigint PRIMARY KEY, amount integer NOT NULL)")
    admin.execute("INSERT INTO migrated.item VALUES (1, 7)")
    (tmp_path / "item.sql").write_text(
        "-- :name get_item :one\n-- :doc One item.\n"
        "SELECT i.id, i.amount FROM migrated.item AS i WHERE i.id = :id;\n"
    )
    statement = load_statements(tmp_path).get_item
    with psycopg.connect(db_dsn) as conn:
        assert statement.prepared.one(conn, id=1) == {"id": 1, "amount": 7}
        conn.commit()
        # A migration widens the column: the prepared plan's result type is now stale.
        admin.execute("ALTER TABLE migrated.item ALTER COLUMN amount TYPE bigint")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="cached plan"):
            statement.prepared.one(conn, id=1)
        conn.rollback()
        assert statement.prepared.one(conn, id=1) == {"id": 1, "amount": 7}
        conn.commit()
        assert statement.prepared.one(conn, id=1) == {"id": 1, "amount": 7}
