"""A failed step and run record why they failed; `pybatch show` and `--json` say it.

Real jobs run as scripts in their own process: one whose step raises the author's exception
(its message quoting a job parameter and a connection URI that must not be stored), one
whose business INSERT violates a CHECK constraint. The reasons are read back through the
installed console script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import psycopg

from tests.cli.test_explore import env_for, run

SECRET = "s3cret-Kq7"

JOB = """
import sys
from pybatch import ConnectionConfig, JobRepository, TlsMode
from pybatch.etl import Job

def user_error(step):
    raise ValueError(
        "source postgres://etl:" + sys.argv[2] + "@db/x refused token " + sys.argv[2]
    )

def bad_insert(step):
    with step.chunk() as chunk:
        chunk.execute("INSERT INTO public.amounts VALUES (1, -5)")
        chunk.commit(read=1, written=1, checkpoint={"offset": 1})

work = {"user_error": user_error, "bad_insert": bad_insert}[sys.argv[1]]
config = ConnectionConfig(dsn=sys.argv[3], tls_mode=TlsMode.PLAINTEXT)
with JobRepository.connect(config) as repository:
    with Job(repository, sys.argv[1], {"token": sys.argv[2]}).launch() as job:
        print(job.execution.id, flush=True)
        job.step("load", work)
"""


def run_failing_job(kind: str, dsn: str) -> tuple[int, str]:
    """Run the job script to its failure; (its execution id, its stderr)."""
    script = textwrap.dedent(JOB)
    result = subprocess.run(
        [sys.executable, "-c", script, kind, SECRET, dsn],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(None),
        check=False,
    )
    assert result.returncode == 1, result.stderr
    return int(result.stdout.split()[0]), result.stderr


def show(execution_id: int, dsn: str) -> tuple[str, dict[str, Any]]:
    text = run("show", str(execution_id), dsn=dsn)
    assert text.returncode == 0, text.stderr
    document = run("show", str(execution_id), "--json", dsn=dsn)
    assert document.returncode == 0, document.stderr
    return text.stdout, json.loads(document.stdout)


def test_a_user_exception_is_recorded_with_its_class_and_a_redacted_message(
    db_dsn: str,
) -> None:
    execution_id, stderr = run_failing_job("user_error", db_dsn)
    assert "couldn't stop thread" not in stderr  # no shutdown noise around the error
    text, document = show(execution_id, db_dsn)
    (step,) = document["steps"]
    for reason in (document["execution"]["failure_reason"], step["failure_reason"]):
        assert reason["error_class"] == "ValueError"
        assert reason["message"] == ("source postgres://<redacted>@db/x refused token <redacted>")
        assert reason["sqlstate"] is None and reason["constraint"] is None
    assert "reason" in text and "ValueError: source postgres://<redacted>@db/x" in text
    assert f"step {step['id']} failed: ValueError" in text
    # The identifying value is shown as the instance's parameter, and in no failure reason.
    assert document["execution"].pop("parameters") == [
        {"name": "token", "kind": "string", "value": SECRET, "identifying": True}
    ]
    assert f"parameters  token={SECRET}" in text
    text = "\n".join(line for line in text.splitlines() if not line.startswith("parameters"))
    assert SECRET not in text and SECRET not in json.dumps(document)


def test_a_rejected_business_insert_records_its_sqlstate_constraint_table_and_column(
    db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute(
        "CREATE TABLE public.amounts (id bigint PRIMARY KEY,"
        " amount int CONSTRAINT amounts_amount_positive CHECK (amount > 0))"
    )
    execution_id, stderr = run_failing_job("bad_insert", db_dsn)
    assert "couldn't stop thread" not in stderr
    text, document = show(execution_id, db_dsn)
    (step,) = document["steps"]
    expected = {
        "error_class": "pybatch.errors.Rejected",
        "message": "business statement was rejected (SQLSTATE 23514): "
        "constraint amounts_amount_positive, table amounts",
        "sqlstate": "23514",
        "constraint": "amounts_amount_positive",
        "table": "amounts",
        "column": None,
    }
    assert step["failure_reason"] == expected
    assert document["execution"]["failure_reason"] == expected
    assert "constraint amounts_amount_positive, table amounts" in text
    assert "SQLSTATE 23514" in text
