"""The plugin's job runner gives its scripts a short lease: a kill test resumes in seconds.

Without it the run after a kill waited the default 10 s lease of the killed run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from pybatch.testing import JobRunner
from pybatch_pytest import KILL_TEST_LEASE_SECONDS

JOB = Path(__file__).resolve().parents[2] / "docs" / "examples" / "load_orders.py"


def test_the_job_runner_resume_after_a_kill_waits_only_its_short_lease(
    db_dsn: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    admin.execute("CREATE TABLE public.orders (id INTEGER PRIMARY KEY, amount NUMERIC NOT NULL)")
    source = tmp_path / "orders.csv"
    source.write_text("".join(f"{i},1\n" for i in range(1, 501)))
    runner = JobRunner(db_dsn, python=sys.executable, lease=KILL_TEST_LEASE_SECONDS)
    assert runner.run(JOB, str(source), kill_at_chunk=2).killed
    started = time.monotonic()
    done = runner.run(JOB, str(source))
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert admin.execute("SELECT count(*) FROM public.orders").fetchone() == (500,)
    assert elapsed < KILL_TEST_LEASE_SECONDS + 4.0  # the default 10 s lease would exceed it
