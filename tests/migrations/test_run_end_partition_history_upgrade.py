"""Upgrading to a run's end that probes only its own steps' partitions (migration 0025).

A plan that the older package started has a partition claimed when the migration replaces
end_unfinished_steps; its run then fails, and the new function releases that partition, so the
restart claims it again and completes the plan. On a history of partitioned runs, where the
generic estimate of "the steps of one execution" is hundreds of worker steps, a run's end then
reads the partitions of its own steps only, not every partition ever planned.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.etl import Job, PartitionRun
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.live_plan import (
    migrate_to,
    migration_named,
    older_package,
    start_plan,
    work_off,
)
from tests.support.plans import log_nested_plans

OWN_PARTITIONS = migration_named("run_end_reads_its_own_partitions")
#: Completed partitioned runs in the history, the partitions (worker steps) of each, and the
#: completed one-step runs around them: most executions have a step or two, a few have many.
RUNS, WIDTH, ONE_STEP_RUNS = 30, 1000, 20_000

#: Completed runs `first`..`last` of job `history`, each with a step `load`, partitioned into
#: `width` partitions (each with its worker step `load#ordinal.1`) when `width` is not 0.
_HISTORY_SQL = """
WITH instance AS (
    INSERT INTO pybatch.job_instance (
        job_name, instance_key, identifying_parameters, created_at, last_attempt
    )
    SELECT
        'history', sha256(int8send(g)),
        jsonb_build_object('run', jsonb_build_object(
            'type', 'i64', 'identifying', true, 'value', g)),
        now() - interval '1 day', 1
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
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
),
step AS (
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
    CROSS JOIN LATERAL (
        SELECT 'load'
        UNION ALL
        SELECT 'load#' || w || '.1' FROM generate_series(1, %(width)s::int) AS w
    ) AS n (name)
    RETURNING id, job_execution_id, step_name
)
INSERT INTO pybatch.step_partition (
    step_execution_id, worker_step_execution_id, partition_key, partition_ordinal, status,
    exit_code, context_format, context_schema, context_schema_version, context_payload,
    context_checksum, version
)
SELECT
    parent.id, worker.id, 'p' || o.ordinal, o.ordinal, 'COMPLETED', 'COMPLETED',
    1, 'oxide_batch.empty.v1', 1, '{}'::jsonb, sha256('{}'::bytea), 2
FROM step AS worker
CROSS JOIN LATERAL (
    SELECT split_part(split_part(worker.step_name, '#', 2), '.', 1)::int AS ordinal
) AS o
INNER JOIN step AS parent
    ON parent.job_execution_id = worker.job_execution_id AND parent.step_name = 'load'
WHERE worker.step_name <> 'load'
"""
#: A plan node that read step_partition, and the rows it returned per loop and its loops.
_PARTITION_SCAN = re.compile(
    r" on step_partition \w+ .*actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=(\d+)"
)
_REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck): (\d+)")


def load_history(dsn: str) -> None:
    """RUNS partitioned runs (RUNS * WIDTH partitions), ONE_STEP_RUNS one-step runs, ANALYZE."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        definition = admin.execute(
            "SELECT definition_id FROM pybatch.job_execution ORDER BY id LIMIT 1"
        ).fetchone()
        assert definition is not None
        for first, last, width in ((1, RUNS, WIDTH), (RUNS + 1, RUNS + ONE_STEP_RUNS, 0)):
            values = {"first": first, "last": last, "width": width, "definition_id": definition[0]}
            loaded = admin.execute(_HISTORY_SQL, values)
            assert loaded.rowcount == (last - first + 1) * width
        admin.execute("ANALYZE pybatch.job_execution, pybatch.step_execution")
        admin.execute("ANALYZE pybatch.step_partition")


def partition_rows_read(plans: list[str]) -> int:
    """Rows the logged plans read from step_partition: returned, or removed by a filter."""
    read = 0
    for plan in plans:
        scan: tuple[int, int] | None = None  # the rows and loops of the node being read
        for line in plan.splitlines():
            if "->" in line or "Scan" in line:  # a new node: step_partition's or another's
                found = _PARTITION_SCAN.search(line)
                scan = (int(found[1]), int(found[2])) if found else None
                read += scan[0] * scan[1] if scan else 0
            elif scan and (removed := _REMOVED.search(line)):
                read += int(removed[1]) * scan[1]  # shown per loop, as rows are
    return read


def noop(partition: PartitionRun) -> None:
    """A partition with nothing to do."""


def test_a_plan_live_across_the_upgrade_is_released_when_its_run_fails_and_completes_on_restart(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    with older_package(config, OWN_PARTITIONS - 1, monkeypatch) as old:
        plan = start_plan(old, "1", ["a", "b", "c"])
        migrate_to(config, OWN_PARTITIONS)
        with pytest.raises(RuntimeError), plan.run:
            raise RuntimeError("the coordinator failed with partition a claimed")
    with psycopg.connect(blank_database) as admin:
        released = admin.execute(
            "SELECT partition_key, status, worker_owner_token FROM pybatch.step_partition"
            " WHERE step_execution_id = %s ORDER BY partition_ordinal",
            (plan.parent.id,),
        ).fetchall()
    # The new function released the claimed partition with its run; the others were never claimed.
    assert released == [("a", "FAILED", None), ("b", "STARTING", None), ("c", "STARTING", None)]

    with JobRepository.connect(config) as repository:
        with Job(repository, "fanout", {"day": "1"}).launch() as again:
            outcome = again.partitioned_step("load", ["a", "b", "c"], noop, workers=1)
    assert again.attempt == 2 and again.execution.status is BatchStatus.COMPLETED
    assert outcome.step.status is BatchStatus.COMPLETED
    with psycopg.connect(blank_database) as admin:
        restarted = admin.execute(
            "SELECT partition_key, status FROM pybatch.step_partition"
            " WHERE step_execution_id = %s ORDER BY partition_ordinal",
            (outcome.step.id,),
        ).fetchall()
    assert restarted == [("a", "COMPLETED"), ("b", "COMPLETED"), ("c", "COMPLETED")]


def test_a_run_end_reads_only_its_own_steps_partitions_whatever_the_history(
    blank_database: str,
) -> None:
    config = plaintext_config(blank_database)
    migrator.migrate(config)
    with JobRepository.connect(config) as repository:
        with Job(repository, "history", {"run": 0}).launch() as registered:
            registered.step("load", lambda step: None)
    load_history(blank_database)
    with JobRepository.connect(config) as repository:
        plan = start_plan(repository, "2", ["a", "b", "c"])
        with psycopg.connect(blank_database) as admin:
            logged = log_nested_plans(admin, analyze=True)
            ended = admin.execute(
                "SELECT pybatch.end_unfinished_steps(%s, 'FAILED', 'USER_COMPONENT', now())",
                (plan.run.execution.id,),
            ).fetchone()
            released = admin.execute(
                "SELECT partition_key FROM pybatch.step_partition"
                " WHERE step_execution_id = %s AND status = 'FAILED'",
                (plan.parent.id,),
            ).fetchall()
            admin.rollback()  # the plan goes on as it was
        worked = work_off(config, plan)
    # The parent and the claimed partition's worker ended; partition a was released.
    assert ended == (2,) and released == [("a",)]
    plans = [plan for plan in logged if "released AS" in plan]
    assert len(plans) == 1, logged
    # Its own plan's three partitions, found through their parent and updated by id (each read
    # at most twice); the history has RUNS * WIDTH partitions.
    assert partition_rows_read(plans) <= 2 * 3, plans
    assert worked == (["a", "b", "c"], BatchStatus.COMPLETED, [])
