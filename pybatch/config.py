"""Connection configuration: bounds, TLS and redaction (schema.md 6, behaviour.md 2.24).

The DSN is a secret. It never appears in a repr, a str, an exception or a log
line; TLS settings come only from this configuration so that neither the DSN
nor libpq environment variables can weaken them.
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import attrs
import psycopg.conninfo

from pybatch.errors import (
    AcquireExceedsClose,
    CaCertificateTooLarge,
    EmptyCaCertificate,
    EmptyConnectionString,
    EnvironmentValueInvalid,
    InvalidConnectionString,
    LockExceedsStatement,
    PoolSize,
    TimeoutOutOfBounds,
    TlsOptionInConnectionString,
    UnitOfWorkAttempts,
)

__all__ = ["CaCertificate", "ConnectionConfig", "TlsMode"]

APPLICATION_NAME = "pybatch"
MAX_CA_BYTES = 1024 * 1024

_ALLOWED_KEYS = frozenset(
    {"host", "hostaddr", "port", "dbname", "user", "password", "application_name", "options"}
)
_TLS_KEYS = frozenset(
    {
        "requiressl",
        "gssencmode",
        "ssl-mode",
        "ssl-root-cert",
        "ssl-ca",
        "ssl-cert",
        "ssl-key",
    }
)


class TlsMode(enum.Enum):
    """How the connection is protected: verified TLS (default) or explicit plaintext."""

    #: sslmode=verify-full: certificate chain and host name are checked.
    VERIFY_FULL = "verify-full"
    #: sslmode=disable: only for isolated environments, chosen explicitly.
    PLAINTEXT = "plaintext"


@attrs.frozen(repr=False)
class CaCertificate:
    """A PEM CA bundle (1 byte to 1 MiB); its contents never print."""

    pem: bytes = attrs.field(validator=attrs.validators.instance_of(bytes))

    def __attrs_post_init__(self) -> None:
        if not self.pem:
            raise EmptyCaCertificate()
        if len(self.pem) > MAX_CA_BYTES:
            raise CaCertificateTooLarge(max_bytes=MAX_CA_BYTES)

    def __repr__(self) -> str:
        return f'CaCertificate(byte_length={len(self.pem)}, contents="<redacted>")'


def _ms(value: timedelta) -> int:
    return math.ceil(value / timedelta(milliseconds=1))


# (field, error class name, lower bound, upper bound), in validation order (schema.md 6.1).
_TIMEOUT_BOUNDS: tuple[tuple[str, str, timedelta, timedelta], ...] = (
    ("acquire_timeout", "acquire", timedelta(milliseconds=1), timedelta(minutes=5)),
    ("connect_timeout", "connect", timedelta(milliseconds=1), timedelta(minutes=5)),
    ("statement_timeout", "statement", timedelta(milliseconds=1), timedelta(hours=24)),
    ("lock_timeout", "lock", timedelta(milliseconds=1), timedelta(minutes=5)),
    ("idle_transaction_timeout", "idle transaction", timedelta(seconds=1), timedelta(hours=24)),
    ("connection_idle_timeout", "connection idle", timedelta(seconds=1), timedelta(hours=24)),
    ("connection_max_lifetime", "connection lifetime", timedelta(minutes=1), timedelta(days=7)),
    ("pool_close_timeout", "pool close", timedelta(milliseconds=1), timedelta(minutes=5)),
)


# A key in `key=value` conninfo or in a URI query string; used to spot TLS keys in any
# letter case before libpq (whose keys are case-sensitive) gets to refuse them as unknown.
_KEY_PATTERN = re.compile(r"(?:^|[\s?&])([A-Za-z_][A-Za-z0-9_-]*)\s*=")


def _parse_dsn(dsn: str) -> dict[str, str]:
    """Parse and police the DSN; errors never quote it."""
    if not dsn or not dsn.strip():
        raise EmptyConnectionString()
    for key in _KEY_PATTERN.findall(dsn):
        lowered = key.lower()
        if lowered.startswith("ssl") or lowered in _TLS_KEYS:
            raise TlsOptionInConnectionString()
    try:
        parsed = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        raise InvalidConnectionString(reason="it cannot be parsed") from None
    keys = {key.lower(): key for key in parsed}
    for lowered in keys:
        if lowered.startswith("ssl") or lowered in _TLS_KEYS:
            raise TlsOptionInConnectionString()
    for lowered in keys:
        if lowered not in _ALLOWED_KEYS:
            raise InvalidConnectionString(reason=f"key {lowered!r} is not allowed")
    return {key.lower(): str(value) for key, value in parsed.items() if value is not None}


@attrs.frozen(kw_only=True, repr=False)
class ConnectionConfig:
    """Everything pybatch needs to reach PostgreSQL, validated on construction.

    Build new variants with `attrs.evolve`, which validates the whole
    configuration again.
    """

    dsn: str = attrs.field(validator=attrs.validators.instance_of(str))
    tls_mode: TlsMode = TlsMode.VERIFY_FULL
    ca_certificate: CaCertificate | None = None
    pool_size: int = 10
    acquire_timeout: timedelta = timedelta(seconds=30)
    connect_timeout: timedelta = timedelta(seconds=10)
    statement_timeout: timedelta = timedelta(seconds=30)
    lock_timeout: timedelta = timedelta(seconds=5)
    idle_transaction_timeout: timedelta = timedelta(seconds=60)
    connection_idle_timeout: timedelta = timedelta(minutes=10)
    connection_max_lifetime: timedelta = timedelta(minutes=30)
    pool_close_timeout: timedelta = timedelta(seconds=30)
    unit_of_work_attempts: int = 3

    def __attrs_post_init__(self) -> None:
        _parse_dsn(self.dsn)
        if type(self.pool_size) is not int or not 1 <= self.pool_size <= 1024:
            raise PoolSize()
        for name, label, low, high in _TIMEOUT_BOUNDS:
            value = getattr(self, name)
            if not isinstance(value, timedelta) or not low <= value <= high:
                raise TimeoutOutOfBounds(timeout_class=label, bounds=f"{low} to {high}")
        if self.lock_timeout > self.statement_timeout:
            raise LockExceedsStatement()
        if self.acquire_timeout > self.pool_close_timeout:
            raise AcquireExceedsClose()
        if type(self.unit_of_work_attempts) is not int or not 1 <= self.unit_of_work_attempts <= 10:
            raise UnitOfWorkAttempts()
        if not isinstance(self.tls_mode, TlsMode):
            raise TypeError("tls_mode must be a TlsMode")
        if self.ca_certificate is not None and self.tls_mode is not TlsMode.VERIFY_FULL:
            raise TypeError("a CA certificate applies only to TlsMode.VERIFY_FULL")

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in ("pool_size", "statement_timeout", "lock_timeout")
        )
        return (
            f'ConnectionConfig(connection="<redacted>", tls_mode={self.tls_mode.value}, '
            f"ca_certificate={self.ca_certificate!r}, {fields})"
        )

    __str__ = __repr__

    # ------------------------------------------------------------------ derived values

    @property
    def statement_timeout_ms(self) -> int:
        """Statement timeout as sent to `set_config` (milliseconds)."""
        return _ms(self.statement_timeout)

    @property
    def lock_timeout_ms(self) -> int:
        """Lock timeout as sent to `set_config` (milliseconds)."""
        return _ms(self.lock_timeout)

    @property
    def idle_transaction_timeout_ms(self) -> int:
        """Idle-in-transaction timeout as sent to `set_config` (milliseconds)."""
        return _ms(self.idle_transaction_timeout)

    def connection_kwargs(
        self, *, ca_file: str | None = None, statement_timeout: bool = True
    ) -> dict[str, Any]:
        """Keyword arguments for `psycopg.connect`, with pybatch's TLS and session settings forced.

        Explicit parameters win over libpq environment variables, so PGSSLMODE and
        friends cannot weaken the configured mode. Every connection starts with UTC and the
        configured lock and idle-in-transaction timeouts as session defaults, through the
        libpq startup `options` (they outrank `ALTER DATABASE/ROLE ... SET`), and with the
        statement timeout too unless `statement_timeout=False` (the migrator's connection:
        migrations may be long). This is the only place settings are applied
        (docs/architecture.md, "Transactions").
        """
        params: dict[str, Any] = _parse_dsn(self.dsn)
        startup = (
            f"-c lock_timeout={self.lock_timeout_ms}"
            f" -c idle_in_transaction_session_timeout={self.idle_transaction_timeout_ms}"
            " -c TimeZone=UTC"
        )
        if statement_timeout:
            startup = f"-c statement_timeout={self.statement_timeout_ms} {startup}"
        params["options"] = f"{params['options']} {startup}" if "options" in params else startup
        params["application_name"] = APPLICATION_NAME
        # libpq's connect_timeout has one-second granularity; round up, never to 0 (= forever).
        params["connect_timeout"] = str(max(1, math.ceil(self.connect_timeout.total_seconds())))
        if self.tls_mode is TlsMode.PLAINTEXT:
            params["sslmode"] = "disable"
        else:
            params["sslmode"] = "verify-full"
            if self.ca_certificate is None:
                params["sslrootcert"] = "system"
            else:
                if ca_file is None:
                    raise ValueError("a CA file path is required for a CA certificate")
                params["sslrootcert"] = ca_file
        return params

    # ------------------------------------------------------------------ environment

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConnectionConfig:
        """Build a configuration from `PYBATCH_*` environment variables.

        PYBATCH_DSN (required), PYBATCH_TLS (`verify-full` or `plaintext`),
        PYBATCH_CA_FILE, PYBATCH_POOL_SIZE, PYBATCH_UNIT_OF_WORK_ATTEMPTS and
        PYBATCH_<TIMEOUT>_MS for each timeout field (e.g. PYBATCH_STATEMENT_TIMEOUT_MS).
        """
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {"dsn": env.get("PYBATCH_DSN", "")}
        tls = env.get("PYBATCH_TLS")
        if tls is not None:
            try:
                kwargs["tls_mode"] = TlsMode(tls)
            except ValueError:
                raise EnvironmentValueInvalid(
                    variable="PYBATCH_TLS", expected="TLS mode (verify-full or plaintext)"
                ) from None
        ca_file = env.get("PYBATCH_CA_FILE")
        if ca_file:
            try:
                with open(ca_file, "rb") as handle:
                    pem = handle.read(MAX_CA_BYTES + 1)
            except OSError:
                raise EnvironmentValueInvalid(
                    variable="PYBATCH_CA_FILE", expected="readable file"
                ) from None
            kwargs["ca_certificate"] = CaCertificate(pem)
        for variable, field in (
            ("PYBATCH_POOL_SIZE", "pool_size"),
            ("PYBATCH_UNIT_OF_WORK_ATTEMPTS", "unit_of_work_attempts"),
        ):
            if variable in env:
                kwargs[field] = _env_int(env, variable)
        for field, _label, _low, _high in _TIMEOUT_BOUNDS:
            variable = f"PYBATCH_{field.upper()}_MS"
            if variable in env:
                kwargs[field] = timedelta(milliseconds=_env_int(env, variable))
        return cls(**kwargs)


def _env_int(env: Mapping[str, str], variable: str) -> int:
    try:
        return int(env[variable])
    except ValueError:
        raise EnvironmentValueInvalid(variable=variable, expected="integer") from None
