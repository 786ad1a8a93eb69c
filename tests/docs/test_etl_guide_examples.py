"""The ETL guide's fault tolerance example runs as written against a real database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.contract.test_least_privilege import runtime_dsn

__all__ = ["runtime_dsn"]

ROOT = Path(__file__).resolve().parents[2]


def _example(section: str) -> str:
    guide = (ROOT / "docs" / "etl-guide.md").read_text()
    body = guide.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", body, re.S)
    assert match, f"the guide's {section} section has no python example"
    return match.group(1)


def test_the_fault_tolerance_example_skips_the_rows_without_an_amount_as_the_runtime_role(
    tmp_path: Path, runtime_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE SCHEMA sales")
    admin.execute(
        "CREATE TABLE sales.orders (id int PRIMARY KEY, customer text, amount numeric NOT NULL)"
    )
    admin.execute("GRANT USAGE ON SCHEMA sales TO pybatch_runtime")
    admin.execute("GRANT SELECT, INSERT ON sales.orders TO pybatch_runtime")
    (tmp_path / "example.py").write_text(_example("Fault tolerance"))
    env = dict(os.environ, PYBATCH_DSN=runtime_dsn, PYBATCH_TLS="plaintext")

    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["read 5000, wrote 4995, skipped 5"]
    assert admin.execute("SELECT count(*) FROM sales.orders").fetchone() == (4995,)
    skipped = admin.execute(
        "SELECT item_position, item_key, sqlstate, column_name FROM pybatch.step_skip"
        " ORDER BY item_position"
    ).fetchall()
    assert skipped == [(n * 1000 - 1, f"order {n * 1000}", "23502", "amount") for n in range(1, 6)]
    status = admin.execute(
        "SELECT e.status, s.read_count, s.write_count, s.write_skip_count, s.commit_count"
        " FROM pybatch.job_execution AS e JOIN pybatch.step_execution AS s"
        " ON s.job_execution_id = e.id"
    ).fetchall()
    assert status == [("COMPLETED", 5000, 4995, 5, 5)]
