"""Every benchmark of bench/ runs to its report, on tiny inputs, against the suite's server.

The figures in docs/benchmarks.md come from these programs; one that no longer runs (a changed
statement sequence, a parameter its SQL gained, a definition the launch path now needs) stops
showing anything. Each runs here as a maintainer runs it, `python -m bench.NAME --dsn DSN`, on
a new database, with sizes small enough for seconds; what it measures is not checked, only that
it gets to the end of its report. Not here: bench.peers (DBOS and dlt are the optional `bench`
extra), bench.pooler (PgBouncer; tests/topology runs the pooler), bench.dashboard (it exits 1
when a plan on its tiny tables is a sequential scan, which tiny tables make right).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Each benchmark, its tiny arguments, and words of its report's last table or verdict.
BENCHMARKS = {
    "launch": (
        "--history 300 --partitioned-plans 1 --launches 20 --warmup 2 --rounds 2".split(),
        "ratio history/empty of the medians",
    ),
    "chunks": (["--rows", "2000", "--repeat", "1"], "baseline COMMIT"),
    "partitions": (
        "--partitions 8 --copy-partitions 4 --workers 1,2 --repeat 1 --capacity-seconds 0".split(),
        "claim median",
    ),
    "partition_row": (["--partitions", "50", "--rounds", "1"], "| pybatch |"),
    "purge": (["--history", "200", "--batch", "100", "--quiet-seconds", "1"], "p99 ratio"),
    "migration_locks": (["--rows", "100"], "blocks"),
    "explorer": (["--executions", "2000", "--small", "500", "--names", "10"], "worst p50 ratio"),
    "isolation": (["--statements", "20", "--batch", "10"], "fence read of job_execution"),
    "progress_update": (["--updates", "100", "--rounds", "1"], "ratio"),
    "fault_tolerance": (["--rows", "10000", "--repeat", "1"], "load 10"),
    "telemetry": (["--rows", "2000", "--repeat", "1"], "ratio present/absent"),
    "memory": (["--rows", "5000"], "growth from"),
    "testing_db": (["--cycles", "2"], "target (default prefetch"),
    "checkpoint_commits": (["--seconds", "1", "--repeat", "1"], "references:"),
}


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_the_benchmark_runs_to_its_report(name: str, blank_database: str, tmp_path: Path) -> None:
    arguments, last_words = BENCHMARKS[name]
    if name == "launch":
        arguments = [*arguments, "--output", str(tmp_path / "launch.json")]
    ran = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--dsn", blank_database, *arguments],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = ran.stdout + ran.stderr
    assert ran.returncode == 0, report[-4000:]
    assert last_words in report, report[-4000:]
