"""The DSN is a secret everywhere a configuration can travel: errors, repr, pickle, asdict."""

from __future__ import annotations

import logging
import pickle
import traceback
from datetime import timedelta
from typing import Any

import attrs
import pytest

from pybatch import errors
from pybatch._config import CaCertificate, ConnectionConfig, Secret, TlsMode

PASSWORD = "s3cr3t-Pa55"
DSN = f"postgresql://etl_user:{PASSWORD}@db.internal:5432/warehouse"


def _chain(error: BaseException) -> list[BaseException]:
    """The error with every __cause__ and __context__ behind it."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _assert_no_secret(error: BaseException, *secrets: str) -> None:
    rendered = "".join(traceback.format_exception(error))
    for secret in secrets:
        assert secret not in rendered
        for link in _chain(error):
            assert secret not in str(link)
            assert secret not in repr(link)
            assert secret not in repr(getattr(link, "args", ()))


@pytest.mark.parametrize("dsn", [DSN.encode(), bytearray(DSN.encode()), 42, None])
def test_a_dsn_of_the_wrong_type_is_refused_without_echoing_it(dsn: Any) -> None:
    with pytest.raises(errors.InvalidConnectionString) as caught:
        ConnectionConfig(dsn=dsn)
    _assert_no_secret(caught.value, PASSWORD, "etl_user", "db.internal")


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://u:{PASSWORD}%zz@h/d",
        f"postgresql://u:{PASSWORD}@[::1/d",
        f"[::1 password={PASSWORD}",
        f"host=h password='{PASSWORD}",
        f"host=h password={PASSWORD} bogus=1",
    ],
)
def test_a_malformed_dsn_leaves_no_secret_in_the_error_chain(dsn: str) -> None:
    with pytest.raises(errors.InvalidConnectionString) as caught:
        ConnectionConfig(dsn=dsn)
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    _assert_no_secret(caught.value, PASSWORD)


def test_pickle_of_a_configuration_is_refused_without_the_secret() -> None:
    config = ConnectionConfig(dsn=DSN)
    with pytest.raises(TypeError) as caught:
        pickle.dumps(config)
    _assert_no_secret(caught.value, PASSWORD)


def test_asdict_holds_a_redacted_secret_not_the_dsn() -> None:
    config = ConnectionConfig(dsn=DSN)
    fields = attrs.asdict(config)
    assert isinstance(fields["dsn"], Secret)
    assert PASSWORD not in repr(fields) and PASSWORD not in str(fields)
    assert f"{fields['dsn']}" == "<redacted>"
    assert fields["dsn"].reveal() == DSN
    # evolve still works from the public name and revalidates
    assert attrs.evolve(config, pool_size=3).dsn == config.dsn


def test_connection_kwargs_hold_the_password_but_never_print_or_pickle_it() -> None:
    kwargs = ConnectionConfig(dsn=DSN).connection_kwargs()
    assert kwargs["password"] == PASSWORD  # libpq needs it
    for text in (repr(kwargs), str(kwargs), f"{kwargs}"):
        assert PASSWORD not in text
        assert "db.internal" not in text
    with pytest.raises(TypeError):
        pickle.dumps(kwargs)


def test_a_nul_inside_the_dsn_is_refused_not_truncated() -> None:
    # libpq would stop at the NUL and connect to another database without the password.
    with pytest.raises(errors.InvalidConnectionString, match="NUL"):
        ConnectionConfig(dsn=f"host=db user=etl\x00 dbname=prod password={PASSWORD}")


def test_a_dsn_that_is_not_utf8_is_refused() -> None:
    undecodable = b"host=db password=\xff\xfe".decode("utf-8", "surrogateescape")
    with pytest.raises(errors.InvalidConnectionString, match="UTF-8") as caught:
        ConnectionConfig(dsn=undecodable)
    assert caught.value.__context__ is None


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db password='sslmode=disable'",
        "host=db password=ssl_x=1",
        "postgresql://u:sslmode%3Ddisable@db/x",
        "host=db options='-c ssl=off'",
    ],
)
def test_data_that_mentions_ssl_is_not_a_tls_option(dsn: str) -> None:
    config = ConnectionConfig(dsn=dsn)
    kwargs = config.connection_kwargs()
    assert kwargs["sslmode"] == "verify-full"


@pytest.mark.parametrize("dsn", ["host=db SSLMODE=require", "postgresql://u@db/x?SslMode=a"])
def test_case_variants_of_tls_keys_are_unknown_to_libpq_and_refused(dsn: str) -> None:
    with pytest.raises(errors.InvalidConnectionString):
        ConnectionConfig(dsn=dsn)


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db port=abc",
        "host=db port=99999",
        "host=db port=0",
        "postgresql://u@db:abc/x",
        "host=a,b port=5432,x",
        "host=db port=٣",
    ],
)
def test_bad_ports_are_refused_when_the_configuration_is_built(dsn: str) -> None:
    with pytest.raises(errors.InvalidConnectionString, match="port"):
        ConnectionConfig(dsn=dsn)


def test_multi_host_ports_are_accepted() -> None:
    assert ConnectionConfig(dsn="host=a,b port=5432,5433").connection_kwargs()["port"] == (
        "5432,5433"
    )


@pytest.mark.parametrize("value", ["٣", " 1_0 ", "1_0", " 10", "+5", "-1", "", "²"])
def test_environment_integers_are_ascii_digits_only(value: str) -> None:
    with pytest.raises(errors.EnvironmentValueInvalid, match="PYBATCH_POOL_SIZE"):
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_POOL_SIZE": value})


def test_environment_timeouts_are_ascii_digits_only() -> None:
    with pytest.raises(errors.EnvironmentValueInvalid, match="PYBATCH_LOCK_TIMEOUT_MS"):
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_LOCK_TIMEOUT_MS": "1_000"})


@pytest.mark.parametrize("pem", ["pem", "-----BEGIN CERTIFICATE-----", 3])
def test_a_ca_certificate_that_is_not_bytes_is_refused(pem: Any) -> None:
    with pytest.raises(errors.CaCertificateNotBytes):
        ConnectionConfig(dsn=DSN, ca_certificate=pem)
    with pytest.raises(errors.CaCertificateNotBytes):
        CaCertificate(pem)


def test_tls_mode_and_ca_combination_errors_are_typed() -> None:
    with pytest.raises(errors.InvalidTlsMode):
        ConnectionConfig(dsn=DSN, tls_mode="plaintext")  # type: ignore[arg-type]
    with pytest.raises(errors.CaCertificateWithoutVerification):
        ConnectionConfig(
            dsn=DSN, tls_mode=TlsMode.PLAINTEXT, ca_certificate=CaCertificate(b"-----BEGIN")
        )


def test_timeouts_of_the_wrong_type_are_typed_errors() -> None:
    with pytest.raises(errors.TimeoutOutOfBounds):
        ConnectionConfig(dsn=DSN, lock_timeout=5)  # type: ignore[arg-type]
    with pytest.raises(errors.PoolSize):
        ConnectionConfig(dsn=DSN, pool_size="3")  # type: ignore[arg-type]
    with pytest.raises(errors.PoolSize):
        ConnectionConfig(dsn=DSN, pool_size=True)
    ConnectionConfig(dsn=DSN, lock_timeout=timedelta(seconds=1))


def test_pool_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    import psycopg

    import pybatch._connect  # noqa: F401  (installs the redactor)

    logger = logging.getLogger("psycopg.pool")
    error = psycopg.OperationalError(
        f'connection to server at "db.internal", port 5432 failed: FATAL: password '
        f'authentication failed for user "etl_user" {PASSWORD}'
    )
    with caplog.at_level(logging.INFO, logger="psycopg.pool"):
        logger.warning("error connecting in %r: %s", "pybatch", error)
        logger.warning("discarding broken connection: %s", object())
    text = caplog.text
    assert "error connecting in 'pybatch': OperationalError" in text
    for secret in ("db.internal", "etl_user", PASSWORD):
        assert secret not in text


@pytest.mark.parametrize(
    ("variable", "bounds"),
    [
        ("PYBATCH_POOL_SIZE", "from 1 to 1024"),
        ("PYBATCH_UNIT_OF_WORK_ATTEMPTS", "from 1 to 10"),
        ("PYBATCH_LOCK_TIMEOUT_MS", "from 1 to 300000"),
        ("PYBATCH_STATEMENT_TIMEOUT_MS", "from 1 to 86400000"),
    ],
)
@pytest.mark.parametrize("digits", [20, 5_000])
def test_an_environment_integer_with_too_many_digits_names_the_variable_and_its_range(
    variable: str, bounds: str, digits: int
) -> None:
    """5,000 digits used to escape as int()'s bare ValueError, 20 as timedelta's OverflowError."""
    with pytest.raises(errors.EnvironmentValueInvalid) as refused:
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, variable: "9" * digits})
    assert refused.value.variable == variable
    assert str(refused.value) == (
        f"environment variable {variable} is not a valid integer {bounds} (ASCII digits)"
    )


def test_leading_zeros_do_not_count_as_digits_and_range_errors_keep_their_type() -> None:
    config = ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_POOL_SIZE": "0" * 50 + "7"})
    assert config.pool_size == 7
    with pytest.raises(errors.PoolSize):
        ConnectionConfig.from_env({"PYBATCH_DSN": DSN, "PYBATCH_POOL_SIZE": "2048"})


def test_a_port_with_thousands_of_digits_is_an_invalid_connection_string() -> None:
    with pytest.raises(errors.InvalidConnectionString, match="port"):
        ConnectionConfig(dsn=f"host=db port={'9' * 5_000} password={PASSWORD}")


def _frame_locals_below_the_test(
    error: pytest.ExceptionInfo[BaseException],
) -> list[tuple[str, str]]:
    """(frame, repr or str of one local) for every frame below the test's own."""
    tb = error.tb.tb_next  # skip the test's own frame: it holds the DSN it built
    seen: list[tuple[str, str]] = []
    while tb is not None:
        frame = tb.tb_frame
        for name, value in frame.f_locals.items():
            seen.append((f"{frame.f_code.co_qualname}:{name}", repr(value)))
            seen.append((f"{frame.f_code.co_qualname}:{name} (str)", str(value)))
        tb = tb.tb_next
    return seen


def _bad_dsn(kind: str) -> str:
    return {
        "tls option": f"host=db user=etl password={PASSWORD} sslmode=disable",
        "unknown key": f"host=db user=etl password={PASSWORD} service=prod",
        "bad port": f"host=db port=70000 user=etl password={PASSWORD}",
        "unparsable": f"host=db password={PASSWORD} 'unterminated",
        "nul": f"host=db password={PASSWORD}\x00 dbname=x",
        "uri tls": f"postgresql://etl:{PASSWORD}@db/x?sslmode=disable",
    }[kind]


@pytest.mark.parametrize(
    "kind", ["tls option", "unknown key", "bad port", "unparsable", "nul", "uri tls"]
)
def test_no_frame_of_a_dsn_refusal_holds_the_password_as_a_local(kind: str) -> None:
    """Error reporters record every frame's local variables; none may show the password."""
    with pytest.raises(errors.ConfigError) as refused:
        ConnectionConfig(dsn=_bad_dsn(kind), tls_mode=TlsMode.PLAINTEXT)
    seen = _frame_locals_below_the_test(refused)
    assert any(where.startswith("ConnectionConfig.__init__:") for where, _ in seen)
    assert any(where.startswith("_parse_dsn:") for where, _ in seen)
    leaked = [where for where, text in seen if PASSWORD in text]
    assert leaked == []


def test_no_frame_of_a_refusal_after_the_dsn_check_holds_the_password() -> None:
    with pytest.raises(errors.PoolSize) as refused:
        ConnectionConfig(dsn=DSN, pool_size=0)
    assert [
        where for where, text in _frame_locals_below_the_test(refused) if PASSWORD in text
    ] == []
    with pytest.raises(errors.LockExceedsStatement) as evolved:
        attrs.evolve(ConnectionConfig(dsn=DSN), lock_timeout=timedelta(minutes=2))
    assert [
        where for where, text in _frame_locals_below_the_test(evolved) if PASSWORD in text
    ] == []


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"PYBATCH_DSN": _bad_dsn("tls option")}, errors.TlsOptionInConnectionString),
        ({"PYBATCH_DSN": DSN, "PYBATCH_POOL_SIZE": "9" * 5_000}, errors.EnvironmentValueInvalid),
        ({"PYBATCH_DSN": DSN, "PYBATCH_TLS": "none"}, errors.EnvironmentValueInvalid),
    ],
    ids=["dsn", "pool size", "tls"],
)
def test_no_frame_of_a_from_env_refusal_holds_the_password(
    settings: dict[str, str], error: type[errors.ConfigError]
) -> None:
    with pytest.raises(error) as refused:
        ConnectionConfig.from_env(settings)
    seen = _frame_locals_below_the_test(refused)
    assert any(where.startswith("ConnectionConfig.from_env:") for where, _ in seen)
    assert [where for where, text in seen if PASSWORD in text] == []
