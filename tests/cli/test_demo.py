"""`pybatch demo`: runs against the test database and on its own embedded server.

Each run is a real `python -m pybatch demo` process: it kills its loader with SIGKILL
part-way, restarts it and verifies the table against the CSV.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

VERIFICATION = (
    "  count     ok    5,000 rows in the table, 5,000 in the CSV",
    "  sha256    ok    ",
    "  counters  ok    read 5,000, written 5,000, in 20 chunk commits",
    "  job       ok    attempt 2 COMPLETED",
)


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pybatch", "demo", *args]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without pybatch connection settings (the demo gets its own)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYBATCH_") or k == "PYBATCH_PG_BINDIR"
    }
    env.update(extra)
    return env


def run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        demo_command(*args),
        capture_output=True,
        text=True,
        timeout=300,
        env=env or clean_env(),
        check=False,
    )


def test_demo_on_a_database_kills_resumes_and_verifies(
    db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    result = run_demo(
        "--rows", "5000", "--chunk-size", "250", "--kill-after-chunks", "3", "--dsn", db_dsn,
        "--plaintext",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for expected in VERIFICATION:
        assert any(line.startswith(expected) for line in lines), (expected, result.stdout)
    [killed] = [line for line in lines if line.startswith("  attempt 1 SIGKILLed ")]
    assert killed.endswith(" of 20 chunks were committed")
    done = int(killed.split(" after ")[1].split()[0])
    assert 3 <= done < 20
    assert f"resumed at offset {done * 250:,} (chunk {done + 1})" in result.stdout
    assert "audited decision OWNER_LOST" in result.stdout
    assert lines[-1].startswith("all checks passed")
    assert db_dsn not in result.stdout + result.stderr  # the DSN is a secret

    # What the demo reported is what the database holds.
    assert admin.execute("SELECT COUNT(*) FROM pybatch_demo.orders").fetchone() == (5000,)
    executions = admin.execute(
        "SELECT attempt, status FROM pybatch.job_execution ORDER BY attempt"
    ).fetchall()
    assert executions == [(1, "FAILED"), (2, "COMPLETED")]
    decisions = admin.execute("SELECT reason_code FROM pybatch.recovery_decision").fetchall()
    assert decisions == [("OWNER_LOST",)]
    step = admin.execute(
        "SELECT read_count, write_count, commit_count FROM pybatch.step_execution"
        " WHERE status = 'COMPLETED'"
    ).fetchone()
    assert step == (5000, 5000, 20)

    # The demo is repeatable: its target starts empty and each run is a new job instance.
    again = run_demo(
        "--rows", "600", "--chunk-size", "100", "--kill-after-chunks", "0", "--seed", "7",
        "--dsn", db_dsn, "--plaintext",
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "  count     ok    600 rows in the table, 600 in the CSV" in again.stdout
    assert "loaded every chunk: there was no kill to do" in again.stdout
    assert admin.execute("SELECT COUNT(*) FROM pybatch_demo.orders").fetchone() == (600,)


def test_demo_worker_is_hidden_and_python_m_pybatch_works() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pybatch", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "demo " in result.stdout and "demo-worker" not in result.stdout


@pytest.fixture
def server_tmpdir() -> Iterator[Path]:
    """A TMPDIR the embedded server's user (postgres or nobody, under root) can traverse."""
    directory = Path(tempfile.mkdtemp(prefix="pybatch-demo-test-", dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
def test_demo_on_an_embedded_server(server_tmpdir: Path) -> None:
    result = run_demo(
        "--rows", "2000", "--chunk-size", "100", "--seed", "3",
        env=clean_env(TMPDIR=str(server_tmpdir)),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(embedded on 127.0.0.1:" in result.stdout
    assert "  count     ok    2,000 rows in the table, 2,000 in the CSV" in result.stdout
    assert "  counters  ok    read 2,000, written 2,000, in 20 chunk commits" in result.stdout
    assert "  sha256    ok    " in result.stdout
    assert result.stdout.splitlines()[-1].startswith("all checks passed")
    assert list(server_tmpdir.iterdir()) == []  # server and CSV directories removed


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_demo_stops_cleanly_on_a_signal(server_tmpdir: Path, signum: signal.Signals) -> None:
    process = subprocess.Popen(
        demo_command("--rows", "300000", "--chunk-size", "100", "--kill-after-chunks", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(TMPDIR=str(server_tmpdir)),
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # stop it once the server, the CSV and the table exist
            if line.startswith("  target"):
                break
        wait_until_loading(server_tmpdir)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signum, out + err
    assert f"stopped by {signum.name}" in out
    assert list(server_tmpdir.iterdir()) == []  # no server, CSV or log left behind
    assert processes_mentioning(str(server_tmpdir)) == []  # the worker was stopped too


def wait_until_loading(tmpdir: Path, timeout_s: float = 60.0) -> None:
    """Block until the first worker logs that its step is loading (inside the step's run)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in tmpdir.rglob("worker-1.log"):
            if b"loads from offset" in log.read_bytes():
                return
        time.sleep(0.02)
    raise AssertionError("the demo's worker never started loading")


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (the worker's has its CSV path)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found
