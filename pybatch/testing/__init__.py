"""`pybatch.testing`: what the `pybatch_pytest` plugin's fixtures use (docs/testing.md).

Imported only when a test first asks for a fixture, so a run using none is unaffected.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import psycopg.conninfo

from pybatch._config import ConnectionConfig, TlsMode
from pybatch._migrator import migrate
from pybatch.etl import LEASE_ENVIRONMENT
from pybatch.testing._clones import Admin, ClonePool

__all__ = [
    "MISSING_EXTRA",
    "PREFETCH_ENV",
    "TEST_DSN_ENV",
    "TMPDIR_ENV",
    "ClonePool",
    "JobRunner",
    "JobScriptResult",
    "PostgresServer",
    "server_parent",
]

#: An existing server to use instead of starting one (its role needs CREATEDB).
TEST_DSN_ENV = "PYBATCH_TEST_DSN"
#: How many fresh databases to clone ahead of the tests (0: clone in the fixture).
PREFETCH_ENV = "PYBATCH_TEST_PREFETCH"
#: Where the throwaway server keeps its files (default: in memory when possible).
TMPDIR_ENV = "PYBATCH_TEST_TMPDIR"
#: A memory filesystem on Linux; the throwaway server uses it when this much is free.
MEMORY_DIRECTORY = Path("/dev/shm")
MEMORY_MIN_FREE = 1 << 30
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
_MOUNTS = Path("/proc/self/mounts")
MISSING_EXTRA = (
    "pybatch.testing needs the testing extra: pip install 'pybatch[testing]' "
    "(pytest-postgresql is not installed)"
)


def server_parent() -> str | None:
    """Where the throwaway server lives: PYBATCH_TEST_TMPDIR, else /dev/shm if memory with 1 GiB.

    Memory, because a clone's 400 file creations on a busy disk wait for its journal.
    """
    if chosen := os.environ.get(TMPDIR_ENV, "").strip():
        return chosen
    memory = MEMORY_DIRECTORY
    if not _is_memory_filesystem(memory) or not os.access(memory, os.W_OK | os.X_OK):
        return None
    stats = os.statvfs(memory)
    return str(memory) if stats.f_bavail * stats.f_frsize >= MEMORY_MIN_FREE else None


def _is_memory_filesystem(path: Path) -> bool:
    """Whether `path` is where a tmpfs or ramfs is mounted (the last mount there counts)."""
    try:
        target = str(path.resolve(strict=True))
        mounts = _MOUNTS.read_text()
    except OSError:
        return False
    kinds = [f[2] for f in map(str.split, mounts.splitlines()) if len(f) >= 3 and f[1] == target]
    return bool(kinds) and kinds[-1] in _MEMORY_FILESYSTEMS


class PostgresServer:
    """Where the session's databases live: host, port, user, and an optional password."""

    def __init__(self, dsn: str) -> None:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        self._dsn = dsn
        self.host = str(params.get("host") or "127.0.0.1")
        self.port = int(str(params.get("port") or 5432))
        self.user = str(params.get("user") or "postgres")
        self.password = None if params.get("password") is None else str(params["password"])

    def __repr__(self) -> str:  # never the password
        return f"PostgresServer(host={self.host!r}, port={self.port}, user={self.user!r})"

    @property
    def maintenance_dsn(self) -> str:
        """The DSN of the `postgres` database, where databases are created and dropped."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        """The DSN of database `dbname` on this server."""
        return psycopg.conninfo.make_conninfo(self._dsn, dbname=dbname)

    @contextlib.contextmanager
    def migrated_template(self) -> Iterator[str]:
        """Yield a new migrated template database (a clone of template0), dropped after."""
        with contextlib.closing(Admin(self.maintenance_dsn)) as admin:
            name = admin.clone("template0", prefix="pybatch_template_")
            try:
                migrate(ConnectionConfig(dsn=self.dsn_for(name), tls_mode=TlsMode.PLAINTEXT))
                yield name
            finally:
                admin.drop(name)


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
