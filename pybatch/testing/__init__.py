"""`pybatch.testing`: what the `pybatch_pytest` plugin's fixtures use (docs/testing.md).

Imported only when a test first asks for a fixture, so a run using none is unaffected.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg.conninfo

from pybatch._config import ConnectionConfig, TlsMode
from pybatch._migrator import migrate
from pybatch.testing._clones import Admin, ClonePool
from pybatch.testing._runner import JobRunner, JobScriptResult

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
