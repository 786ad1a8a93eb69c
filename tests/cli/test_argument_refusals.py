"""Arguments pybatch cannot read are one redacted line with exit code 2, never a traceback.

Run as the installed `pybatch` console script against the test database: a duration too
large for `timedelta`, an argument that is not UTF-8 and an environment integer with
thousands of digits each used to escape as a Python traceback; a cursor re-signed with a
raised identity ceiling was accepted.
"""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.etl import Job
from pybatch.values.explorer import Cursor, ExplorerQuery, NameKey, PageSize, query_binding
from tests.cli.test_explore import PYBATCH, env_for

HUGE = "99999999999999999d"


def run(*args: str | bytes, dsn: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYBATCH, *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        env=env_for(dsn, **extra),
        check=False,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [expected]


@pytest.mark.parametrize(
    ("args", "option", "forms"),
    [
        (("unresolved", "--older-than", HUGE), "--older-than", "90s, 10m, 2h, 1d"),
        (
            ("purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", HUGE),
            "--older-than",
            "90s, 15m, 1h, 90d",
        ),
        (("stop", "1", "--wait", "--timeout", HUGE), "--timeout", "90s, 15m, 1h, 90d"),
        (("unresolved", "--older-than", "9" * 5_000), "--older-than", "90s, 10m, 2h, 1d"),
        (("purge", "--job", "j", "--status", "FAILED", "--older-than", "36501d"), "--older-than",
         "90s, 15m, 1h, 90d"),
    ],
)  # fmt: skip
def test_a_duration_beyond_its_bound_is_one_usage_line(
    db_dsn: str, args: tuple[str, ...], option: str, forms: str
) -> None:
    result = run(*args, dsn=db_dsn)
    assert_one_line(
        result,
        f"pybatch: CommandArgumentInvalid: command-line argument {option} must be a duration "
        f"of at most 36500d ({forms})",
    )


def test_the_largest_duration_is_accepted(db_dsn: str, admin: psycopg.Connection[Any]) -> None:
    result = run("unresolved", "--older-than", "36500d", "--json", dsn=db_dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith('{"items": []')


def test_an_argument_that_is_not_utf8_is_one_line_naming_its_position(db_dsn: str) -> None:
    result = run("instances", b"\xff", dsn=db_dsn)
    assert_one_line(
        result, "pybatch: CommandArgumentInvalid: command-line argument #2 must be valid UTF-8 text"
    )
    result = run("jobs", "--dsn", b"host=db password=\xffsecret", dsn=db_dsn)
    assert_one_line(
        result, "pybatch: CommandArgumentInvalid: command-line argument #3 must be valid UTF-8 text"
    )


def test_a_pool_size_of_five_thousand_digits_names_the_variable_and_its_range(
    db_dsn: str,
) -> None:
    result = run("jobs", dsn=db_dsn, PYBATCH_POOL_SIZE="9" * 5_000)
    assert_one_line(
        result,
        "pybatch: EnvironmentValueInvalid: environment variable PYBATCH_POOL_SIZE is not a "
        "valid integer from 1 to 1024 (ASCII digits)",
    )


def test_a_re_signed_cursor_with_a_raised_ceiling_is_one_usage_line(
    db_dsn: str, pg_config: Any
) -> None:
    with JobRepository.connect(pg_config) as repository:
        for name in ("a_job", "b_job"):
            with repository.begin() as uow:
                uow.instances.select_or_create(Job(repository, name, {"run": 1}).key)
                uow.commit()
    binding = query_binding(ExplorerQuery.JOB_NAMES, PageSize(1), None)
    forged = Cursor.issue(ExplorerQuery.JOB_NAMES, NameKey("a_job"), 2**62, binding)
    result = run("jobs", "--limit", "1", "--after", str(forged), dsn=db_dsn)
    assert_one_line(result, "pybatch: CursorInvalid: the page cursor is invalid")
    honest = Cursor.issue(ExplorerQuery.JOB_NAMES, NameKey("a_job"), 2, binding)
    listed = run("jobs", "--limit", "1", "--after", str(honest), "--json", dsn=db_dsn)
    assert listed.returncode == 0, listed.stderr
    assert '"b_job"' in listed.stdout
