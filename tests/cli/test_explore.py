"""The read commands, run as the installed `pybatch` console script against real PostgreSQL.

`pybatch jobs | instances | executions | show | unresolved` and `pybatch sql`: every command,
`--json` parsed back, the paging round trip, exit codes, the DSN settings, and no secret
in any output.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.statements import create_step

PYBATCH = str(Path(sys.executable).with_name("pybatch"))
SECRET = "hunter2-Zq9"


def test_the_console_script_is_the_installed_one() -> None:
    assert Path(PYBATCH).is_file()


def env_for(dsn: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYBATCH_")}
    env["PYBATCH_TLS"] = "plaintext"
    if dsn is not None:
        env["PYBATCH_DSN"] = dsn
    env.update(extra)
    return env


def run(*args: str, dsn: str | None, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYBATCH, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(dsn, **extra),
        check=False,
    )


def run_json(*args: str, dsn: str | None) -> Any:
    result = run(*args, "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def launch(
    repository: JobRepository, clock: ManualClock, name: str, run_id: int, *, fail: bool = False
) -> JobExecution:
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(
            JobInstanceKey(JobName(name), JobParameters.of({"run": run_id, "token": f"t{run_id}"}))
        ).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id,
            execution.version,
            LifecycleTransition.new(BatchStatus.STARTED, clock.advance()),
        )
        step = create_step(uow, execution.id, StepName("load"))
        if fail:
            failure = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(3))
            execution = uow.executions.transition(
                execution.id,
                execution.version,
                LifecycleTransition.failed(clock.advance(), failure),
            )
        uow.commit()
    assert step.id > 0
    return execution


@pytest.fixture
def seeded(repository: JobRepository, clock: ManualClock, db_dsn: str) -> dict[str, JobExecution]:
    clock.set(datetime.now(UTC) - timedelta(hours=2))
    executions = {}
    for index, name in enumerate(["alpha", "beta", "gamma", "delta", "epsilon"]):
        executions[name] = launch(repository, clock, name, index, fail=name == "beta")
    for run_id in range(10, 15):
        executions[f"alpha{run_id}"] = launch(repository, clock, "alpha", run_id)
    return executions


def test_jobs_lists_names_and_pages_round_trip(
    seeded: dict[str, JobExecution], db_dsn: str
) -> None:
    names: list[str] = []
    after: list[str] = []
    for _ in range(10):
        document = run_json("jobs", "--limit", "2", *after, dsn=db_dsn)
        names += [item["job_name"] for item in document["items"]]
        if document["next"] is None:
            break
        after = ["--after", document["next"]]
    assert names == sorted(["alpha", "beta", "gamma", "delta", "epsilon"])
    first = run_json("jobs", dsn=db_dsn)["items"][0]
    assert set(first) == {"job_name", "latest_execution_id", "latest_status", "latest_updated_at"}
    assert first["latest_status"] == "STARTED"


def test_instances_executions_show_and_unresolved(
    seeded: dict[str, JobExecution], db_dsn: str
) -> None:
    instances = run_json("instances", "alpha", dsn=db_dsn)["items"]
    assert len(instances) == 6
    assert [i["id"] for i in instances] == sorted((i["id"] for i in instances), reverse=True)
    assert instances[0]["parameters"] == [
        {"name": "run", "kind": "i64", "value": 14, "identifying": True},
        {"name": "token", "kind": "string", "value": "t14", "identifying": True},
    ]
    beta = seeded["beta"]
    executions = run_json("executions", str(beta.job_instance_id), dsn=db_dsn)["items"]
    assert [(e["id"], e["status"]) for e in executions] == [(beta.id, "FAILED")]
    shown = run_json("show", str(beta.id), dsn=db_dsn)
    assert shown["execution"]["failure"] == {"category": "USER_COMPONENT", "failure_id": 3}
    assert [s["step_name"] for s in shown["steps"]] == ["load"]
    assert shown["steps"][0]["checkpoint"]["kind"] == "checkpoint"
    assert shown["recovery_decisions"] == []
    unresolved = run_json("unresolved", "--older-than", "10m", dsn=db_dsn)["items"]
    assert beta.id not in {u["id"] for u in unresolved}
    assert seeded["alpha"].id in {u["id"] for u in unresolved}
    assert run_json("unresolved", "--older-than", "3h", dsn=db_dsn)["items"] == []

    table = run("show", str(beta.id), dsn=db_dsn)
    assert table.returncode == 0
    assert "FAILED" in table.stdout and "USER_COMPONENT" in table.stdout
    # Stored names from before pybatch's own naming read as pybatch's in the table.
    assert "pybatch default definition (manifest format" in table.stdout
    assert "empty v1" in table.stdout
    assert "__m1" not in table.stdout and "oxide_batch" not in table.stdout
    for command in (["jobs"], ["instances", "alpha"], ["executions", str(beta.job_instance_id)]):
        result = run(*command, dsn=db_dsn)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].split()[0] in {"JOB", "INSTANCE", "EXECUTION"}


def test_show_names_the_latest_attempt_a_restart_starts_from(
    seeded: dict[str, JobExecution], repository: JobRepository, db_dsn: str
) -> None:
    beta = seeded["beta"]
    shown = run_json("show", str(beta.id), dsn=db_dsn)
    assert shown["latest_attempt"] == {"execution_id": beta.id, "attempt": 1, "status": "FAILED"}
    assert re.search(r"^latest +this attempt$", run("show", str(beta.id), dsn=db_dsn).stdout, re.M)
    with repository.begin() as uow:
        restart = uow.executions.create(beta.job_instance_id)
        uow.commit()
    shown = run_json("show", str(beta.id), dsn=db_dsn)
    assert shown["latest_attempt"] == {
        "execution_id": restart.id,
        "attempt": 2,
        "status": "STARTING",
    }
    table = run("show", str(beta.id), dsn=db_dsn).stdout
    assert re.search(rf"^latest +attempt 2, execution {restart.id} \(STARTING\)$", table, re.M)
    assert re.search(
        r"^latest +this attempt$", run("show", str(restart.id), dsn=db_dsn).stdout, re.M
    )


def test_table_on_a_terminal_fits_its_width(seeded: dict[str, JobExecution], db_dsn: str) -> None:
    leader, follower = pty.openpty()
    env = env_for(db_dsn, COLUMNS="50", LINES="40")
    process = subprocess.Popen(
        [PYBATCH, "executions", str(seeded["alpha"].job_instance_id)],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert process.wait(timeout=60) == 0
    lines = b"".join(chunks).decode().splitlines()
    assert lines and all(len(line) <= 50 for line in lines), lines


LONG_JOB = "nightly_warehouse_load_of_every_regional_order_book_and_its_ledger_entries"
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
#: A status, code or number cut short: upper-case letters or digits right before an ellipsis.
CUT_CODE = re.compile(r"[A-Z0-9]\u2026")


@pytest.mark.parametrize("width", [80, 120, 200])
def test_tables_fit_the_width_and_never_cut_a_status_or_a_timestamp(
    seeded: dict[str, JobExecution],
    repository: JobRepository,
    clock: ManualClock,
    db_dsn: str,
    width: int,
) -> None:
    failed = launch(repository, clock, LONG_JOB, 1, fail=True)
    instance = str(failed.job_instance_id)
    for command in (
        ["jobs"],
        ["instances", LONG_JOB],
        ["executions", instance],
        ["unresolved", "--older-than", "10m"],
        ["show", str(failed.id)],
    ):
        result = run(*command, dsn=db_dsn, COLUMNS=str(width))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert all(len(line) <= width for line in lines), (command, width, lines)
        assert not CUT_CODE.search(result.stdout), (command, width, lines)
        assert TIMESTAMP.search(result.stdout), (command, width, lines)
    jobs = run("jobs", dsn=db_dsn, COLUMNS=str(width)).stdout.splitlines()
    [long_row] = [line for line in jobs if line.startswith(LONG_JOB[:8])]
    assert re.search(rf"  \d+ +FAILED +{TIMESTAMP.pattern}$", long_row), long_row  # whole
    assert (LONG_JOB in long_row) == (width == 200)
    assert ("\u2026" in long_row) == (width < 200)  # shortened with an ellipsis
    table = run("executions", instance, dsn=db_dsn, COLUMNS=str(width)).stdout.splitlines()
    header, row = table[0].split(), table[1]
    assert header[0] == "EXECUTION"
    assert "FAILED" in row.split() and len(TIMESTAMP.findall(row)) >= 2
    left_out = [line for line in table if line.startswith("columns left out: ")]
    if width == 200:
        assert (
            header
            == (
                "EXECUTION INSTANCE JOB PARAMETERS ATTEMPT STATUS EXIT READ WRITTEN COMMITS "
                "STARTED ENDED UPDATED OWNER"
            ).split()
        )
        assert left_out == []
    else:
        note = " ".join(table[table.index(left_out[0]) :])  # wrapped to the width
        assert len(left_out) == 1 and "OWNER" in note
        assert note.endswith("(widen the terminal or use --json)")
        assert "UPDATED" in header and "STATUS" in header


def test_into_a_pipe_without_columns_nothing_is_left_out(
    seeded: dict[str, JobExecution], repository: JobRepository, clock: ManualClock, db_dsn: str
) -> None:
    failed = launch(repository, clock, LONG_JOB, 1, fail=True)
    table = run("executions", str(failed.job_instance_id), dsn=db_dsn).stdout.splitlines()
    assert len(table) == 2 and table[0].split()[-1] == "OWNER" and LONG_JOB in table[1]


def test_exit_codes(seeded: dict[str, JobExecution], db_dsn: str, tmp_path: Path) -> None:
    assert run("show", "999999", dsn=db_dsn).returncode == 4
    missing = run("executions", "999999", dsn=db_dsn)
    assert missing.returncode == 4
    assert missing.stderr.strip() == (
        "pybatch: JobInstanceNotFound: job instance 999999 was not found"
    )
    for output in ([], ["--json"]):
        no_job = run("instances", "nobody", *output, dsn=db_dsn)
        assert no_job.returncode == 4
        assert no_job.stdout == ""
        assert no_job.stderr.strip() == (
            "pybatch: JobNotFound: job nobody was not found (no instance has that name)"
        )
    assert run("jobs", "--limit", "0", dsn=db_dsn).returncode == 2
    assert run("jobs", "--after", "nothex", dsn=db_dsn).returncode == 2
    assert run("unresolved", "--older-than", "30s", dsn=db_dsn).returncode == 2
    assert run("jobs", "--bogus", dsn=db_dsn).returncode == 2
    assert run("jobs", dsn=None).returncode == 2  # no DSN configured
    unreachable = "host=127.0.0.1 port=1 dbname=x user=x"
    assert run("jobs", dsn=unreachable).returncode == 3
    cursor = run_json("instances", "alpha", "--limit", "1", dsn=db_dsn)["next"]
    mismatch = run("instances", "beta", "--limit", "1", "--after", cursor, dsn=db_dsn)
    assert mismatch.returncode == 2
    assert "CursorQueryMismatch" in mismatch.stderr


def test_permission_denied_is_exit_6(
    seeded: dict[str, JobExecution], db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("DROP ROLE IF EXISTS pybatch_nobody")
    admin.execute("CREATE ROLE pybatch_nobody LOGIN")
    try:
        dsn = psycopg.conninfo.make_conninfo(db_dsn, user="pybatch_nobody")
        result = run("jobs", dsn=dsn)
        assert result.returncode == 6, result.stderr
        assert "42501" in result.stderr
    finally:
        admin.execute("DROP ROLE pybatch_nobody")


def test_dsn_file_and_dsn_flag_never_print_secrets(
    seeded: dict[str, JobExecution], db_dsn: str, tmp_path: Path
) -> None:
    with_password = f"{db_dsn} password={SECRET}"
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(with_password + "\n")
    dsn_file.chmod(0o644)
    refused = run("jobs", "--dsn-file", str(dsn_file), dsn=None)
    assert refused.returncode == 2
    assert "0600" in refused.stderr
    dsn_file.chmod(0o600)
    ok = run("jobs", "--dsn-file", str(dsn_file), "--json", dsn=None)
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == ""
    flagged = run("jobs", "--dsn", with_password, "--json", dsn=None)
    assert flagged.returncode == 0
    assert "/proc/PID/cmdline" in flagged.stderr
    bad = run("jobs", "--dsn", f"host=127.0.0.1 port=1 password={SECRET}", dsn=None)
    assert bad.returncode == 3
    for result in (refused, ok, flagged, bad, run("show", "999999", dsn=with_password)):
        assert SECRET not in result.stdout + result.stderr
    everything = run_json("show", str(seeded["alpha"].id), dsn=with_password)
    assert SECRET not in json.dumps(everything)
    assert SECRET not in run("instances", "alpha", dsn=db_dsn).stdout


def test_sql_list_show_explain(db_dsn: str) -> None:
    listing = run_json("sql", "list", dsn=None)["items"]
    names = {item["name"]: item for item in listing}
    assert names["explore_instances"]["file"] == "explorer.sql"
    assert names["explore_instances"]["tables_read"] == ["job_instance"]
    shown = run("sql", "show", "explore_instances", dsn=None)
    assert shown.returncode == 0
    assert shown.stdout.startswith("-- pybatch explorer.sql explore_instances\n")
    assert "%(job_name)s" in shown.stdout
    assert run("sql", "show", "no_such_statement", dsn=None).returncode == 4
    for name in ("explore_instances", "insert_job_instance_if_absent", "update_step_chunk_commit"):
        plan = run("sql", "explain", name, dsn=db_dsn)
        assert plan.returncode == 0, plan.stderr
        assert "cost=" in plan.stdout


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly() -> None:
    """`pybatch sql list | head`: no BrokenPipeError traceback, exit 0."""
    reader, writer = os.pipe()
    # A one-page pipe: the listing (tens of kB) cannot all be written before the reader closes.
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(
        [PYBATCH, "sql", "list"], stdout=writer, stderr=subprocess.PIPE, env=env_for(None)
    )
    os.close(writer)
    with os.fdopen(reader, "rb") as output:
        first = output.readline()
    _, stderr = process.communicate(timeout=60)
    assert first.startswith(b"append_audit_link ")
    assert stderr == b""
    assert process.returncode == 0


def test_show_counts_rolled_back_chunks(repository: JobRepository, db_dsn: str) -> None:
    from pybatch.etl import Job, StepRun

    def rolls_back_once(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.rollback()
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})

    with Job(repository, "rollbacks", {"day": "2026-11-30"}).launch() as launched:
        launched.step("load", rolls_back_once)
    shown = run_json("show", str(launched.execution.id), dsn=db_dsn)
    counts = shown["steps"][0]["counts"]
    assert (counts["commits"], counts["rollbacks"]) == (1, 1)
    table = run("show", str(launched.execution.id), dsn=db_dsn).stdout
    header, row = [
        line.split() for line in table.splitlines() if "load" in line or "ROLLBACKS" in line
    ][:2]
    assert row[header.index("ROLLBACKS")] == "1"


def test_skips_lists_the_skipped_items_page_by_page_and_show_counts_them(
    repository: JobRepository, admin: psycopg.Connection[Any], db_dsn: str
) -> None:
    from pybatch.etl import Chunk, Job, StepRun

    admin.execute("CREATE TABLE public.target (id BIGINT PRIMARY KEY CHECK (id % 10 <> 3))")

    def write(chunk: Chunk, items: list[int]) -> None:
        chunk.copy("COPY public.target (id) FROM STDIN", [(item,) for item in items])

    def load(step: StepRun) -> None:
        step.load(
            lambda position: range(position, 40),
            write,
            chunk_size=16,
            key=lambda item: f"order-{item}",
            skip_limit=10,
        )

    with Job(repository, "skipping", {"day": "2026-11-30"}).launch() as launched:
        launched.step("load", load)
    execution = str(launched.execution.id)
    items: list[dict[str, Any]] = []
    after: list[str] = []
    for _ in range(5):
        document = run_json("skips", execution, "--limit", "2", *after, dsn=db_dsn)
        items += document["items"]
        if document["next"] is None:
            break
        after = ["--after", document["next"]]
    assert [(i["item_position"], i["item_key"], i["sqlstate"]) for i in items] == [
        (3, "order-3", "23514"),
        (13, "order-13", "23514"),
        (23, "order-23", "23514"),
        (33, "order-33", "23514"),
    ]
    assert items[0]["table"] == "target" and items[0]["step_name"] == "load"
    table = run("skips", execution, dsn=db_dsn)
    assert table.returncode == 0, table.stderr
    header, *rows = [line.split() for line in table.stdout.splitlines()]
    assert header[:4] == ["SKIP", "STEP", "POSITION", "KEY"]
    assert [row[3] for row in rows] == ["3", "13", "23", "33"]  # "load (id)" is two words
    shown = run_json("show", execution, dsn=db_dsn)
    assert shown["steps"][0]["skip_count"] == 4
    step_id = str(shown["steps"][0]["id"])
    shown_table = run("show", execution, dsn=db_dsn).stdout.splitlines()
    step_header = next(line.split() for line in shown_table if line.startswith("STEP "))
    step_row = next(line.split() for line in shown_table if line.startswith(step_id + " "))
    assert step_row[step_header.index("SKIPS")] == "4"
    assert run("skips", "999999", dsn=db_dsn).returncode != 0
