"""PostgreSQL test-server plumbing shared by tests/conftest.py.

Importing this module patches two library behaviours (both behind the exact
pins in constraints.txt; re-check them on every upgrade):

* pytest-postgresql's version floor is lowered so PostgreSQL 13 runs
  (pytest-postgresql refuses servers older than 14 otherwise);
* mirakuru's exit hook, which can SIGKILL other sessions' servers, is replaced
  by an exact-match one (see ``_kill_own_leftovers``).

The rest are helpers for conftest.py:

* ``configure(config)`` from a ``tryfirst`` ``pytest_configure``: a private
  basetemp under root (``isolate_basetemp``) and tools/pg_ctl_wrapper as the
  default pg_ctl (``use_wrapper_by_default``);
* ``check_server_major(conn)`` / ``check_executor_major(proc)``: fail when the
  server is not the major that ``PYBATCH_EXPECTED_PG_MAJOR`` (set per tox env)
  asks for, so a wrong PG_BINDIR cannot silently test PostgreSQL 15 six times.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import mirakuru.base
import psutil
import psycopg
import pytest
import pytest_postgresql.plugin
from packaging.version import parse
from pytest_postgresql.executors import PostgreSQLExecutor

from pybatch.testing import server_parent

# pytest-postgresql >= 8 refuses servers < 14 via this class attribute; the suite
# passes on 13 once it is lowered.  It is a library internal: fail loudly (in every
# env, not just pg13) if an upgrade renames it, rather than patching nothing.
if not hasattr(PostgreSQLExecutor, "MIN_SUPPORTED_VERSION"):
    raise RuntimeError(
        "pytest_postgresql PostgreSQLExecutor.MIN_SUPPORTED_VERSION is gone: "
        "re-check the PostgreSQL 13 floor patch (tests/support/pg_harness.py) for this version"
    )
PostgreSQLExecutor.MIN_SUPPORTED_VERSION = parse("13")

# mirakuru (pytest-postgresql's process runner) registers, in every process that
# imports it, an atexit hook that SIGKILLs each process whose mirakuru_uuid env
# var ("<pytest pid>:<uuid4>") merely *contains* str(os.getpid()).  A short pid
# (common after the 32768 pid wrap) matches digits of another server's value, so
# an exiting multiprocessing child that imported the conftest, or any other
# pytest run on the machine (as root every environ is readable), kills a server
# mid-test.  Keep the safety net, with an exact prefix match.
atexit.unregister(mirakuru.base.cleanup_subprocesses)


@atexit.register
def _kill_own_leftovers() -> None:
    prefix = f"{os.getpid()}:"
    for proc in psutil.process_iter(["environ"]):
        environ = proc.info.get("environ") or {}
        if environ.get(mirakuru.base.ENV_UUID, "").startswith(prefix):
            with contextlib.suppress(psutil.Error):
                proc.kill()


EXPECTED_MAJOR_ENV = "PYBATCH_EXPECTED_PG_MAJOR"

# Recommended for pyproject.toml; see the module docstring and the lead's notes.
PYTEST_INI_FRAGMENT = """\
[tool.pytest.ini_options]
minversion = "9.0"
testpaths = ["tests"]
# no .pytest_cache: the tree may be read-only for the user running the tests
addopts = ["-p", "no:cacheprovider", "-ra", "--strict-markers", "--strict-config"]
xfail_strict = true
# postgresql_exec is deliberately absent: tox passes --postgresql-exec and
# plain runs get tools/pg_ctl_wrapper from configure().
postgresql_dbname = "pybatch_tests"
"""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_pg_ctl() -> str:
    """Absolute path of tools/pg_ctl_wrapper (PG_BINDIR picks the real pg_ctl)."""
    return str(repo_root() / "tools" / "pg_ctl_wrapper")


def use_wrapper_by_default(config: pytest.Config) -> None:
    """Point pytest-postgresql at the wrapper unless the user chose a pg_ctl.

    pytest-postgresql reads ``getoption("postgresql_exec") or getini(...)``, so
    setting the option here would override an ini value: only do it when the ini
    key is not set either.  Call from ``pytest_configure``; the executable is
    read when the ``postgresql_proc`` fixture starts, long after configure.
    """
    if config.getoption("postgresql_exec", default=None):
        return
    # config.inicfg is deprecated in pytest 9, so compare getini() with the
    # plugin's built-in default (a Debian path that does not exist on Debian 12).
    builtin = getattr(pytest_postgresql.plugin, "_DEFAULT_POSTGRESQL_EXEC", None)
    if config.getini("postgresql_exec") not in ("", None, builtin):
        return
    config.option.postgresql_exec = default_pg_ctl()


def isolate_basetemp(config: pytest.Config) -> None:
    """As root, give this session a private basetemp instead of /tmp/pytest-of-root.

    Every pytest session resets /tmp/pytest-of-root to mode 0700 when it starts.
    The wrapper opens it up (a+x) for the postgres user, so any other root
    session starting meanwhile (another tox env under ``tox p``, a colleague's
    run on a shared machine) cuts the running server off from its data
    directory: it dies mid-test and ``pg_ctl stop`` fails.  Our own parent dir
    is left alone by pytest; the per-pid subdirectories of finished sessions are
    pruned here.  Non-root runs need none of this.  An explicit ``--basetemp``
    wins.  Must run before pytest's tmpdir plugin reads the option, i.e. from a
    ``pytest_configure`` marked ``tryfirst``.
    """
    if os.geteuid() != 0 or config.option.basetemp:
        return
    if hasattr(config, "_tmp_path_factory"):
        raise RuntimeError("isolate_basetemp() ran too late: mark pytest_configure tryfirst")
    # In memory when the machine has a roomy tmpfs (pybatch.testing's rule): every test
    # clones the template, some 400 file creations that a busy disk's journal can make
    # wait hundreds of milliseconds.
    parent = Path(server_parent() or tempfile.gettempdir()) / "pybatch-pytest-of-root"
    parent.mkdir(mode=0o711, exist_ok=True)
    st = parent.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise RuntimeError(f"{parent} is not a directory owned by root")
    for old in parent.iterdir():
        if old.name.isdigit() and not _pid_alive(int(old.name)):
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(parent / str(os.getpid()))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def configure(config: pytest.Config) -> None:
    """Everything conftest's ``pytest_configure`` (marked tryfirst) should call."""
    isolate_basetemp(config)
    use_wrapper_by_default(config)


def expected_major() -> int | None:
    value = os.environ.get(EXPECTED_MAJOR_ENV, "").strip()
    return int(value) if value else None


def check_server_major(conn: Any) -> int:
    """Return the server's major version; assert it is the expected one.

    ``conn`` is any DB-API connection (the ``postgresql`` fixture's psycopg
    connection, or a raw SQLAlchemy/psycopg one).  server_version_num is
    MMmmpp (e.g. 170010), so the major is num // 10000 for every major >= 10.
    """
    cur = conn.cursor()
    try:
        cur.execute("SHOW server_version_num")
        row = cur.fetchone()
    finally:
        cur.close()
    major = int(row[0]) // 10000
    want = expected_major()
    if want is not None:
        assert major == want, (
            f"server is PostgreSQL {major} but {EXPECTED_MAJOR_ENV}={want}: "
            f"PG_BINDIR={os.environ.get('PG_BINDIR', '<unset>')} points at the wrong binaries"
        )
    return major


def check_executor_major(proc: Any) -> int:
    """Same check against a running ``postgresql_proc`` executor, once per session."""
    with psycopg.connect(
        host=proc.host,
        port=proc.port,
        user=proc.user,
        password=proc.password,
        dbname="postgres",
        options=proc.options,
    ) as conn:
        return check_server_major(conn)
