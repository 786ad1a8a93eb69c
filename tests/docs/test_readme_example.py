"""The README's complete example runs as written against a real database."""

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


def _example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A complete example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no python example"
    return match.group(1)


def test_readme_example_loads_the_csv_and_completes_as_the_runtime_role(
    tmp_path: Path, runtime_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE SCHEMA sales")
    admin.execute("CREATE TABLE sales.orders (id int PRIMARY KEY, customer text, amount numeric)")
    admin.execute("GRANT USAGE ON SCHEMA sales TO pybatch_runtime")
    admin.execute("GRANT SELECT, INSERT ON sales.orders TO pybatch_runtime")
    rows = [f"{i},customer-{i % 7},{i * 1.25:.2f}" for i in range(1, 2501)]
    (tmp_path / "orders.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "example.py").write_text(_example())
    env = dict(os.environ, PYBATCH_DSN=runtime_dsn, PYBATCH_TLS="plaintext")
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


def test_the_readme_demo_command_writes_only_where_any_user_can() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Try it", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README has no demo command"
    command = match.group(1)
    assert "pybatch demo" in command
    assert not re.search(r"(^|\s)/(opt|usr|var|srv|etc)/", command), command
