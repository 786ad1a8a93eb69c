"""The read commands on a hot standby: operators can point them at a replica.

Executions are written on the primary; once the standby has replayed them, the installed
`pybatch` console script pointed at the standby lists and shows them, verifies the audit
chain and explains statements. A write command against the standby fails with one line.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pybatch import JobRepository
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
    assert result.returncode != 0
    # stop names its operation id first (to retry it), then the one error line
    errors = [line for line in result.stderr.splitlines() if line.startswith("pybatch: ")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]), result.stderr
    assert "Traceback" not in result.stderr
