"""Connection refusals fail fast with their own typed error; transient failures keep retrying.

A server of this module's own requires passwords (and, for the TLS cases, serves a
self-signed certificate), so a wrong password, a role that may not log in, a missing
database and a certificate that fails verification can be seen as a real user would.
None of them may wait for the acquire timeout, and none may print the DSN, the host or
the user.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql import factories

from pybatch import ConnectionConfig, JobRepository, TlsMode
from pybatch._config import CaCertificate
from pybatch._migrator import installed_schema_version, migrate, migration_sql
from pybatch._sqlstate import is_permanent
from pybatch.errors import (
    AuthenticationFailed,
    DatabaseNotFound,
    PermissionDenied,
    ServerUnreachable,
    TlsNotOffered,
    TlsVerificationFailed,
    Unavailable,
)
from tests.conftest import dsn_for, migrate_template

SERVER_PASSWORD = "server-Secr3t"
ROLE_PASSWORD = "role-Secr3t"

secured_proc = factories.postgresql_proc(
    port=None, password=SERVER_PASSWORD, postgres_options="-c fsync=off"
)
DATABASE = "pybatch_secured"

SLOW_ENOUGH = timedelta(minutes=5)  # an acquire timeout no fast failure may wait for


@pytest.fixture(scope="module")
def server(secured_proc: Any) -> dict[str, Any]:
    """The password-protected server with one migrated database."""
    found = {
        "host": secured_proc.host,
        "port": secured_proc.port,
        "user": secured_proc.user,
        "password": secured_proc.password,
        "dbname": DATABASE,
        "datadir": secured_proc.datadir,
    }
    with superuser({**found, "dbname": "postgres"}) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    migrate_template(**{k: found[k] for k in ("host", "port", "user", "dbname", "password")})
    return found


def superuser(server: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=server["host"],
        port=server["port"],
        user=server["user"],
        password=server["password"],
        dbname=server["dbname"],
        autocommit=True,
    )


def config(server: dict[str, Any], **overrides: Any) -> ConnectionConfig:
    fields = {
        "host": server["host"],
        "port": server["port"],
        "user": server["user"],
        "dbname": server["dbname"],
        "password": server["password"],
    }
    tls = overrides.pop("tls_mode", TlsMode.PLAINTEXT)
    ca = overrides.pop("ca_certificate", None)
    fields.update({key: overrides.pop(key) for key in list(overrides) if key in fields})
    return ConnectionConfig(
        dsn=dsn_for(**fields),
        tls_mode=tls,
        ca_certificate=ca,
        acquire_timeout=overrides.pop("acquire_timeout", SLOW_ENOUGH),
        pool_close_timeout=SLOW_ENOUGH,
        **overrides,
    )


def secrets_of(server: dict[str, Any]) -> list[str]:
    return [SERVER_PASSWORD, ROLE_PASSWORD, "etl_reader", "nologin_role"]


def assert_redacted(error: BaseException, server: dict[str, Any]) -> None:
    link: BaseException | None = error
    while link is not None:
        for secret in [*secrets_of(server), str(server["port"])]:
            assert secret not in str(link), type(link).__name__
            assert secret not in repr(link), type(link).__name__
        link = link.__cause__ or link.__context__


@pytest.fixture(scope="module")
def roles(server: dict[str, Any]) -> Iterator[None]:
    with superuser(server) as conn:
        conn.execute(f"CREATE ROLE nologin_role NOLOGIN PASSWORD '{ROLE_PASSWORD}'")
        conn.execute(f"CREATE ROLE etl_reader LOGIN PASSWORD '{ROLE_PASSWORD}'")
        conn.execute("GRANT USAGE ON SCHEMA pybatch TO etl_reader")
        conn.execute("GRANT SELECT ON pybatch.schema_version TO etl_reader")
    yield


@pytest.mark.parametrize(
    ("overrides", "expected", "sqlstate"),
    [
        ({"password": "wrong-password"}, AuthenticationFailed, "28P01"),
        ({"user": "nologin_role", "password": ROLE_PASSWORD}, AuthenticationFailed, "28000"),
        ({"dbname": "no_such_database"}, DatabaseNotFound, "3D000"),
    ],
    ids=["wrong password", "role without LOGIN", "unknown database"],
)
def test_permanent_refusals_fail_fast_with_their_own_error(
    server: dict[str, Any],
    roles: None,
    overrides: dict[str, str],
    expected: type[Unavailable],
    sqlstate: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(expected) as caught:
        JobRepository.connect(config(server, **overrides))
    assert time.monotonic() - started < SLOW_ENOUGH.total_seconds() / 5
    assert caught.value.sqlstate == sqlstate
    assert isinstance(caught.value, Unavailable)  # still an availability failure to callers
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert_redacted(caught.value, server)
    for operation in (installed_schema_version, migrate):
        with pytest.raises(expected):
            operation(config(server, **overrides))


def test_a_transient_failure_keeps_retrying_until_the_acquire_timeout(
    server: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    bad = config(server, port=closed_port, acquire_timeout=timedelta(seconds=2))
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="psycopg.pool"), pytest.raises(Unavailable) as caught:
        JobRepository.connect(bad)
    assert time.monotonic() - started >= 2  # it waited: the server may come back
    assert type(caught.value) is ServerUnreachable  # then said why
    assert isinstance(caught.value, Unavailable) and not is_permanent(caught.value)
    assert caught.value.__context__ is None
    # psycopg.pool's own warnings went through pybatch's redaction
    assert "error connecting in 'pybatch'" in caplog.text
    for secret in (str(closed_port), "127.0.0.1", server["user"], SERVER_PASSWORD):
        assert secret not in caplog.text


def test_permission_denied_is_its_own_error_not_unavailable(
    server: dict[str, Any], roles: None
) -> None:
    reader = config(server, user="etl_reader", password=ROLE_PASSWORD)
    assert installed_schema_version(reader) is not None  # the grant is enough to read it
    for operation in (migration_sql, migrate):
        with pytest.raises(PermissionDenied) as caught:
            operation(reader)
        assert not isinstance(caught.value, Unavailable)
        assert caught.value.__context__ is None
        assert_redacted(caught.value, server)


# --------------------------------------------------------------------------- the CLI


def run_cli(*args: str, dsn: str | bytes) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "PG"))}
    env_bytes = {k.encode(): v.encode() for k, v in env.items()}
    env_bytes[b"PYBATCH_DSN"] = dsn if isinstance(dsn, bytes) else dsn.encode()
    env_bytes[b"PYBATCH_TLS"] = b"plaintext"
    env_bytes[b"PYBATCH_ACQUIRE_TIMEOUT_MS"] = b"300000"
    env_bytes[b"PYBATCH_POOL_CLOSE_TIMEOUT_MS"] = b"300000"
    return subprocess.run(
        [sys.executable, "-m", "pybatch", *args],
        capture_output=True,
        text=True,
        env=env_bytes,
        timeout=120,
        check=False,
    )


COMMANDS = [
    ("schema-version",),
    ("migrate",),
    ("migrate", "--dry-run"),
    ("migrate", "--sql"),
    ("demo", "--rows", "10"),
    ("worker", "--job", "nightly", "--step", "load", "--function", "json:loads", "--wait", "1"),
    # the read commands
    ("jobs",),
    ("instances", "nightly"),
    ("executions", "1"),
    ("show", "1"),
    ("unresolved", "--older-than", "10m"),
    ("sql", "explain", "get_job_execution"),
    # the operator commands
    ("stop", "1"),
    ("recover", "1", "--mark-failed", "--reason", "OWNER_LOST"),
    ("hold", "1", "--reason", "AUDIT_HOLD"),
    ("release", "1"),
    ("purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d", "--dry-run"),
    ("audit", "verify"),
]


@pytest.mark.parametrize(
    ("overrides", "exit_code", "error_name"),
    [
        ({"password": "wrong-password"}, 6, "AuthenticationFailed"),
        ({"user": "etl_reader", "password": ROLE_PASSWORD}, 6, "PermissionDenied"),
        ({"dbname": "no_such_database"}, 2, "DatabaseNotFound"),
    ],
    ids=["wrong password", "role without privileges", "unknown database"],
)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_schema_command_against_a_refusing_server_prints_one_line(
    server: dict[str, Any],
    roles: None,
    command: tuple[str, ...],
    overrides: dict[str, str],
    exit_code: int,
    error_name: str,
) -> None:
    fields = {k: server[k] for k in ("host", "port", "user", "dbname", "password")}
    fields.update(overrides)
    dsn = dsn_for(**fields)
    if command[0] == "demo":  # the demo takes its database from --dsn only
        command = (*command, "--plaintext", "--dsn", dsn)
    result = run_cli(*command, dsn=dsn)
    if command == ("schema-version",) and error_name == "PermissionDenied":
        assert result.returncode == 0, result.stderr  # reading the version needs no more
        return
    assert result.returncode == exit_code, result.stderr
    # `--dsn` with a password (the demo's only way) adds the documented warning line, and a
    # mutating command prints the operation id it generated (to retry with) before it acts.
    lines = [
        line
        for line in result.stderr.splitlines()
        if not line.startswith(("pybatch: warning:", "operation id: "))
    ]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"pybatch: {error_name}: ")
    assert "Traceback" not in result.stderr
    for secret in [*secrets_of(server), str(server["port"])]:
        assert secret not in result.stderr + result.stdout


def test_a_dsn_that_is_not_utf8_exits_2_with_one_line(server: dict[str, Any]) -> None:
    refusal = (
        "pybatch: InvalidConnectionString: PostgreSQL connection string is invalid: "
        "it is not valid UTF-8"
    )
    result = run_cli("schema-version", dsn=b"host=h password=\xff\xfesecret")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [refusal]
    # the same DSN on the command line: refused with every other undecodable argument,
    # before argparse, by position (its text is never echoed)
    undecodable = b"host=h password=\xff\xfesecret".decode("utf-8", "surrogateescape")
    result = run_cli("schema-version", "--dsn", undecodable, dsn="")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "pybatch: CommandArgumentInvalid: command-line argument #3 must be valid UTF-8 text"
    ]
    assert "secret" not in result.stderr


# --------------------------------------------------------------------------- TLS


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server(server: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Serve TLS with a certificate of a private CA for 127.0.0.1; return the CA's PEM."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    work = tmp_path_factory.mktemp("tls")
    ca_key, ca_crt = work / "ca.key", work / "ca.crt"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=pybatch test CA", "-keyout", str(ca_key), "-out", str(ca_crt),
    )  # fmt: skip
    datadir = Path(server["datadir"])
    key, csr, crt = datadir / "server.key", work / "server.csr", datadir / "server.crt"
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(key), "-out", str(csr),
    )  # fmt: skip
    extensions = work / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(crt),
    )  # fmt: skip
    owner = Path(server["datadir"]).stat()
    for path in (key, crt):
        os.chown(path, owner.st_uid, owner.st_gid)
    key.chmod(0o600)
    with superuser(server) as conn:
        conn.execute("ALTER SYSTEM SET ssl_cert_file = 'server.crt'")
        conn.execute("ALTER SYSTEM SET ssl_key_file = 'server.key'")
        conn.execute("ALTER SYSTEM SET ssl = on")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while True:
        with superuser(server) as conn:
            row = conn.execute("SHOW ssl").fetchone()
        if row == ("on",):
            break
        assert time.monotonic() < deadline, "the server never turned TLS on"
        time.sleep(0.05)
    return ca_crt.read_bytes()


def test_verified_tls_against_a_server_without_tls_says_the_server_offers_none(
    server: dict[str, Any],
) -> None:
    started = time.monotonic()
    with pytest.raises(TlsNotOffered) as caught:
        JobRepository.connect(config(server, tls_mode=TlsMode.VERIFY_FULL))
    assert time.monotonic() - started < SLOW_ENOUGH.total_seconds() / 5  # permanent: at once
    assert "does not offer TLS" in str(caught.value)
    assert "certificate" not in str(caught.value)
    assert_redacted(caught.value, server)


def test_verified_tls_with_the_right_ca_connects(server: dict[str, Any], tls_server: bytes) -> None:
    verified = config(
        server, tls_mode=TlsMode.VERIFY_FULL, ca_certificate=CaCertificate(tls_server)
    )
    with JobRepository.connect(verified) as repository, repository.read_transaction() as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row == (True,)


def test_a_certificate_that_fails_verification_fails_fast(
    server: dict[str, Any], tls_server: bytes
) -> None:
    started = time.monotonic()
    with pytest.raises(TlsVerificationFailed) as caught:
        # the system trust store does not know the test CA
        JobRepository.connect(config(server, tls_mode=TlsMode.VERIFY_FULL))
    assert time.monotonic() - started < SLOW_ENOUGH.total_seconds() / 5
    assert caught.value.__context__ is None
    assert_redacted(caught.value, server)
    fields = {k: server[k] for k in ("host", "port", "user", "dbname", "password")}
    result = subprocess.run(
        [sys.executable, "-m", "pybatch", "schema-version"],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "PG"))},
            "PYBATCH_DSN": dsn_for(**fields),
        },
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("pybatch: TlsVerificationFailed: ")
    assert len(result.stderr.splitlines()) == 1
