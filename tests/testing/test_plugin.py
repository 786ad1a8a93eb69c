"""pybatch.testing, the pytest plugin for users' jobs, run by pytester against the installed
plugin (its pytest11 entry point), as a user's test suite would load it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"

pytest_plugins = ["pytester"]

ISOLATION = """
import psycopg

def test_first(pybatch_dsn):
    with psycopg.connect(pybatch_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE marker (id INTEGER)")

def test_second_sees_a_fresh_database(pybatch_dsn, pybatch_repository):
    with psycopg.connect(pybatch_dsn) as conn:
        found = conn.execute("SELECT to_regclass('public.marker')").fetchone()
        version = conn.execute("SELECT version FROM pybatch.schema_version").fetchone()
    assert found == (None,)
    assert version == (pybatch_repository.schema_version,)
"""


def server_dsn(postgresql_proc: Any) -> str:
    return (
        f"host={postgresql_proc.host} port={postgresql_proc.port} "
        f"user={postgresql_proc.user} dbname=postgres"
    )


def leftovers(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'pybatch\\_%' ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


def test_the_docs_example_runs_kills_resumes_and_checks(
    pytester: pytest.Pytester, postgresql_proc: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("load_orders.py", "test_load_orders.py"):
        shutil.copy(EXAMPLES / name, pytester.path / name)
    monkeypatch.setenv("PYBATCH_TEST_DSN", server_dsn(postgresql_proc))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_load_orders.py")
    result.assert_outcomes(passed=1)
    assert leftovers(server_dsn(postgresql_proc)) == []


@pytest.mark.parametrize("prefetch", ["0", "2"])
def test_each_test_gets_a_fresh_database_from_one_template(
    pytester: pytest.Pytester,
    postgresql_proc: Any,
    monkeypatch: pytest.MonkeyPatch,
    prefetch: str,
) -> None:
    pytester.makepyfile(test_isolation=ISOLATION)
    monkeypatch.setenv("PYBATCH_TEST_DSN", server_dsn(postgresql_proc))
    monkeypatch.setenv("PYBATCH_TEST_PREFETCH", prefetch)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert leftovers(server_dsn(postgresql_proc)) == []


def test_without_a_server_the_plugin_starts_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYBATCH_TEST_DSN", raising=False)
    pytester.makepyfile(test_isolation=ISOLATION)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_kill_point_before_commit_leaves_the_chunk_uncommitted(
    pytester: pytest.Pytester, postgresql_proc: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(EXAMPLES / "load_orders.py", pytester.path / "load_orders.py")
    pytester.makepyfile(
        test_before_commit="""
import psycopg
from pathlib import Path

JOB = Path(__file__).with_name("load_orders.py")

def test_killed_before_commit(pybatch_dsn, pybatch_job_runner, tmp_path):
    with psycopg.connect(pybatch_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount NUMERIC NOT NULL)")
    source = tmp_path / "orders.csv"
    source.write_text("".join(f"{i},1\\n" for i in range(1, 501)))
    killed = pybatch_job_runner.run(JOB, str(source), kill_at_chunk=2, kill_point="before_commit")
    assert killed.killed
    with psycopg.connect(pybatch_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (100,)
    done = pybatch_job_runner.run(JOB, str(source))
    assert done.returncode == 0 and not done.killed
"""
    )
    monkeypatch.setenv("PYBATCH_TEST_DSN", server_dsn(postgresql_proc))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
