"""ConnectionConfig: every bound, the cross-checks, TLS policing and redaction."""

from __future__ import annotations

import pickle
from datetime import timedelta

import attrs
import pytest

from pybatch import errors
from pybatch._config import CaCertificate, ConnectionConfig, Pooler, TlsMode

DSN = "postgresql://etl_user:s3cr3t-Pa55@db.internal:5432/warehouse"


def make(**overrides: object) -> ConnectionConfig:
    return ConnectionConfig(dsn=DSN, **overrides)  # type: ignore[arg-type]


def test_defaults_match_the_contract() -> None:
    config = make()
    assert config.tls_mode is TlsMode.VERIFY_FULL
    assert config.pool_size == 10
    assert config.acquire_timeout == timedelta(seconds=30)
    assert config.connect_timeout == timedelta(seconds=10)
    assert config.statement_timeout == timedelta(seconds=30)
    assert config.lock_timeout == timedelta(seconds=5)
    assert config.idle_transaction_timeout == timedelta(seconds=60)
    assert config.connection_idle_timeout == timedelta(minutes=10)
    assert config.connection_max_lifetime == timedelta(minutes=30)
    assert config.pool_close_timeout == timedelta(seconds=30)
    assert config.unit_of_work_attempts == 3


@pytest.mark.parametrize("size", [0, 1025, -1])
def test_pool_size_out_of_bounds(size: int) -> None:
    with pytest.raises(errors.PoolSize):
        make(pool_size=size)


@pytest.mark.parametrize("size", [1, 1024])
def test_pool_size_bounds_accepted(size: int) -> None:
    assert make(pool_size=size).pool_size == size


TIMEOUTS = [
    ("acquire_timeout", "acquire", timedelta(milliseconds=1), timedelta(minutes=5)),
    ("connect_timeout", "connect", timedelta(milliseconds=1), timedelta(minutes=5)),
    ("statement_timeout", "statement", timedelta(milliseconds=1), timedelta(hours=24)),
    ("lock_timeout", "lock", timedelta(milliseconds=1), timedelta(minutes=5)),
    ("idle_transaction_timeout", "idle transaction", timedelta(seconds=1), timedelta(hours=24)),
    ("connection_idle_timeout", "connection idle", timedelta(seconds=1), timedelta(hours=24)),
    ("connection_max_lifetime", "connection lifetime", timedelta(minutes=1), timedelta(days=7)),
    ("pool_close_timeout", "pool close", timedelta(milliseconds=1), timedelta(minutes=5)),
]


def _consistent(field: str, value: timedelta) -> dict[str, object]:
    """Other settings adjusted so only `field` can be out of bounds."""
    extra: dict[str, object] = {field: value}
    if field == "lock_timeout":
        extra["statement_timeout"] = timedelta(hours=1)
    if field == "statement_timeout":
        extra["lock_timeout"] = timedelta(milliseconds=1)
    if field == "acquire_timeout":
        extra["pool_close_timeout"] = timedelta(minutes=5)
    if field == "pool_close_timeout":
        extra["acquire_timeout"] = timedelta(milliseconds=1)
    return extra


@pytest.mark.parametrize(("field", "label", "low", "high"), TIMEOUTS)
def test_every_timeout_bound(field: str, label: str, low: timedelta, high: timedelta) -> None:
    assert getattr(make(**_consistent(field, low)), field) == low
    assert getattr(make(**_consistent(field, high)), field) == high
    for bad in (low - timedelta(microseconds=1), high + timedelta(milliseconds=1)):
        with pytest.raises(errors.TimeoutOutOfBounds) as caught:
            make(**_consistent(field, bad))
        assert caught.value.timeout_class == label
        assert label in str(caught.value)


def test_lifetime_of_59_seconds_is_refused() -> None:
    with pytest.raises(errors.TimeoutOutOfBounds, match="connection lifetime"):
        make(connection_max_lifetime=timedelta(seconds=59))


def test_lock_timeout_may_not_exceed_statement_timeout() -> None:
    with pytest.raises(errors.LockExceedsStatement):
        make(lock_timeout=timedelta(seconds=31), statement_timeout=timedelta(seconds=30))
    make(lock_timeout=timedelta(seconds=30), statement_timeout=timedelta(seconds=30))


def test_acquire_may_not_exceed_close() -> None:
    with pytest.raises(errors.AcquireExceedsClose):
        make(acquire_timeout=timedelta(seconds=31), pool_close_timeout=timedelta(seconds=30))


def test_evolve_revalidates_the_whole_configuration() -> None:
    with pytest.raises(errors.PoolSize):
        attrs.evolve(make(), pool_size=0)


@pytest.mark.parametrize("attempts", [0, 11])
def test_unit_of_work_attempts_bounds(attempts: int) -> None:
    with pytest.raises(errors.UnitOfWorkAttempts):
        make(unit_of_work_attempts=attempts)


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db sslmode=disable",
        "postgresql://u@db/x?sslrootcert=/tmp/ca.pem",
        "host=db sslcert=/c",
        "host=db requiressl=1",
        "host=db gssencmode=disable",
        "host=db ssl_min_protocol_version=TLSv1.2",
    ],
)
def test_tls_options_in_dsn_are_refused(dsn: str) -> None:
    with pytest.raises(errors.TlsOptionInConnectionString):
        ConnectionConfig(dsn=dsn)


@pytest.mark.parametrize(
    "dsn", ["host=db service=prod", "host=db connect_timeout=3", "host=db bogus=1", "=="]
)
def test_unknown_or_unparsable_dsn_is_refused(dsn: str) -> None:
    with pytest.raises(errors.InvalidConnectionString):
        ConnectionConfig(dsn=dsn)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (
            "host=db1,db2 port=5432,5433 dbname=w target_session_attrs=read-write",
            {"host": "db1,db2", "port": "5432,5433", "target_session_attrs": "read-write"},
        ),
        (
            "postgresql://u@db1:5432,db2:5433/w?target_session_attrs=primary",
            {"host": "db1,db2", "port": "5432,5433", "target_session_attrs": "primary"},
        ),
        (
            "host=db1,db2,db3 port=6432 target_session_attrs=prefer-standby",
            {"host": "db1,db2,db3", "port": "6432", "target_session_attrs": "prefer-standby"},
        ),
        (
            "host=db1,db2 load_balance_hosts=random target_session_attrs=standby",
            {"load_balance_hosts": "random", "target_session_attrs": "standby"},
        ),
    ],
)
def test_failover_keys_and_host_lists_reach_libpq(dsn: str, expected: dict[str, str]) -> None:
    params = ConnectionConfig(dsn=dsn).connection_kwargs()
    assert {key: params[key] for key in expected} == expected
    assert params["sslmode"] == "verify-full"  # a failover DSN cannot weaken TLS


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("host=db1,db2 target_session_attrs=readwrite", "target_session_attrs must be one of"),
        ("host=db1,db2 load_balance_hosts=yes", "load_balance_hosts must be one of"),
        ("host=db1,db2,db3 port=5432,5433", "2 ports for 3 hosts (give 1 or 3)"),
        ("host=db connect_timeout=3", "set PYBATCH_CONNECT_TIMEOUT_MS (connect_timeout) instead"),
        ("host=db1,db2 service=prod", "key 'service' is not allowed"),
        ("host=db1,db2 keepalives=0", "key 'keepalives' is not allowed"),
    ],
)
def test_bad_failover_settings_are_refused_naming_the_fix(dsn: str, reason: str) -> None:
    with pytest.raises(errors.InvalidConnectionString) as caught:
        ConnectionConfig(dsn=f"{dsn} password=s3cr3t-Pa55")
    assert reason in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db1,db2 target_session_attrs=read-write sslmode=disable",
        "postgresql://u@db1,db2/w?target_session_attrs=read-write&sslmode=prefer",
        "host=db1,db2 target_session_attrs=read-write sslrootcert=/tmp/ca.pem",
    ],
)
def test_a_failover_dsn_still_refuses_tls_options(dsn: str) -> None:
    with pytest.raises(errors.TlsOptionInConnectionString):
        ConnectionConfig(dsn=dsn)


@pytest.mark.parametrize("dsn", ["", "   "])
def test_empty_dsn_is_refused(dsn: str) -> None:
    with pytest.raises(errors.EmptyConnectionString):
        ConnectionConfig(dsn=dsn)


def test_password_never_appears_in_repr_str_or_errors() -> None:
    config = make()
    for text in (repr(config), str(config), repr(attrs.evolve(config, pool_size=3))):
        assert "s3cr3t" not in text
        assert "etl_user" not in text
        assert "<redacted>" in text
    secret = "postgresql://u:s3cr3t-Pa55@h/db?sslmode=require"
    for bad in (secret, secret.replace("sslmode", "nonsense"), "host=h password=s3cr3t-Pa55 x=1"):
        with pytest.raises(errors.ConfigError) as caught:
            ConnectionConfig(dsn=bad)
        assert "s3cr3t" not in str(caught.value)
        assert "s3cr3t" not in repr(caught.value)
        assert caught.value.__cause__ is None
        assert "s3cr3t" not in repr(pickle.loads(pickle.dumps(caught.value)))


def test_tls_mapping_is_forced_and_application_name_is_pybatch() -> None:
    verified = make().connection_kwargs()
    assert verified["sslmode"] == "verify-full"
    assert verified["sslrootcert"] == "system"
    assert verified["application_name"] == "pybatch"
    plain = make(tls_mode=TlsMode.PLAINTEXT).connection_kwargs()
    assert plain["sslmode"] == "disable"
    assert "sslrootcert" not in plain
    with_ca = make(ca_certificate=CaCertificate(b"-----BEGIN CERTIFICATE-----\n"))
    assert with_ca.connection_kwargs(ca_file="/run/x.pem")["sslrootcert"] == "/run/x.pem"


def test_sub_second_connect_timeout_rounds_up_never_to_zero() -> None:
    assert (
        make(connect_timeout=timedelta(milliseconds=1)).connection_kwargs()["connect_timeout"]
        == "1"
    )


def test_ca_certificate_bounds_and_repr() -> None:
    with pytest.raises(errors.EmptyCaCertificate):
        CaCertificate(b"")
    with pytest.raises(errors.CaCertificateTooLarge) as caught:
        CaCertificate(b"x" * (1024 * 1024 + 1))
    assert caught.value.max_bytes == 1048576
    ok = CaCertificate(b"x" * (1024 * 1024))
    assert repr(ok) == 'CaCertificate(byte_length=1048576, contents="<redacted>")'


def test_from_env_reads_every_setting() -> None:
    config = ConnectionConfig.from_env(
        {
            "PYBATCH_DSN": DSN,
            "PYBATCH_TLS": "plaintext",
            "PYBATCH_POOL_SIZE": "7",
            "PYBATCH_STATEMENT_TIMEOUT_MS": "12000",
            "PYBATCH_LOCK_TIMEOUT_MS": "1500",
            "PYBATCH_UNIT_OF_WORK_ATTEMPTS": "5",
        }
    )
    assert config.tls_mode is TlsMode.PLAINTEXT
    assert config.pool_size == 7
    assert config.statement_timeout == timedelta(seconds=12)
    assert config.lock_timeout == timedelta(milliseconds=1500)
    assert config.unit_of_work_attempts == 5


def test_from_env_names_the_bad_variable() -> None:
    with pytest.raises(errors.EnvironmentValueInvalid, match="PYBATCH_POOL_SIZE"):
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_POOL_SIZE": "ten"})
    with pytest.raises(errors.EnvironmentValueInvalid, match="PYBATCH_TLS"):
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_TLS": "prefer"})
    with pytest.raises(errors.EmptyConnectionString):
        ConnectionConfig.from_env({})


def test_empty_dsn_names_where_to_set_it() -> None:
    with pytest.raises(errors.EmptyConnectionString) as caught:
        ConnectionConfig(dsn="")
    assert "PYBATCH_DSN" in str(caught.value) and "--dsn" in str(caught.value)


def test_sslmode_disable_in_the_dsn_points_at_pybatch_tls_settings() -> None:
    with pytest.raises(errors.TlsOptionInConnectionString) as caught:
        ConnectionConfig(dsn="host=db sslmode=disable")
    assert "PYBATCH_TLS" in str(caught.value) and "--plaintext" in str(caught.value)


def test_the_pooler_comes_from_pybatch_pooler_and_a_typo_names_the_variable() -> None:
    config = ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_POOLER": "transaction"})
    assert config.pooler is Pooler.TRANSACTION
    assert "options" not in config.connection_kwargs()  # PgBouncer refuses startup options
    assert "statement_timeout" in ConnectionConfig(dsn=DSN).connection_kwargs()["options"]
    with pytest.raises(errors.EnvironmentValueInvalid, match="PYBATCH_POOLER"):
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_POOLER": "pgbouncer"})
    with pytest.raises(errors.InvalidPooler):
        ConnectionConfig(dsn=DSN, pooler="transaction")  # type: ignore[arg-type]
