"""Explorer page latency at 1,000,000 executions against 10,000, with the plan of every query.

Why: an operator pages through years of history with `pybatch jobs / instances / executions
/ show / unresolved`, with or without `--param NAME=VALUE`; every page must cost the same
whatever the size of the history (keyset pagination over an index, never a scan of a history
table), so a repository with a million executions answers as fast as a new one.

    python -m bench.explorer [--dsn DSN] [--executions 1000000] [--small 10000] [--names 1000]

Method:

* two scratch databases on one server, `large` and `small`, migrated by pybatch; history is
  generated server-side with INSERT ... SELECT generate_series: `--names` job names, one
  instance per two executions (attempt 1 FAILED, attempt 2 COMPLETED), one step per
  execution, and every 100th instance gets a recovery decision, a flow decision, an
  operator request and a two-partition plan; each instance has three identifying
  parameters, `run` (an i64, one instance each), `business_date` (a string shared by 100
  consecutive instances, so by every job that ran that day) and `region` (`eu`, `us` or
  `apac`: a third of every job's instances each), and its executions carry the copy; then
  VACUUM ANALYZE and a CHECKPOINT;
* both sizes have the same page contents, so that only the size of the history differs:
  all `--names` names exist in both; the names whose instances are walked hold 500
  instances each in both (in `small` the instances beyond the first of each name go to 10
  "hot" names); and 500 executions are unresolved (attempt 2 still STARTED, two hours old)
  in both;
* every explorer query is walked to its end through `pybatch._explorer.JobExplorer` (a page
  is one call: its read-only transaction, ceiling, parent check, rows and decoding),
  alternating the two databases query by query so machine noise falls on both alike;
* the filtered pages (`*_by_*`): instances of a job by run (one match), by date (one or a
  few per job) and by region (a third of the job); executions of every job by run and by
  date; unresolved executions by date;
* printed: p50, p95 and p99 page latency per query and database, the ratio of the p50s
  (target <= 1.3), the p50 target (<= 5 ms at the large size), the time and size of
  building the parameter index (migration 0012) over the large history, and EXPLAIN
  (ANALYZE, BUFFERS) of every explorer statement on the large database with the parameters
  of a real page (the filtered ones with a selective and an unselective filter), flagging
  any sequential scan of a history table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench._server import admin_connect, postgres_server, scratch_database
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch._codecs._jsonb import to_jsonb
from pybatch._explorer import JobExplorer
from pybatch._resources import migrations_dir
from pybatch._statements import load_statements
from pybatch.values.explorer import Cursor, Page, PageSize, ParameterFilter

HISTORY_TABLES = (
    "job_instance",
    "job_execution",
    "step_execution",
    "recovery_decision",
    "flow_decision",
    "operator_request",
    "step_partition",
)
SAMPLES = 200
PAGE = PageSize(50)

GENERATE = [
    """
    INSERT INTO pybatch.job_definition (id, job_name, definition_revision, manifest_format,
        manifest_digest, manifest, registered_at)
    SELECT n, 'job_' || lpad(n::text, 4, '0'), 'legacy', 1,
        sha256(convert_to('job_' || n, 'UTF8')), '{}'::jsonb, now()
    FROM generate_series(1, %(names)s) AS n
    """,
    """
    INSERT INTO pybatch.job_instance (id, job_name, instance_key, identifying_parameters,
        created_at, last_attempt)
    SELECT i,
        'job_' || lpad((CASE WHEN i <= %(names)s THEN i ELSE (i - 1) %% %(hot)s + 1 END)::text,
            4, '0'),
        sha256(convert_to('instance ' || i, 'UTF8')),
        jsonb_build_object(
            'run', jsonb_build_object('type', 'i64', 'identifying', true, 'value', i),
            'business_date', jsonb_build_object('type', 'string', 'identifying', true,
                'value', to_char(date '2000-01-01' + (i - 1) / 100, 'YYYY-MM-DD')),
            'region', jsonb_build_object('type', 'string', 'identifying', true,
                'value', (ARRAY['eu', 'us', 'apac'])[i %% 3 + 1])),
        timestamptz '2024-01-01' + i * interval '1 second', 2
    FROM generate_series(1, %(instances)s) AS i
    """,
    """
    INSERT INTO pybatch.job_execution (id, job_instance_id, definition_id,
        restart_of_execution_id, attempt, status, exit_code, parameters, context_format,
        context_schema, context_schema_version, context_payload, failure_category, failure_id,
        created_at, started_at, ended_at, updated_at, version)
    SELECT 2 * i - 2 + a, i,
        (CASE WHEN i <= %(names)s THEN i ELSE (i - 1) %% %(hot)s + 1 END),
        CASE WHEN a = 2 THEN 2 * i - 1 END, a,
        CASE WHEN a = 1 THEN 'FAILED' WHEN i %% %(unresolved_every)s = 0 THEN 'STARTED'
            ELSE 'COMPLETED' END,
        CASE WHEN a = 1 THEN 'FAILED' WHEN i %% %(unresolved_every)s = 0 THEN 'UNKNOWN'
            ELSE 'COMPLETED' END,
        (SELECT ji.identifying_parameters FROM pybatch.job_instance AS ji WHERE ji.id = i),
        1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
        CASE WHEN a = 1 THEN 'USER_COMPONENT' END, CASE WHEN a = 1 THEN 1 END,
        t, t, CASE WHEN a = 1 OR i %% %(unresolved_every)s <> 0 THEN t + interval '1 minute' END,
        t + interval '1 minute', 3
    FROM generate_series(1, %(instances)s) AS i,
        generate_series(1, 2) AS a,
        LATERAL (SELECT now() - interval '2 hours' - (%(instances)s - i) * interval '10 ms'
            + a * interval '1 second' AS t) AS times
    """,
    """
    INSERT INTO pybatch.step_execution (id, job_execution_id, step_name, step_logical_id,
        status, exit_code, read_count, processed_count, write_count, commit_count,
        checkpoint_format, checkpoint_schema, checkpoint_schema_version, checkpoint_payload,
        context_format, context_schema, context_schema_version, context_payload,
        created_at, started_at, ended_at, updated_at, version)
    SELECT e.id, e.id, 'load', 'load',
        CASE WHEN e.status = 'STARTED' THEN 'STARTED' ELSE 'COMPLETED' END,
        CASE WHEN e.status = 'STARTED' THEN 'UNKNOWN' ELSE 'COMPLETED' END,
        1000, 1000, 1000, 10,
        1, 'pybatch.etl.v1', 1, jsonb_build_object('offset', 1000),
        1, 'pybatch.etl.v1', 1, '{}'::jsonb,
        e.created_at, e.started_at, e.ended_at, e.updated_at, 12
    FROM pybatch.job_execution AS e
    """,
    """
    INSERT INTO pybatch.recovery_decision (job_execution_id, execution_version, prior_status,
        resulting_status, reason_code, operator_reference, evidence_digest, decided_at)
    SELECT 2 * i - 1, 2, 'STARTED', 'FAILED', 'OWNER_LOST', 'pybatch.etl',
        sha256(convert_to('evidence ' || i, 'UTF8')), now() - interval '3 hours'
    FROM generate_series(100, %(instances)s, 100) AS i
    """,
    """
    INSERT INTO pybatch.flow_decision (job_execution_id, sequence, source_node_id,
        observed_outcome, target_node_id, transition_kind, plan_fingerprint, input_digest,
        decided_at)
    SELECT 2 * i, 1, 'load', 'COMPLETED', 'report', 'STEP_EXIT',
        sha256(convert_to('plan', 'UTF8')), sha256(convert_to('input ' || i, 'UTF8')),
        now() - interval '3 hours'
    FROM generate_series(100, %(instances)s, 100) AS i
    """,
    """
    INSERT INTO pybatch.operator_request (job_instance_id, job_execution_id, action,
        authorization_class, operation_id, actor_ref, request_digest, observed_version,
        prior_status, result_status, outcome_class, requested_at)
    SELECT i, 2 * i, 'STOP', 'LIFECYCLE', 'op-' || i, 'bench',
        sha256(convert_to('request ' || i, 'UTF8')), 2, 'STARTED', 'STOPPING', 'APPLIED',
        now() - interval '3 hours'
    FROM generate_series(100, %(instances)s, 100) AS i
    """,
    """
    INSERT INTO pybatch.step_partition (step_execution_id, partition_key, partition_ordinal,
        status, context_format, context_schema, context_schema_version, context_payload,
        context_checksum)
    SELECT 2 * i, 'p' || o, o, 'STARTING', 1, 'p', 1, '{}'::jsonb, sha256(''::bytea)
    FROM generate_series(100, %(instances)s, 100) AS i, generate_series(1, 2) AS o
    """,
]


def shape(executions: int, names: int, large: int) -> dict[str, int]:
    """Generation parameters: the same page contents at every size (see the docstring)."""
    instances = executions // 2
    return {
        "names": names,
        "instances": instances,
        # the walked names hold as many instances at every size
        "hot": max(1, names * executions // large),
        # 500 unresolved executions at every size
        "unresolved_every": max(1, instances // 500),
    }


def populate(dsn: str, params: dict[str, int]) -> None:
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    with admin_connect(dsn) as conn:
        for statement in GENERATE:
            conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def walk(fetch: Callable[[Cursor | None], Page[Any]]) -> list[float]:
    """Page to the end; the latency of every page in seconds."""
    latencies = []
    cursor: Cursor | None = None
    while True:
        started = time.perf_counter()
        page = fetch(cursor)
        latencies.append(time.perf_counter() - started)
        cursor = page.next_cursor
        if cursor is None:
            return latencies


def single(call: Callable[[], object]) -> list[float]:
    started = time.perf_counter()
    call()
    return [time.perf_counter() - started]


def job_of(instance: int, params: dict[str, int]) -> str:
    """The job name the generator gave `instance`."""
    names = params["names"]
    return f"job_{instance if instance <= names else (instance - 1) % params['hot'] + 1:04d}"


def date_of(instance: int) -> str:
    """The business date the generator gave `instance` (100 consecutive instances share it)."""
    return (dt.date(2000, 1, 1) + dt.timedelta(days=(instance - 1) // 100)).isoformat()


def by(**pairs: object) -> ParameterFilter:
    return ParameterFilter.parse([f"{name}={value}" for name, value in pairs.items()])


def filtered(explorer: JobExplorer, params: dict[str, int], rng: random.Random) -> dict[str, Any]:
    """The `--param` pages: instance samples beyond the per-name ones, so every job matches."""
    picks = [rng.randint(params["names"] + 1, params["instances"]) for _ in range(SAMPLES // 4)]
    age = dt.timedelta(minutes=10)
    unresolved = [
        i for i in range(1, params["instances"] + 1) if i % params["unresolved_every"] == 0
    ]
    return {
        "instances_by_run": [
            (lambda i=i: walk(lambda c: explorer.instances(job_of(i, params), PAGE, c, by(run=i))))
            for i in picks
        ],
        "instances_by_date": [
            (
                lambda i=i: walk(
                    lambda c: explorer.instances(
                        job_of(i, params), PAGE, c, by(business_date=date_of(i))
                    )
                )
            )
            for i in picks
        ],
        "instances_by_region": [
            (
                lambda i=i: walk(
                    lambda c: explorer.instances(job_of(i, params), PAGE, c, by(region="eu"))
                )
            )
            for i in picks[:10]
        ],
        "executions_by_run": [
            (lambda i=i: walk(lambda c: explorer.executions_with_parameters(by(run=i), PAGE, c)))
            for i in picks
        ],
        "executions_by_date": [
            (
                lambda i=i: walk(
                    lambda c: explorer.executions_with_parameters(
                        by(business_date=date_of(i)), PAGE, c
                    )
                )
            )
            for i in picks
        ],
        "unresolved_by_date": [
            (
                lambda i=i: walk(
                    lambda c: explorer.unresolved_executions(
                        age, PAGE, c, by(business_date=date_of(i))
                    )
                )
            )
            for i in rng.sample(unresolved, min(20, len(unresolved)))
        ],
    }


def workloads(explorer: JobExplorer, params: dict[str, int], seed: int) -> dict[str, Any]:
    """Query name -> list of zero-argument walks, each returning its page latencies."""
    rng = random.Random(seed)
    instances = params["instances"]
    every100 = list(range(100, instances + 1, 100))
    sample_instances = [rng.randint(1, instances) for _ in range(SAMPLES)]
    sample_names = [f"job_{rng.randint(1, params['hot']):04d}" for _ in range(20)]
    with_records = [rng.choice(every100) for _ in range(SAMPLES)]
    age = dt.timedelta(minutes=10)
    return {
        "job_names": [lambda: walk(lambda c: explorer.job_names(PAGE, c))],
        "instances": [
            (lambda n=n: walk(lambda c: explorer.instances(n, PAGE, c))) for n in sample_names
        ],
        "executions": [
            (lambda i=i: walk(lambda c: explorer.executions(i, PAGE, c))) for i in sample_instances
        ],
        "execution": [
            (lambda i=i: single(lambda: explorer.execution(2 * i))) for i in sample_instances
        ],
        "step_executions": [
            (lambda i=i: walk(lambda c: explorer.step_executions(2 * i, PAGE, c)))
            for i in sample_instances
        ],
        "unresolved_executions": [
            lambda: walk(lambda c: explorer.unresolved_executions(age, PAGE, c))
        ],
        "recovery_decisions": [
            (lambda i=i: walk(lambda c: explorer.recovery_decisions(2 * i - 1, PAGE, c)))
            for i in with_records
        ],
        "flow_decisions": [
            (lambda i=i: walk(lambda c: explorer.flow_decisions(2 * i, PAGE, c)))
            for i in with_records
        ],
        "step_partitions": [
            (lambda i=i: walk(lambda c: explorer.step_partitions(2 * i, PAGE, c)))
            for i in with_records
        ],
        "operator_requests": [
            (lambda i=i: walk(lambda c: explorer.operator_requests(2 * i, PAGE, c)))
            for i in with_records
        ],
        **filtered(explorer, params, random.Random(seed + 1)),
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


EXPLAIN_PARAMS: dict[str, dict[str, object]] = {
    "explore_job_names": {"after_name": "job_0500", "ceiling": 2**62, "row_limit": 50},
    "explore_instances": {
        "job_name": "job_0500",
        "ceiling": 2**62,
        "before_id": 2**62,
        "row_limit": 50,
    },
    "explore_executions": {
        "job_instance_id": 250_000,
        "ceiling": 2**62,
        "before_attempt": 2**31 - 1,
        "before_id": 2**62,
        "row_limit": 50,
    },
    "explore_execution": {"job_execution_id": 500_000},
    "explore_recent_executions": {"job_name": "job_0500", "row_limit": 20},
    "explore_unresolved_executions": {
        "ceiling": 2**62,
        "after_id": 0,
        "row_limit": 50,
        "parameter_documents": [to_jsonb({})],
    },
    "explore_instances_with_parameters": {
        "job_name": job_of(250_001, {"names": 1000, "hot": 1000}),
        "parameter_documents": [to_jsonb({"business_date": {"value": date_of(250_001)}})],
        "ceiling": 2**62,
        "before_id": 2**62,
        "row_limit": 50,
    },
    "explore_executions_with_parameters": {
        "parameter_documents": [to_jsonb({"business_date": {"value": date_of(250_001)}})],
        "ceiling": 2**62,
        "before_id": 2**62,
        "row_limit": 50,
    },
    "explore_step_executions": {
        "job_execution_id": 500_000,
        "after_id": 0,
        "ceiling": 2**62,
        "row_limit": 50,
    },
    "explore_recovery_decisions": {
        "job_execution_id": 499_999,
        "after_id": 0,
        "ceiling": 2**62,
        "row_limit": 50,
    },
    "explore_flow_decisions": {
        "job_execution_id": 500_000,
        "after_sequence": 0,
        "after_id": 0,
        "ceiling": 2**62,
        "row_limit": 50,
    },
    "explore_step_partitions": {
        "step_execution_id": 500_000,
        "after_id": 0,
        "ceiling": 2**62,
        "row_limit": 50,
    },
    "explore_operator_requests": {
        "job_execution_id": 500_000,
        "after_id": 0,
        "ceiling": 2**62,
        "row_limit": 50,
    },
}


#: The filtered statements again, with the filters that choose other plans.
EXPLAIN_VARIANTS: list[tuple[str, str, dict[str, object]]] = [
    (
        "region=eu: a third of the job's instances",
        "explore_instances_with_parameters",
        {
            **EXPLAIN_PARAMS["explore_instances_with_parameters"],
            "parameter_documents": [to_jsonb({"region": {"value": "eu"}})],
        },
    ),
    (
        "run=250001: one instance (a string and an i64 document)",
        "explore_executions_with_parameters",
        {
            **EXPLAIN_PARAMS["explore_executions_with_parameters"],
            "parameter_documents": [
                to_jsonb({"run": {"value": "250001"}}),
                to_jsonb({"run": {"value": 250_001}}),
            ],
        },
    ),
    (
        f"business_date={date_of(250_001)}",
        "explore_unresolved_executions",
        {
            **EXPLAIN_PARAMS["explore_unresolved_executions"],
            "parameter_documents": [to_jsonb({"business_date": {"value": date_of(250_001)}})],
        },
    ),
]


def explain_all(dsn: str) -> list[str]:
    """Print EXPLAIN (ANALYZE, BUFFERS) of every explore_* statement; return sequential scans."""
    flagged = []
    statements = {s.name: s for s in load_statements() if s.filename == "explorer.sql"}
    runs = [(name, name, EXPLAIN_PARAMS.get(name, {})) for name in statements]
    runs += [(f"{name} ({title})", name, params) for title, name, params in EXPLAIN_VARIANTS]
    with admin_connect(dsn) as conn:
        for title, name, given in runs:
            statement = statements[name]
            params = dict(given)
            if statement.name == "explore_unresolved_executions":
                params["cutoff"] = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
            if "job_name" in statement.parameters and "job_name" not in params:
                params["job_name"] = "job_0500"
            for name in statement.parameters - params.keys():
                params[name] = 500_000
            rows = conn.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)\n" + statement.query, params
            ).fetchall()
            plan = [str(row[0]) for row in rows]
            print(f"\n-- {title}")
            for line in plan:
                print(f"   {line}")
            for line in plan:
                for table in HISTORY_TABLES:
                    if f"Seq Scan on {table}" in line:
                        flagged.append(f"{title}: {line.strip()}")
    return flagged


def index_build(dsn: str) -> str:
    """Migration 0012's parameter index built again over the history: its time and size."""
    migration = next(migrations_dir().glob("0012_*.sql")).read_text()
    create = re.search(r"^CREATE INDEX .*?;", migration, re.M | re.S)
    assert create is not None
    with admin_connect(dsn) as conn:
        conn.execute("DROP INDEX pybatch.job_instance_parameter_values")
        started = time.perf_counter()
        conn.execute(create.group(0).encode())
        seconds = time.perf_counter() - started
        row = conn.execute(
            "SELECT count(*), pg_size_pretty(pg_relation_size("
            "'pybatch.job_instance_parameter_values')) FROM pybatch.job_instance"
        ).fetchone()
    assert row is not None
    return f"{seconds:.2f} s over {row[0]:,} instances, {row[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a server to use (CREATEDB); default: an embedded one")
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--names", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with postgres_server(args.dsn, fsync=False) as server:
        with (
            scratch_database(server, "large") as large,
            scratch_database(server, "small") as small,
        ):
            sizes = {"large": args.executions, "small": args.small}
            shapes = {
                label: shape(size, args.names, args.executions) for label, size in sizes.items()
            }
            for label, dsn in (("small", small), ("large", large)):
                started = time.perf_counter()
                populate(dsn, shapes[label])
                print(
                    f"populated {label}: {sizes[label]:,} executions in "
                    f"{time.perf_counter() - started:.1f} s",
                    flush=True,
                )
            print(f"parameter index (migration 0012) built over large: {index_build(large)}")
            latencies: dict[str, dict[str, list[float]]] = {"large": {}, "small": {}}
            repositories = {
                label: JobRepository.connect(
                    ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=1)
                )
                for label, dsn in (("large", large), ("small", small))
            }
            try:
                plans = {
                    label: workloads(JobExplorer(repo), shapes[label], args.seed)
                    for label, repo in repositories.items()
                }
                for label in plans:  # warm-up: one walk of each query, not measured
                    for runs in plans[label].values():
                        runs[0]()
                gc.collect()
                gc.disable()
                for query in plans["large"]:
                    runs = {label: plans[label][query] for label in plans}
                    repetitions = max(len(runs["large"]), 10)
                    for k in range(repetitions):
                        order = ("large", "small") if k % 2 == 0 else ("small", "large")
                        for label in order:  # alternating, so noise falls on both alike
                            walk_once = runs[label][k % len(runs[label])]
                            latencies[label].setdefault(query, []).extend(walk_once())
                gc.enable()
            finally:
                for repo in repositories.values():
                    repo.close()
            print(
                f"\nPage latency, ms (page size {PAGE.value}; large = {args.executions:,}, "
                f"small = {args.small:,} executions)"
            )
            print(
                f"{'query':24} {'pages':>6} {'p50 large':>10} {'p95 large':>10} "
                f"{'p99 large':>10} {'p50 small':>10} {'p99 small':>10} {'ratio':>7}  target"
            )
            worst_ratio = 0.0
            worst_p50 = 0.0
            for query in plans["large"]:
                big, little = latencies["large"][query], latencies["small"][query]
                p50_big, p50_small = statistics.median(big), statistics.median(little)
                ratio = p50_big / p50_small
                worst_ratio = max(worst_ratio, ratio)
                worst_p50 = max(worst_p50, p50_big)
                ok = "ok" if p50_big <= 0.005 and ratio <= 1.3 else "MISSED"
                print(
                    f"{query:24} {len(big):>6} {p50_big * 1e3:>10.2f} "
                    f"{percentile(big, 0.95) * 1e3:>10.2f} "
                    f"{percentile(big, 0.99) * 1e3:>10.2f} {p50_small * 1e3:>10.2f} "
                    f"{percentile(little, 0.99) * 1e3:>10.2f} {ratio:>7.2f}  {ok}"
                )
            print(f"\nworst p50 at the large size: {worst_p50 * 1e3:.2f} ms (target <= 5 ms)")
            print(f"worst p50 ratio large/small: {worst_ratio:.2f} (target <= 1.3)")
            print("\nEXPLAIN (ANALYZE, BUFFERS) of every explorer statement on the large database:")
            flagged = explain_all(large)
            print("\nsequential scans of history tables:", "none" if not flagged else "")
            for line in flagged:
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
