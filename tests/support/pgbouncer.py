"""PgBouncer in front of a test server, on a free loopback port (tests/topology).

The pooler is the real one (Debian's `pgbouncer` package, which `.ci/run` installs), run in
the foreground as a child process in session or transaction mode. It authenticates nobody
(`auth_type = trust`, the one user in its auth file) and passes every database to the server
behind it. `ignore_options=True` makes it accept and silently drop the startup `options`
parameter, as a pooler configured with `ignore_startup_parameters = options` does.

PgBouncer refuses to run as root; as root it runs as the server's user (PG_RUN_AS, default
postgres), which owns the directory holding its configuration and log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from tests.support.standby import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
START_TIMEOUT_S = 30.0


@attrs.frozen
class Bouncer:
    """A running PgBouncer: where it listens, and its log for a failing test's message."""

    port: int
    pool_mode: str
    log: Path

    def dsn(self, *, user: str, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={user} dbname={dbname}"

    def log_tail(self) -> str:
        try:
            return self.log.read_text()[-3000:]
        except OSError:
            return ""


def _config(
    *, base: Path, port: int, server_port: int, user: str, pool_mode: str, ignore_options: bool
) -> str:
    ignored = "extra_float_digits" + (",options" if ignore_options else "")
    return "\n".join(
        [
            "[databases]",
            f"* = host=127.0.0.1 port={server_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {base / 'users.txt'}",
            f"pool_mode = {pool_mode}",
            # Fewer server connections than clients: transaction mode really shares them.
            "default_pool_size = 4",
            "max_client_conn = 200",
            f"ignore_startup_parameters = {ignored}",
            f"logfile = {base / 'pgbouncer.log'}",
            f"pidfile = {base / 'pgbouncer.pid'}",
            "server_reset_query = DISCARD ALL",
            "",
        ]
    )


def _wait_until_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {process.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on {port}: {log.read_text()}")


@contextlib.contextmanager
def pgbouncer(
    *, server_port: int, user: str, pool_mode: str, ignore_options: bool = False
) -> Iterator[Bouncer]:
    """PgBouncer in `pool_mode` in front of the server on `server_port`, stopped on exit."""
    base = Path(tempfile.mkdtemp(prefix="pybatch-pgbouncer-"))
    port = free_port()
    (base / "users.txt").write_text(f'"{user}" ""\n')
    config = base / "pgbouncer.ini"
    config.write_text(
        _config(
            base=base,
            port=port,
            server_port=server_port,
            user=user,
            pool_mode=pool_mode,
            ignore_options=ignore_options,
        )
    )
    command = [PGBOUNCER, "-q", str(config)]
    if os.geteuid() == 0:
        run_as = os.environ.get("PG_RUN_AS", "postgres")
        shutil.chown(base, run_as)
        for path in base.iterdir():
            shutil.chown(path, run_as)
        command = [PGBOUNCER, "-q", "-u", run_as, str(config)]
    log = base / "pgbouncer.log"
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    try:
        _wait_until_listening(port, process, log)
        yield Bouncer(port=port, pool_mode=pool_mode, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(base, ignore_errors=True)
