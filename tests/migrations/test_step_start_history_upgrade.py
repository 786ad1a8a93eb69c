"""Upgrading to step starts that read only their instance's steps (migration 0023).

A run of the older package goes on while the migration replaces start_step_execution: it
starts its next step through the new function and completes, and an instance that failed
before the upgrade restarts after it from its failed step's checkpoint, within its start
limit. On a history where a step name is shared by thousands of executions among thousands
of other names, a step start then reads the node's steps of its own instance only, and so
does find_latest_flow_step_execution (a partitioned step's start) on its generic plan.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch import _migrator as migrator
from pybatch._statements import load_statements
from pybatch.errors import StartLimitExceeded
from pybatch.etl import Job, StepRun
from tests.conftest import plaintext_config
from tests.migrations.live_plan import migration_named
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to
from tests.support.plans import log_nested_plans

STEP_START_READS_ITS_INSTANCE = migration_named("step_start_reads_its_instance")
HISTORY = 2_000

#: HISTORY completed runs of job `skewed`, each with a step `load` and a step of its own name.
_HISTORY_SQL = """
WITH instance AS (
    INSERT INTO pybatch.job_instance (
        job_name, instance_key, identifying_parameters, created_at, last_attempt
    )
    SELECT
        'skewed', sha256(int8send(g)),
        jsonb_build_object('run', jsonb_build_object(
            'type', 'i64', 'identifying', true, 'value', g)),
        now() - interval '1 day', 1
    FROM generate_series(1, %(history)s) AS g
    RETURNING id, identifying_parameters, created_at
),
execution AS (
    INSERT INTO pybatch.job_execution (
        job_instance_id, definition_id, attempt, status, exit_code, parameters,
        context_format, context_schema, context_schema_version, context_payload,
        created_at, started_at, ended_at, updated_at, version
    )
    SELECT
        i.id, %(definition_id)s, 1, 'COMPLETED', 'COMPLETED', i.identifying_parameters,
        1, 'oxide_batch.empty.v1', 1, '{}'::jsonb, i.created_at,
        i.created_at + interval '1 second', i.created_at + interval '9 seconds',
        i.created_at + interval '9 seconds', 2
    FROM instance AS i
    RETURNING id, created_at
)
INSERT INTO pybatch.step_execution (
    job_execution_id, step_name, step_logical_id, status, exit_code,
    checkpoint_format, checkpoint_schema, checkpoint_schema_version, checkpoint_payload,
    context_format, context_schema, context_schema_version, context_payload,
    created_at, started_at, ended_at, updated_at, version
)
SELECT
    e.id, n.name, n.name, 'COMPLETED', 'COMPLETED',
    1, 'oxide_batch.empty.v1', 1, '{}'::jsonb, 1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
    e.created_at,
    e.created_at + interval '2 seconds', e.created_at + interval '8 seconds',
    e.created_at + interval '8 seconds', 2
FROM execution AS e
CROSS JOIN LATERAL (VALUES ('load'), ('own.' || e.id)) AS n (name)
"""
_START = "SELECT s.outcome FROM pybatch.start_step_execution(%s, NULL, %s, %s, 100, now()) AS s"
#: An EXPLAIN ANALYZE node that read step_execution, and how many rows it returned.
_STEP_SCAN = re.compile(r" on step_execution \w+ .*actual time=[\d.]+\.\.[\d.]+ rows=(\d+)")


def test_runs_of_the_older_package_go_on_and_restart_across_the_upgrade(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, STEP_START_READS_ITS_INSTANCE - 1)
    applied: list[int] = []

    def upgrade(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        applied.extend(m.version for m in migrator.migrate(config))  # while the run is live

    def fail_after_a_chunk(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=5, written=5, checkpoint={"offset": 5})
        raise RuntimeError("the source went away")

    with older_package(monkeypatch, STEP_START_READS_ITS_INSTANCE - 1):
        with JobRepository.connect(config) as old:
            with pytest.raises(RuntimeError), Job(old, "restarted", {}).launch() as failed:
                failed.step("load", fail_after_a_chunk, start_limit=2)
            with Job(old, "live", {}).launch() as live:
                live.step("extract", upgrade)
                live.step("load", lambda step: None)  # started by the new function
    assert applied == list(
        range(STEP_START_READS_ITS_INSTANCE, migrator.supported_schema_version() + 1)
    )
    assert live.execution.status.value == "COMPLETED"

    resumed_from: list[object] = []

    def resume_then_fail(step: StepRun) -> None:
        resumed_from.append(step.checkpoint)
        fail_after_a_chunk(step)

    with JobRepository.connect(config) as repository:
        with pytest.raises(RuntimeError), Job(repository, "restarted", {}).launch() as second:
            second.step("load", resume_then_fail, start_limit=2)
        with pytest.raises(StartLimitExceeded), Job(repository, "restarted", {}).launch() as third:
            third.step("load", lambda step: None, start_limit=2)
    assert resumed_from == [{"offset": 5}]
    assert (second.attempt, third.attempt) == (2, 3)


def test_a_step_start_reads_only_its_instances_steps_whatever_the_history_of_its_name(
    blank_database: str,
) -> None:
    with JobRepository.connect(load_history(blank_database)) as repository:
        with psycopg.connect(blank_database) as admin:
            with Job(repository, "skewed", {"run": -1}).launch() as live:
                execution_id = live.execution.id
                logged = log_nested_plans(admin, analyze=True)
                # Five starts plan the statements for their values, the sixth on; the seventh
                # starts a `load` of this instance, a name HISTORY other executions share.
                for node in ("n1", "n2", "n3", "n4", "n5", "n6"):
                    assert _outcome(admin, execution_id, node) == "created"
                logged.clear()
                assert _outcome(admin, execution_id, "load") == "created"
                admin.rollback()  # the created STARTING steps go; the live run ends as it runs
    plans = [plan for plan in logged if "step_logical_id = p_node_id" in plan]
    # The newest step of the node, the duplicate check, and the count for the start limit.
    assert len(plans) == 3, logged
    rows_read = [int(rows) for plan in plans for rows in _STEP_SCAN.findall(plan)]
    assert rows_read and max(rows_read) <= 1, plans


def test_a_partitioned_steps_start_finds_its_nodes_newest_step_by_probing_its_instance(
    blank_database: str,
) -> None:
    load_history(blank_database)
    latest = load_statements().find_latest_flow_step_execution
    with psycopg.connect(blank_database) as admin:
        newest = admin.execute(
            "SELECT e.job_instance_id FROM pybatch.step_execution AS s"
            " INNER JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id"
            " WHERE s.step_logical_id = 'load' ORDER BY s.id DESC LIMIT 1"
        ).fetchone()
        assert newest is not None
        values = {"job_instance_id": newest[0], "node_id": "load"}
        types = ", ".join(
            {"job_instance_id": "BIGINT", "node_id": "TEXT"}[n] for n in latest._order
        )
        admin.execute("SET plan_cache_mode = force_generic_plan")  # the plan psycopg comes to
        admin.execute(f"PREPARE latest ({types}) AS ".encode() + latest._numbered)
        placeholders = ", ".join(["%s"] * len(latest._order))
        # Values bound by the client: EXECUTE's arguments cannot be parameters of the EXPLAIN.
        explained = (
            psycopg.ClientCursor(admin)
            .execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE latest({placeholders})",
                [values[name] for name in latest._order],
            )
            .fetchone()
        )
    assert explained is not None
    plan = explained[0][0]["Plan"]
    step_scans = [node for node in _nodes(plan) if node.get("Relation Name") == "step_execution"]
    # The instance's one `load` step is found, and no scan read a step of another instance.
    assert plan["Actual Rows"] == 1
    assert step_scans and all(node["Actual Rows"] <= 1 for node in step_scans), plan


def load_history(dsn: str) -> ConnectionConfig:
    """Migrate, run job `skewed` once (registering it), load HISTORY runs of it, ANALYZE."""
    config = plaintext_config(dsn)
    migrator.migrate(config)
    with JobRepository.connect(config) as repository:
        with Job(repository, "skewed", {"run": 0}).launch() as registered:
            registered.step("load", lambda step: None)
    with psycopg.connect(dsn, autocommit=True) as admin:
        definition = admin.execute(
            "SELECT definition_id FROM pybatch.job_execution WHERE id = %s",
            (registered.execution.id,),
        ).fetchone()
        assert definition is not None
        loaded = admin.execute(_HISTORY_SQL, {"history": HISTORY, "definition_id": definition[0]})
        assert loaded.rowcount == 2 * HISTORY
        admin.execute("ANALYZE pybatch.job_execution, pybatch.step_execution")
    return config


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan node and every node below it."""
    return [node, *(below for child in node.get("Plans", []) for below in _nodes(child))]


def _outcome(admin: psycopg.Connection[Any], execution_id: int, node: str) -> object:
    row = admin.execute(_START, (execution_id, node, node)).fetchone()
    assert row is not None
    return row[0]
