"""Run a job script in a subprocess, optionally SIGKILLed at a chosen chunk commit."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from pybatch.etl import LEASE_ENVIRONMENT

#: When a killed run dies relative to its chosen chunk.
KILL_POINTS = ("after_commit", "before_commit")


@attrs.frozen
class JobScriptResult:
    """How a job script's process ended."""

    returncode: int
    killed: bool
    stdout: str
    stderr: str


class JobRunner:
    """Runs `python SCRIPT ARGS...` with PYBATCH_DSN pointing at the test's database.

    `lease` (seconds, 1 to 3600; PYBATCH_LEASE_SECONDS) bounds how long a run after a kill
    waits for the dead run's lease, instead of the default 10 s.
    """

    def __init__(self, dsn: str, *, python: str, lease: float | None = None) -> None:
        self._dsn = dsn
        self._python = python
        self._lease = lease

    def __repr__(self) -> str:
        return "JobRunner(<dsn>)"

    def run(
        self,
        script: str | os.PathLike[str],
        *args: str,
        kill_at_chunk: int | None = None,
        kill_point: str = "after_commit",
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        lease: float | None = None,
    ) -> JobScriptResult:
        """Run the script (PYBATCH_DSN set), SIGKILLed at its `kill_at_chunk`-th chunk (from 1).

        `after_commit`: right after that COMMIT returned; `before_commit`: just before it.
        `lease` overrides the runner's lease for this run.
        """
        if kill_point not in KILL_POINTS:
            raise ValueError(f"kill_point must be one of {KILL_POINTS}")
        if kill_at_chunk is not None and kill_at_chunk < 1:
            raise ValueError("kill_at_chunk counts chunks from 1")
        command: Sequence[str] = [self._python, "-m", "pybatch.testing._kill_at_chunk"]
        command = [*command, str(kill_at_chunk or 0), kill_point, str(Path(script)), *args]
        environment = dict(os.environ if env is None else env)
        environment.update(PYBATCH_DSN=self._dsn, PYBATCH_TLS="plaintext")
        lease = self._lease if lease is None else lease
        if lease is not None:
            environment[LEASE_ENVIRONMENT] = repr(float(lease))
        process = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=environment, check=False
        )
        killed = process.returncode == -signal.SIGKILL
        return JobScriptResult(process.returncode, killed, process.stdout, process.stderr)
