"""The README's complete example runs as written against a real database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A complete example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no python example"
    return match.group(1)


def test_readme_example_loads_the_csv_and_completes(
    tmp_path: Path, db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE SCHEMA sales")
    admin.execute("CREATE TABLE sales.orders (id int PRIMARY KEY, customer text, amount numeric)")
    rows = [f"{i},customer-{i % 7},{i * 1.25:.2f}" for i in range(1, 2501)]
    (tmp_path / "orders.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "example.py").write_text(_example())
    env = dict(os.environ, PYBATCH_DSN=db_dsn, PYBATCH_TLS="plaintext")
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert admin.execute("SELECT count(*) FROM sales.orders").fetchone() == (2500,)
    status = admin.execute(
        "SELECT e.status, e.exit_code, s.write_count, s.commit_count"
        " FROM pybatch.job_execution AS e JOIN pybatch.step_execution AS s"
        " ON s.job_execution_id = e.id"
    ).fetchall()
    assert status == [("COMPLETED", "COMPLETED", 2500, 3)]
