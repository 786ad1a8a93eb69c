"""The plans PostgreSQL runs inside pybatch's plpgsql functions, as auto_explain logs them."""

from __future__ import annotations

from typing import Any

import psycopg


def log_nested_plans(conn: psycopg.Connection[Any], *, analyze: bool = False) -> list[str]:
    """From now on, the plan of every statement `conn` runs, nested ones too (superuser).

    Returns the list the plans are appended to, one message each; with `analyze`, with the
    rows each node returned.
    """
    logged: list[str] = []
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute(f"SET auto_explain.log_analyze = {'on' if analyze else 'off'}")
    conn.execute("SET client_min_messages = log")
    conn.add_notice_handler(lambda diagnostic: logged.append(diagnostic.message_primary or ""))
    return logged
