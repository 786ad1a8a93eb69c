"""Connection configuration: bounds, TLS and redaction (docs/tables.md 6).

The DSN is a secret: never in a repr, str, exception or log line. TLS settings come only from
here, so neither the DSN nor libpq environment variables can weaken them.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import attrs
import psycopg.conninfo

from pybatch import errors as e

APPLICATION_NAME = "pybatch"
MAX_CA_BYTES = 1024 * 1024
MAX_POOL_SIZE = 1024
MAX_UNIT_OF_WORK_ATTEMPTS = 10

_ALLOWED_KEYS = frozenset(
    "host hostaddr port dbname user password application_name options target_session_attrs "
    "load_balance_hosts".split()
)
#: Keys whose value is a pybatch setting: in the DSN it would be silently overridden.
_SETTING_KEYS = {"connect_timeout": "PYBATCH_CONNECT_TIMEOUT_MS (connect_timeout)"}
#: libpq's values for the failover keys; libpq itself would only refuse a typo at connect time.
_KEY_VALUES = {
    "target_session_attrs": "any read-write read-only primary standby prefer-standby".split(),
    "load_balance_hosts": ["disable", "random"],
}
_TLS_KEYS = frozenset(
    "requiressl gssencmode ssl-mode ssl-root-cert ssl-ca ssl-cert ssl-key".split()
)


class Pooler(enum.Enum):
    """What pybatch connects through, which decides how its (not optional) settings arrive."""

    #: PostgreSQL: startup `options`, read back on connect (dropped: SettingsNotApplied).
    NONE = "none"
    #: PgBouncer pool_mode=session: each new connection sets them for its session.
    SESSION = "session"
    #: PgBouncer pool_mode=transaction: every transaction sets them; nothing is prepared.
    TRANSACTION = "transaction"


class TlsMode(enum.Enum):
    """How the connection is protected: verified TLS (default) or explicit plaintext."""

    #: sslmode=verify-full: certificate chain and host name are checked.
    VERIFY_FULL = "verify-full"
    #: sslmode=disable: only for isolated environments, chosen explicitly.
    PLAINTEXT = "plaintext"


@attrs.frozen(repr=False)
class CaCertificate:
    """A PEM CA bundle (1 byte to 1 MiB); its contents never print."""

    pem: bytes

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.pem, bytes):
            raise e.CaCertificateNotBytes()
        if not self.pem:
            raise e.EmptyCaCertificate()
        if len(self.pem) > MAX_CA_BYTES:
            raise e.CaCertificateTooLarge(max_bytes=MAX_CA_BYTES)

    def __repr__(self) -> str:
        return f'CaCertificate(byte_length={len(self.pem)}, contents="<redacted>")'


def _ms(value: timedelta) -> int:
    return math.ceil(value / timedelta(milliseconds=1))


# (field, error class name, lower bound, upper bound), in validation order (docs/tables.md 6.1).
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


#: How long an unresolved execution may go without a durable write before it is stale.
STALE_THRESHOLD_BOUNDS = (timedelta(minutes=1), timedelta(hours=24))
DEFAULT_STALE_THRESHOLD = timedelta(minutes=15)
#: How far a client's clock may be from the database server's when it connects.
CLOCK_SKEW_BOUNDS = (timedelta(milliseconds=100), timedelta(seconds=60))
DEFAULT_MAX_CLOCK_SKEW = timedelta(seconds=5)


def check_bounds(value: object, bounds: tuple[timedelta, ...], error: type[Exception]) -> None:
    """Refuse a duration outside `bounds` with `error` (ClockSkewBoundOutOfRange...)."""
    if not (isinstance(value, timedelta) and bounds[0] <= value <= bounds[1]):
        raise error()


def encodes_as_utf8(text: str) -> bool:
    """Whether `text` encodes; callers raise outside `except`: UnicodeEncodeError holds it all."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_dsn(dsn: Secret) -> ConnectionKwargs:
    """Parse the DSN with libpq's own parser and police the result; errors never quote it.

    Failures are raised outside `except` (the driver's message quotes the DSN), and no local
    holds the revealed DSN: an error reporter recording frame locals finds no password.
    """
    if not dsn.reveal().strip():
        raise e.EmptyConnectionString()
    if "\x00" in dsn.reveal():
        # libpq reads a C string: everything after a NUL (dbname, password) would vanish.
        raise e.InvalidConnectionString(reason="it contains a NUL character")
    if not encodes_as_utf8(dsn.reveal()):
        raise e.InvalidConnectionString(reason="it is not valid UTF-8")
    parsed: ConnectionKwargs | None
    try:
        parsed = ConnectionKwargs(psycopg.conninfo.conninfo_to_dict(dsn.reveal()))
    except psycopg.Error:
        parsed = None
    if parsed is None:
        raise e.InvalidConnectionString(
            reason="libpq cannot parse it (unknown or misspelt key, bad quoting or bad URI)"
        )
    if any(key.startswith("ssl") or key in _TLS_KEYS for key in parsed):
        raise e.TlsOptionInConnectionString()
    for key in parsed:
        if key in _SETTING_KEYS:
            raise e.InvalidConnectionString(
                reason=f"key {key!r} is a pybatch setting: set {_SETTING_KEYS[key]} instead"
            )
        if key not in _ALLOWED_KEYS:
            raise e.InvalidConnectionString(reason=f"key {key!r} is not allowed")
    result = ConnectionKwargs({k: str(v) for k, v in parsed.items() if v is not None})
    # One TCP port, or libpq's comma-separated list for several hosts; ASCII digits only.
    ports = result.get("port", "1").split(",")
    if not all(p.isascii() and p.isdigit() and len(p) <= 5 and 1 <= int(p) <= 65535 for p in ports):
        raise e.InvalidConnectionString(reason="port must be from 1 to 65535")
    for key, values in _KEY_VALUES.items():
        if key in result and result[key] not in values:
            raise e.InvalidConnectionString(reason=f"{key} must be one of {', '.join(values)}")
    # A multi-host DSN gives one port (for every host) or one per host, as libpq requires.
    hosts = max(
        (len(result[key].split(",")) for key in ("host", "hostaddr") if key in result), default=1
    )
    if len(ports) not in (1, hosts):
        raise e.InvalidConnectionString(
            reason=f"{len(ports)} ports for {hosts} hosts (give 1 or {hosts})"
        )
    return result


class Secret:
    """A string (the DSN) that never prints or pickles; `reveal()` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for libpq only."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('<redacted>')"

    def __format__(self, spec: str = "") -> str:
        return "<redacted>"

    __str__ = __format__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("a pybatch Secret cannot be pickled; pass the DSN through the environment")


class ConnectionKwargs(dict[str, Any]):
    """Keyword arguments for `psycopg.connect`: they hold the password, so they never print."""

    def __repr__(self) -> str:
        return f"ConnectionKwargs(keys={sorted(self)!r}, values=<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("connection keyword arguments hold a secret and cannot be pickled")


def _to_secret(value: object) -> Secret:
    """Attrs converter for the DSN: a str (or Secret) only; the refusal never echoes it."""
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        raise e.InvalidConnectionString(reason=f"it must be a str, not {type(value).__name__}")
    return Secret(value)


@attrs.frozen(kw_only=True, repr=False, init=False)
class ConnectionConfig:
    """Everything pybatch needs to reach PostgreSQL, validated on construction and evolve.

    `__init__` is written out so that its first statement wraps the DSN in a `Secret`: no
    frame of a later failed check holds the password as a local variable.
    """

    dsn: Secret = attrs.field(converter=_to_secret)
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
    #: Checked on every new pooled connection (ClockSkewExceeded beyond it).
    max_clock_skew: timedelta = DEFAULT_MAX_CLOCK_SKEW
    #: An unresolved execution with no durable write for this long (database clock) is stale.
    stale_threshold: timedelta = DEFAULT_STALE_THRESHOLD
    #: What sits between pybatch and the server (Pooler); PYBATCH_POOLER.
    pooler: Pooler = Pooler.NONE

    def __init__(
        self,
        *,
        dsn: Secret | str,
        tls_mode: TlsMode = TlsMode.VERIFY_FULL,
        ca_certificate: CaCertificate | None = None,
        pool_size: int = 10,
        acquire_timeout: timedelta = timedelta(seconds=30),
        connect_timeout: timedelta = timedelta(seconds=10),
        statement_timeout: timedelta = timedelta(seconds=30),
        lock_timeout: timedelta = timedelta(seconds=5),
        idle_transaction_timeout: timedelta = timedelta(seconds=60),
        connection_idle_timeout: timedelta = timedelta(minutes=10),
        connection_max_lifetime: timedelta = timedelta(minutes=30),
        pool_close_timeout: timedelta = timedelta(seconds=30),
        unit_of_work_attempts: int = 3,
        max_clock_skew: timedelta = DEFAULT_MAX_CLOCK_SKEW,
        stale_threshold: timedelta = DEFAULT_STALE_THRESHOLD,
        pooler: Pooler = Pooler.NONE,
    ) -> None:
        dsn = _to_secret(dsn)  # first: from here on no local holds the raw DSN
        # Every parameter is the field of its name; `dsn` now holds only the Secret.
        self.__attrs_init__(**{name: value for name, value in locals().items() if name != "self"})

    def __attrs_post_init__(self) -> None:
        _parse_dsn(self.dsn)
        if type(self.pool_size) is not int or not 1 <= self.pool_size <= MAX_POOL_SIZE:
            raise e.PoolSize()
        for name, label, low, high in _TIMEOUT_BOUNDS:
            value = getattr(self, name)
            if not isinstance(value, timedelta) or not low <= value <= high:
                raise e.TimeoutOutOfBounds(timeout_class=label, bounds=f"{low} to {high}")
        if self.lock_timeout > self.statement_timeout:
            raise e.LockExceedsStatement()
        if self.acquire_timeout > self.pool_close_timeout:
            raise e.AcquireExceedsClose()
        attempts = self.unit_of_work_attempts
        if type(attempts) is not int or not 1 <= attempts <= MAX_UNIT_OF_WORK_ATTEMPTS:
            raise e.UnitOfWorkAttempts()
        check_bounds(self.max_clock_skew, CLOCK_SKEW_BOUNDS, e.ClockSkewBoundOutOfRange)
        check_bounds(self.stale_threshold, STALE_THRESHOLD_BOUNDS, e.StaleThresholdOutOfRange)
        if not isinstance(self.tls_mode, TlsMode):
            raise e.InvalidTlsMode()
        if not isinstance(self.pooler, Pooler):
            raise e.InvalidPooler()
        if self.ca_certificate is not None and not isinstance(self.ca_certificate, CaCertificate):
            raise e.CaCertificateNotBytes()
        if self.ca_certificate is not None and self.tls_mode is not TlsMode.VERIFY_FULL:
            raise e.CaCertificateWithoutVerification()

    def __repr__(self) -> str:
        return (
            f'ConnectionConfig(connection="<redacted>", tls_mode={self.tls_mode.value}, '
            f"ca_certificate={self.ca_certificate!r}, pool_size={self.pool_size!r}, "
            f"statement_timeout={self.statement_timeout!r}, lock_timeout={self.lock_timeout!r})"
        )

    __str__ = __repr__

    def connection_kwargs(
        self, *, ca_file: str | None = None, statement_timeout: bool = True
    ) -> ConnectionKwargs:
        """Keyword arguments for `psycopg.connect` (they hold the password): TLS forced.

        Explicit parameters beat libpq environment variables. Without a pooler the startup
        `options` carry `session_settings` (the migrator, `statement_timeout=False`, sets its own).
        """
        params = _parse_dsn(self.dsn)
        if self.pooler is Pooler.NONE:
            settings = self.session_settings()
            if not statement_timeout:
                del settings["statement_timeout"]
            startup = " ".join(
                f"-c {name}={value.replace(' ', chr(92) + ' ')}" for name, value in settings.items()
            )
            params["options"] = f"{params['options']} {startup}" if "options" in params else startup
        params["application_name"] = APPLICATION_NAME
        # libpq's connect_timeout has one-second granularity; round up, never to 0 (= forever).
        params["connect_timeout"] = str(max(1, math.ceil(self.connect_timeout.total_seconds())))
        params["sslmode"] = "disable" if self.tls_mode is TlsMode.PLAINTEXT else "verify-full"
        if self.tls_mode is TlsMode.VERIFY_FULL:
            if self.ca_certificate is not None and ca_file is None:
                raise ValueError("a CA file path is required for a CA certificate")
            params["sslrootcert"] = "system" if self.ca_certificate is None else ca_file
        return params

    def session_settings(self) -> dict[str, str]:
        """The server settings pybatch runs under, by name, as pg_settings spells their values."""
        return {
            "statement_timeout": str(_ms(self.statement_timeout)),
            "lock_timeout": str(_ms(self.lock_timeout)),
            "idle_in_transaction_session_timeout": str(_ms(self.idle_transaction_timeout)),
            "TimeZone": "UTC",
            # What a unit of work of one statement, sent in autocommit, runs under.
            "default_transaction_isolation": "read committed",
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConnectionConfig:
        """From PYBATCH_DSN, _TLS, _POOLER, _CA_FILE, _POOL_SIZE, _UNIT_OF_WORK_ATTEMPTS, _*_MS."""
        source = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {"dsn": Secret(source.get("PYBATCH_DSN", ""))}
        env = {k: v for k, v in source.items() if k.startswith("PYBATCH_") and k != "PYBATCH_DSN"}
        # From here on no local of this frame holds the raw DSN.
        del source, environ
        for field, variable, enum_cls, expected in (
            ("tls_mode", "PYBATCH_TLS", TlsMode, "TLS mode (verify-full or plaintext)"),
            ("pooler", "PYBATCH_POOLER", Pooler, "pooler (none, session or transaction)"),
        ):
            text = env.get(variable)
            if text is not None:
                try:
                    kwargs[field] = enum_cls(text)
                except ValueError:
                    raise e.EnvironmentValueInvalid(variable=variable, expected=expected) from None
        ca_file = env.get("PYBATCH_CA_FILE")
        if ca_file:
            try:
                with open(ca_file, "rb") as handle:
                    pem = handle.read(MAX_CA_BYTES + 1)
            except OSError:
                raise e.EnvironmentValueInvalid(
                    variable="PYBATCH_CA_FILE", expected="readable file"
                ) from None
            kwargs["ca_certificate"] = CaCertificate(pem)
        for field, high in (
            ("pool_size", MAX_POOL_SIZE),
            ("unit_of_work_attempts", MAX_UNIT_OF_WORK_ATTEMPTS),
        ):
            variable = f"PYBATCH_{field.upper()}"
            if variable in env:
                kwargs[field] = _env_int(env, variable, 1, high)
        for field, _label, low_delta, high_delta in (
            *_TIMEOUT_BOUNDS,
            # Read wide (no overflow); the settings' own checks name their bounds.
            ("max_clock_skew", "", timedelta(0), 10 * CLOCK_SKEW_BOUNDS[1]),
            ("stale_threshold", "", timedelta(0), 10 * STALE_THRESHOLD_BOUNDS[1]),
        ):
            variable = f"PYBATCH_{field.upper()}_MS"
            if variable in env:
                milliseconds = _env_int(env, variable, _ms(low_delta), _ms(high_delta))
                kwargs[field] = timedelta(milliseconds=milliseconds)
        return cls(**kwargs)


def _env_int(env: Mapping[str, str], variable: str, low: int, high: int) -> int:
    """The variable as an int: ASCII digits only (`int()` reads ' 1_0 '), at most `high`'s count."""
    text = env[variable]
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > len(str(high)):
        raise e.EnvironmentValueInvalid(
            variable=variable, expected=f"integer from {low} to {high} (ASCII digits)"
        )
    return int(text)
