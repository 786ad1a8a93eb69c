"""Identifying parameter values in the read commands, and `--param NAME=VALUE` filters.

Run as the installed `pybatch` console script against real PostgreSQL: the values that tell
instances apart are shown (escaped and shortened in tables, exact in `--json`), and
`instances`, `executions` and `unresolved` keep the rows whose instance has every value given,
whatever the kind the value was stored with.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pybatch import JobRepository
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName
from pybatch.values.parameters import JobInstanceKey, JobParameters, ParameterValue
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus
from tests.cli.test_explore import TIMESTAMP, run, run_json
from tests.support.clock import ManualClock

DATE = "2026-11-30"


def started(
    repository: JobRepository, clock: ManualClock, name: str, parameters: dict[str, Any]
) -> JobExecution:
    """A STARTED execution of a new instance, stamped at the manual clock (two hours ago)."""
    with repository.begin() as uow:
        key = JobInstanceKey(JobName(name), JobParameters.of(parameters))
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id,
            execution.version,
            LifecycleTransition.new(BatchStatus.STARTED, clock.advance()),
        )
        uow.commit()
    return execution


@pytest.fixture
def stale(clock: ManualClock) -> ManualClock:
    clock.set(datetime.now(UTC) - timedelta(hours=2))
    return clock


def instance_ids(*args: str, dsn: str) -> list[int]:
    return [item["id"] for item in run_json("instances", *args, dsn=dsn)["items"]]


def test_the_filter_matches_a_value_whatever_kind_it_was_stored_with(
    repository: JobRepository, stale: ManualClock, db_dsn: str
) -> None:
    stored: dict[str, Any] = {
        "string 12": "12",
        "i64 12": 12,
        "bool true": True,
        "string true": "true",
        "string 012": "012",
        "u64 max": ParameterValue.u64(2**64 - 1),
        "i64 min": -(2**63),
    }
    ids = {
        label: started(repository, stale, "kinds", {"v": value}).job_instance_id
        for label, value in stored.items()
    }

    def matching(value: str) -> set[str]:
        found = instance_ids("kinds", "--param", f"v={value}", dsn=db_dsn)
        return {label for label, id_ in ids.items() if id_ in found}

    assert matching("12") == {"string 12", "i64 12"}
    assert matching("true") == {"bool true", "string true"}
    assert matching("012") == {"string 012"}
    assert matching("18446744073709551615") == {"u64 max"}
    assert matching("-9223372036854775808") == {"i64 min"}
    assert matching("True") == matching("1") == matching("") == set()
    listed = run_json("instances", "kinds", dsn=db_dsn)["items"]
    values = {(p["kind"], p["value"]) for item in listed for p in item["parameters"]}
    assert ("u64", 2**64 - 1) in values and ("bool", True) in values and ("i64", 12) in values
    table = run("instances", "kinds", dsn=db_dsn).stdout
    assert "v=12" in table and "v=true" in table and "v=18446744073709551615" in table

    # Every pair must match: AND, each pair through the index.
    for region in ("eu", "us"):
        started(repository, stale, "dates", {"business_date": DATE, "region": region})
    eu_later = started(repository, stale, "dates", {"business_date": "2026-12-01", "region": "eu"})
    both = instance_ids(
        "dates", "--param", f"business_date={DATE}", "--param", "region=eu", dsn=db_dsn
    )
    assert len(both) == 1 and both[0] != eu_later.job_instance_id
    assert len(instance_ids("dates", "--param", "region=eu", dsn=db_dsn)) == 2


def test_a_filtered_listing_pages_with_a_cursor_bound_to_its_filter(
    repository: JobRepository, stale: ManualClock, db_dsn: str
) -> None:
    wanted = [
        started(repository, stale, "daily", {"business_date": DATE, "run": n}).job_instance_id
        for n in range(5)
    ]
    started(repository, stale, "daily", {"business_date": "2026-12-01", "run": 9})
    seen: list[int] = []
    after: list[str] = []
    for _ in range(5):
        document = run_json(
            "instances",
            "daily",
            "--param",
            f"business_date={DATE}",
            "--limit",
            "2",
            *after,
            dsn=db_dsn,
        )
        seen += [item["id"] for item in document["items"]]
        if document["next"] is None:
            break
        after = ["--after", document["next"]]
    assert seen == sorted(wanted, reverse=True)
    first = run_json(
        "instances", "daily", "--param", f"business_date={DATE}", "--limit", "2", dsn=db_dsn
    )
    other = run(
        "instances",
        "daily",
        "--param",
        "business_date=2026-12-01",
        "--limit",
        "2",
        "--after",
        first["next"],
        dsn=db_dsn,
    )
    assert other.returncode == 2 and "CursorQueryMismatch" in other.stderr


def test_executions_and_unresolved_take_the_same_filter_across_jobs(
    repository: JobRepository, stale: ManualClock, db_dsn: str
) -> None:
    orders = started(repository, stale, "orders", {"business_date": DATE})
    ledger = started(repository, stale, "ledger", {"business_date": DATE, "book": 7})
    started(repository, stale, "orders", {"business_date": "2026-12-01"})
    with repository.begin() as uow:  # a second attempt of the orders instance
        execution = uow.executions.transition(
            orders.id,
            orders.version,
            LifecycleTransition.new(BatchStatus.STOPPED, stale.advance()),
        )
        restart = uow.executions.create(orders.job_instance_id)
        uow.commit()
    assert execution.status is BatchStatus.STOPPED
    filtered = run_json("executions", "--param", f"business_date={DATE}", dsn=db_dsn)["items"]
    assert [(e["id"], e["job_name"]) for e in filtered] == [
        (restart.id, "orders"),
        (ledger.id, "ledger"),
        (orders.id, "orders"),
    ]
    assert filtered[1]["parameters"] == [
        {"name": "book", "kind": "i64", "value": 7, "identifying": True},
        {"name": "business_date", "kind": "string", "value": DATE, "identifying": True},
    ]
    table = run("executions", "--param", f"business_date={DATE}", dsn=db_dsn).stdout
    assert f"book=7, business_date={DATE}" in table
    unresolved = run_json(
        "unresolved", "--older-than", "10m", "--param", f"business_date={DATE}", dsn=db_dsn
    )["items"]
    assert [e["id"] for e in unresolved] == [ledger.id, restart.id]  # the first one STOPPED
    both = ["--param", f"business_date={DATE}", "--param", "book=7"]
    [only] = run_json("unresolved", "--older-than", "10m", *both, dsn=db_dsn)["items"]
    assert only["id"] == ledger.id
    assert run_json("unresolved", "--older-than", "10m", "--param", "book=8", dsn=db_dsn) == {
        "items": [],
        "next": None,
    }


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (["instances", "kinds", "--param", "nokey"], 2, "ParameterFilterInvalid"),
        (["instances", "kinds", "--param", "=value"], 2, "ParameterFilterInvalid"),
        (["instances", "kinds", "--param", "v=1", "--param", "v=2"], 2, "ParameterFilterInvalid"),
        (
            ["instances", "kinds", *[f"--param=p{n}=1" for n in range(9)]],
            2,
            "ParameterFilterInvalid",
        ),
        (["instances", "kinds", "--param", "bad\tname=1"], 2, "ParameterFilterInvalid"),
        (["executions", "--param", "nokey"], 2, "ParameterFilterInvalid"),
        (["unresolved", "--param", "=x"], 2, "ParameterFilterInvalid"),
        (["executions"], 2, "CommandArgumentInvalid"),
        (["executions", "1", "--param", "v=1"], 2, "CommandArgumentInvalid"),
        (["instances", "nobody", "--param", "v=1"], 4, "JobNotFound"),
    ],
)
def test_a_bad_filter_is_one_line_naming_the_error(
    repository: JobRepository,
    stale: ManualClock,
    db_dsn: str,
    args: list[str],
    code: int,
    error: str,
) -> None:
    started(repository, stale, "kinds", {"v": "secret-value"})
    result = run(*args, dsn=db_dsn)
    assert result.returncode == code
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"pybatch: {error}: ")
    assert "secret-value" not in line


def test_control_characters_and_long_values_never_break_a_table(
    repository: JobRepository, stale: ManualClock, db_dsn: str
) -> None:
    hostile = "line1\nline2\ttab\x1b[31mred\u202eevil"
    long = "x" * 5000
    execution = started(repository, stale, "hostile", {"a": hostile, "b": long, "c": 1})
    expected = r"a=line1\nline2\ttab\x1b[31mred\u202eevil"
    for width in (None, "100", "250"):
        extra = {} if width is None else {"COLUMNS": width}
        for command in (["instances", "hostile"], ["executions", str(execution.job_instance_id)]):
            lines = run(*command, dsn=db_dsn, **extra).stdout.splitlines()
            rows = [line for line in lines if not line.startswith("columns left out")]
            assert len(rows) == 2, lines  # the header and the one row: no line broken
            assert all(ch.isprintable() for line in lines for ch in line), lines
            assert width is None or all(len(line) <= int(width) for line in lines), lines
            assert TIMESTAMP.search(rows[1]), rows
        pipe = run("instances", "hostile", dsn=db_dsn, **extra).stdout
        if width is None:  # nothing fitted into a pipe: the whole value, escaped, then b cut
            assert expected in pipe
            assert re.search(r"b=x{39}\u2026, c=1", pipe)
    shown = run("show", str(execution.id), dsn=db_dsn).stdout
    [parameters] = [line for line in shown.splitlines() if line.startswith("parameters")]
    assert expected in parameters and "b=" + "x" * 39 + "\u2026" in parameters
    document = run_json("instances", "hostile", dsn=db_dsn)["items"][0]["parameters"]
    assert [p["value"] for p in document] == [hostile, long, 1]
