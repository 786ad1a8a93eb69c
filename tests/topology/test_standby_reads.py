"""The read commands on a hot standby: operators can point them at a replica.

Executions are written on the primary; once the standby has replayed them, the installed
`pybatch` console script pointed at the standby lists and shows them, verifies the audit
chain and explains statements. A write command against the standby fails with one line.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pybatch import JobRepository, _sqlstate
from pybatch.errors import ReadOnlyServer
from pybatch.etl import Job
from tests.cli.test_explore import launch, run, run_json
from tests.conftest import plaintext_config
from tests.support.clock import ManualClock
from tests.support.standby import StreamingPair

pytestmark = pytest.mark.crash


def test_read_commands_answer_from_a_hot_standby(standby_pair: StreamingPair) -> None:
    clock = ManualClock()
    clock.set(datetime.now(UTC) - timedelta(hours=2))
    with JobRepository.connect(plaintext_config(standby_pair.primary.dsn()), clock=clock) as repo:
        failed = launch(repo, clock, "beta", 1, fail=True)
        running = launch(repo, clock, "alpha", 2)
    standby_pair.wait_for_replay()
    dsn = standby_pair.standby.dsn()

    assert [j["job_name"] for j in run_json("jobs", dsn=dsn)["items"]] == ["alpha", "beta"]
    instances = run_json("instances", "beta", dsn=dsn)["items"]
    assert [i["id"] for i in instances] == [failed.job_instance_id]
    executions = run_json("executions", str(failed.job_instance_id), dsn=dsn)["items"]
    assert [(e["id"], e["status"]) for e in executions] == [(failed.id, "FAILED")]
    shown = run_json("show", str(failed.id), dsn=dsn)
    assert shown["execution"]["failure"] == {"category": "USER_COMPONENT", "failure_id": 3}
    unresolved = run_json("unresolved", "--older-than", "10m", dsn=dsn)["items"]
    assert [u["id"] for u in unresolved] == [running.id]
    verified = run("audit", "verify", dsn=dsn)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip(), "audit verify printed nothing"
    plan = run("sql", "explain", "explore_instances", dsn=dsn)
    assert plan.returncode == 0, plan.stderr
    assert "cost=" in plan.stdout


def test_a_write_command_on_a_standby_fails_with_one_line(standby_pair: StreamingPair) -> None:
    result = run("stop", "1", dsn=standby_pair.standby.dsn())
    # Exit 7, not the "unavailable, retry" 3: the same server will never take the write.
    assert result.returncode == 7, result.stderr
    assert "pybatch: ReadOnlyServer: the server is read-only" in result.stderr
    # stop names its operation id first (to retry it), then the one error line
    errors = [line for line in result.stderr.splitlines() if line.startswith("pybatch: ")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]), result.stderr
    assert "Traceback" not in result.stderr


def test_a_launch_on_a_standby_is_refused_as_a_read_only_server(
    standby_pair: StreamingPair,
) -> None:
    with JobRepository.connect(plaintext_config(standby_pair.standby.dsn())) as repository:
        with pytest.raises(ReadOnlyServer) as refused:
            Job(repository, "on_a_standby", {"day": "1"}).launch()
    assert refused.value.sqlstate in {"25006", "0A000"}  # BEGIN READ WRITE in recovery: 0A000


def test_a_read_write_transaction_on_a_standby_is_a_read_only_server(
    standby_pair: StreamingPair,
) -> None:
    """0A000 from BEGIN READ WRITE in recovery, told apart from the cached-plan 0A000."""
    with psycopg.connect(standby_pair.standby.dsn()) as conn:
        conn.read_only = False
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT 1")
    assert raised.value.sqlstate == "0A000"
    translated = _sqlstate.translate(raised.value)
    assert isinstance(translated, ReadOnlyServer) and translated.sqlstate == "0A000"
