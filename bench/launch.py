"""Launch-and-complete latency with no history and with 100,000 prior executions.

Why: a launch (one statement: the instance, the new attempt STARTED and owned) and its
completion (a step started, the step ended, the run ended: one statement each, what
`with Job(...).launch() as run: run.step(...)` sends) must run a fixed number of statements
whatever the history of the job name, so a repository with years of runs launches as
fast as a new one. This program measures both in one run and prints the ratio of the
medians (target at most 1.2), the statements per cycle, the plan of every statement,
and the scan counters that show which tables were read by index.

    python -m bench.launch [--dsn DSN] [--history 100000] [--launches 300] [--isolation]

Method (docs/benchmarks.md, "Launch and completion latency"):

* two scratch databases on one server: `empty` and `history`; the history database gets
  `--history` completed executions of the same job name, generated server-side by one
  INSERT ... SELECT generate_series, read back through pybatch, then VACUUM ANALYZE and
  a CHECKPOINT, so that measuring starts like any moment of a long-running server;
* one pooled connection per database (pool_size=1), a warm-up, then the measured cycles
  alternating the two databases cycle by cycle (ABBA), so that the noise of a shared
  machine falls on both alike; `--rounds` only groups them to show that noise as
  per-round ratios; the garbage collector runs between rounds, never inside one;
* besides wall time, the CPU time of the client thread and of the server process
  (/proc/PID/schedstat, local servers only), the WAL each cycle writes and its full-page
  images per index (pg_walinspect): work that grew with the history would show there,
  unlike time spent waiting for a busy core;
* statements are counted on every cycle by wrapping `Statement.run`, and on a few
  untimed cycles from libpq's protocol trace, which also sees BEGIN, SAVEPOINT, RELEASE
  and COMMIT (sent as statements of their own, or by psycopg) and the round trips;
* EXPLAIN (no ANALYZE) of each statement with the parameters of a real cycle, plus the
  generic plan a prepared statement may switch to, and pg_stat_user_tables deltas.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from bench._server import (
    admin_connect,
    postgres_server,
    scratch_database,
    wait_for_sessions,
)
from bench.isolation import isolate
from pybatch import ConnectionConfig, JobRepository, TlsMode, UnitOfWork, migrate
from pybatch._statements import Mode, Statement
from pybatch.errors import CompletedInstance
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import StartLimit
from pybatch.values.names import JobName, NodeId, StepName
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import Existing
from pybatch.values.status import BatchStatus

JOB = JobName("bench_launch")
STEP = StepName("work")
#: Launch keys use `run` values from here on; the loaded history uses 1..--history.
LAUNCH_KEY_BASE = 10**12
TARGET_RATIO = 1.2
#: With --isolation: the family role the measured cycles run as, and its job name prefix.
ISOLATION_ROLE = "pybatch_bench"
ISOLATION_PREFIX = "bench_"
#: Untimed cycles per phase whose protocol messages libpq traces.
TRACED_CYCLES = 10
HISTORY_TABLES = ("job_instance", "job_execution", "step_execution")
#: `JobRepository.begin` runs this first in every unit of work.
#: Transaction control psycopg sends as Query messages.
CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK")
#: Where libpq sent a Sync, in a traced cycle's sequence: the end of an implicit transaction.
SYNC = "Sync"
#: The BEGIN and COMMIT a one-statement unit of work sends as statements of its own.
TRANSACTION_STATEMENTS = {"begin_read_committed": "BEGIN", "commit_transaction": "COMMIT"}
#: The units of work of one cycle, in order.
UNITS = ("launch", "step start", "step end", "run end")
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "launch.json"

#: The history's runs `first` to `first` + `history` - 1: their instances and one COMPLETED
#: attempt each, in the shape pybatch itself writes. instance_key is the real JobInstanceKey
#: digest (docs/tables.md 3.7) of {"run": g}: version byte 1, then big-endian length-prefixed
#: job name and parameter name, tag 2 (I64) and the 8-byte value.
_RUNS_SQL = b"""
WITH definition AS (
    SELECT d.id
    FROM pybatch.job_definition AS d
    WHERE d.job_name = %(job_name)s AND d.definition_revision = %(revision)s
),
instance AS (
    INSERT INTO pybatch.job_instance (
        job_name, instance_key, identifying_parameters, created_at, last_attempt
    )
    SELECT
        %(job_name)s,
        sha256(
            '\\x01'::bytea
            || int4send(octet_length(%(job_name)s)) || convert_to(%(job_name)s, 'UTF8')
            || int4send(octet_length('run')) || convert_to('run', 'UTF8')
            || '\\x02'::bytea || int8send(g)
        ),
        jsonb_build_object(
            'run', jsonb_build_object('type', 'i64', 'identifying', true, 'value', g)
        ),
        %(origin)s + g * interval '1 minute',
        1
    FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(history)s - 1) AS g
    RETURNING id, identifying_parameters, created_at
),
execution AS (
    INSERT INTO pybatch.job_execution (
        job_instance_id, definition_id, attempt, status, exit_code, parameters,
        context_format, context_schema, context_schema_version, context_payload,
        created_at, started_at, ended_at, updated_at, version
    )
    SELECT
        i.id, definition.id, 1, 'COMPLETED', 'COMPLETED', i.identifying_parameters,
        1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
        i.created_at, i.created_at + interval '1 second',
        i.created_at + interval '30 seconds', i.created_at + interval '30 seconds', 2
    FROM instance AS i CROSS JOIN definition
    RETURNING id, created_at
)
"""
#: One statement builds the whole history: the runs, each with one COMPLETED step (and one of
#: a name of its own with `many_names`). Its parameters: `history_parameters`.
HISTORY_SQL = (
    _RUNS_SQL
    + b"""INSERT INTO pybatch.step_execution (
    job_execution_id, step_name, step_logical_id, status, exit_code,
    checkpoint_format, checkpoint_schema, checkpoint_schema_version, checkpoint_payload,
    context_format, context_schema, context_schema_version, context_payload,
    created_at, started_at, ended_at, updated_at, version
)
SELECT
    e.id, n.name, n.name, 'COMPLETED', 'COMPLETED',
    1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
    1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
    e.created_at + interval '2 seconds', e.created_at + interval '3 seconds',
    e.created_at + interval '29 seconds', e.created_at + interval '29 seconds', 2
FROM execution AS e
CROSS JOIN LATERAL (
    VALUES (%(step_name)s), (CASE WHEN %(many_names)s THEN %(step_name)s || '.' || e.id END)
) AS n (name)
WHERE n.name IS NOT NULL
"""
)


#: `plans` more completed runs of JOB (runs `first` onwards), each a partitioned step of
#: PLAN_WIDTH partitions, each partition with its worker step: executions with many steps, which
#: raise the planner's average of steps per execution, and a large step_partition table.
PARTITIONED_HISTORY_SQL = (
    _RUNS_SQL
    + b""",
step AS (
    INSERT INTO pybatch.step_execution (
        job_execution_id, step_name, step_logical_id, status, exit_code,
        checkpoint_format, checkpoint_schema, checkpoint_schema_version, checkpoint_payload,
        context_format, context_schema, context_schema_version, context_payload,
        created_at, started_at, ended_at, updated_at, version
    )
    SELECT
        e.id, n.name, n.name, 'COMPLETED', 'COMPLETED',
        1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
        1, 'oxide_batch.empty.v1', 1, '{}'::jsonb,
        e.created_at + interval '2 seconds', e.created_at + interval '3 seconds',
        e.created_at + interval '29 seconds', e.created_at + interval '29 seconds', 2
    FROM execution AS e
    CROSS JOIN LATERAL (
        SELECT 'fanout'
        UNION ALL
        SELECT 'fanout#' || w || '.1' FROM generate_series(1, %(width)s::int) AS w
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
    ON parent.job_execution_id = worker.job_execution_id AND parent.step_name = 'fanout'
WHERE worker.step_name <> 'fanout'
"""
)
#: Partitions per loaded partitioned run (`--partitioned-plans`).
PLAN_WIDTH = 1000


# --------------------------------------------------------------------------- the cycle


def run_cycle(repository: JobRepository, run: int) -> tuple[int, int]:
    """The launch and the completion of a one-step run; their durations in ns.

    Exactly what `with Job(...).launch() as run: run.step(...)` sends (without the lease
    renewal thread): the launch commits before the work starts, then the step starts, the
    step ends and the run ends, one unit of work each. `run` makes a new instance each time.
    """
    key = JobInstanceKey(JOB, JobParameters.of({"run": run}))
    owner, lease, legacy = OwnerToken.generate(), ExecutionLease(), DefinitionIdentity.LEGACY
    began = time.perf_counter_ns()
    instance, execution, _ = repository.run_in_unit_of_work(
        lambda uow: uow.ownership.launch(key, legacy, owner, lease)
    )
    launched = time.perf_counter_ns()
    if instance is None or execution is None:
        raise RuntimeError(f"run {run} was not launched: launch keys must be new")
    _, step = repository.run_in_unit_of_work(
        lambda uow: uow.flow.start_step(
            execution.id, owner, STEP, NodeId(STEP.value), StartLimit.unrestricted()
        )
    )
    repository.run_in_unit_of_work(
        lambda uow: uow.steps.end(execution.id, owner, step.id, BatchStatus.COMPLETED)
    )
    repository.run_in_unit_of_work(
        lambda uow: uow.executions.end(execution.id, owner, BatchStatus.COMPLETED)
    )
    completed = time.perf_counter_ns()
    if execution.attempt != 1:
        raise RuntimeError(f"run {run} found an existing instance: launch keys must be new")
    return launched - began, completed - launched


# --------------------------------------------------------------------------- counting


class StatementRecorder:
    """Records each pybatch statement by wrapping `Statement._run`, the one path to the wire.

    Cheap enough (a list append) to stay on during timed cycles, so every measured cycle
    is counted, not a sample; `capture` also keeps the parameters for EXPLAIN.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        #: Statements per unit of work since the last `take_per_unit` (begin opens a count).
        self.units: list[int] = []
        self.capture: dict[str, tuple[Statement, dict[str, Any]]] | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[StatementRecorder]:
        """Patch `Statement._run` and `JobRepository.begin` for the duration of the block."""
        original = Statement._run
        original_begin = JobRepository.begin
        recorder = self

        def begin(repository: JobRepository) -> UnitOfWork:
            recorder.units.append(0)
            return original_begin(repository)

        def run(
            statement: Statement,
            conn: psycopg.Connection[Any],
            mode: Mode,
            params: Mapping[str, object],
        ) -> psycopg.Cursor[dict[str, Any]]:
            recorder.names.append(statement.name)
            if statement.name in TRANSACTION_STATEMENTS:
                return original(statement, conn, mode, params)
            if recorder.units:
                recorder.units[-1] += 1
            if recorder.capture is not None:
                recorder.capture.setdefault(statement.name, (statement, dict(params)))
            return original(statement, conn, mode, params)

        Statement._run = run  # type: ignore[method-assign,assignment]
        JobRepository.begin = begin  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            Statement._run = original  # type: ignore[method-assign]
            JobRepository.begin = original_begin  # type: ignore[method-assign]

    def take(self) -> list[str]:
        """The statements recorded since the last call."""
        names, self.names = self.names, []
        self.units = []
        return names

    def take_per_unit(self) -> tuple[int, ...]:
        """pybatch statements per unit of work since the last call."""
        units = tuple(self.units)
        self.take()
        return units


_TRACE_MESSAGE = re.compile(r"^F\t\d+\t(\w+)\t?(.*)$")


@dataclass(frozen=True)
class WireCycle:
    """What libpq sent for one cycle: the ordered statements and the round trips."""

    sequence: tuple[str, ...]
    round_trips: int
    executes: int

    def counts(self) -> Counter[str]:
        """Messages by kind: BEGIN, SAVEPOINT, RELEASE, COMMIT, or a pybatch statement."""
        return Counter(m for m in self.sequence if m != SYNC)

    def units_of_work(self) -> list[tuple[str, ...]]:
        """The sequence cut after each COMMIT, and after each Sync outside BEGIN ... COMMIT.

        In autocommit, what one Sync closes is one implicit transaction: a statement sent
        alone, or several pipelined together (a step's start after short_transaction_settings).
        """
        units: list[tuple[str, ...]] = []
        current: list[str] = []
        for message in self.sequence:
            if message != SYNC:
                current.append(message)
            if current and (
                (message == "COMMIT" and current[0] == "BEGIN")
                or (message == SYNC and current[0] != "BEGIN")
            ):
                units.append(tuple(current))
                current = []
        return units + ([tuple(current)] if current else [])

    def control_per_unit(self) -> tuple[int, ...]:
        """Transaction-control messages per unit of work."""
        return tuple(sum(m in CONTROL for m in unit) for unit in self.units_of_work())


def parse_trace(text: str, names: Sequence[str]) -> WireCycle:
    """Read a libpq trace: Query messages are SQL commands, Execute runs a bound statement.

    The n-th Execute is the n-th recorded `Statement.run`; a mismatch means something
    other than pybatch's statement loader reached the wire, so it raises.
    """
    sequence: list[str] = []
    round_trips = executes = 0
    pending = iter(names)
    for line in text.splitlines():
        match = _TRACE_MESSAGE.match(line)
        if match is None:
            continue
        kind, rest = match.groups()
        if kind == "Query":
            sequence.append(rest.strip().strip('"').split()[0].upper())
            round_trips += 1
        elif kind == "Execute":
            executes += 1
            name = next(pending, None)
            if name is None:
                raise RuntimeError("libpq sent more statements than Statement.run recorded")
            sequence.append(TRANSACTION_STATEMENTS.get(name, name))
        elif kind == "Sync":
            round_trips += 1
            sequence.append(SYNC)
    if next(pending, None) is not None:
        raise RuntimeError("Statement.run recorded statements libpq never sent")
    return WireCycle(tuple(sequence), round_trips, executes)


def pool_connection(repository: JobRepository) -> psycopg.Connection[Any]:
    """The single pooled connection (pool_size=1), to trace it while it sits in the pool."""
    with repository.begin() as uow:
        return uow.connection


def traced_cycle(
    repository: JobRepository, conn: psycopg.Connection[Any], run: int, recorder: StatementRecorder
) -> WireCycle:
    """Run one untimed cycle with libpq tracing every protocol message it sends."""
    recorder.take()
    with tempfile.TemporaryFile("w+") as trace:
        descriptor = os.dup(trace.fileno())  # libpq's FILE* owns this copy
        conn.pgconn.trace(descriptor)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            run_cycle(repository, run)
        finally:
            conn.pgconn.untrace()  # flushes the FILE*
            os.close(descriptor)
        trace.seek(0)
        text = trace.read()
    return parse_trace(text, recorder.take())


# --------------------------------------------------------------------------- setup


def config_for(dsn: str) -> ConnectionConfig:
    """One pooled connection: the cycle is sequential, and tracing needs a known connection."""
    return ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=1)


def history_parameters(
    job_name: str, history: int, origin: dt.datetime, *, many_names: bool = False
) -> dict[str, object]:
    """HISTORY_SQL's parameters: `history` runs of `job_name` from run 1, the first at `origin`."""
    return {
        "job_name": job_name,
        "revision": DefinitionIdentity.LEGACY.revision.value,
        "step_name": STEP.value,
        "origin": origin,
        "first": 1,
        "history": history,
        "many_names": many_names,
    }


def load_history(dsn: str, history: int, *, many_names: bool = False) -> float:
    """Insert `history` completed executions of JOB in one statement; returns seconds.

    With `many_names` each execution also ran a step of a name of its own (as when a step's
    name carries a date or a tenant): the statistics then see a name shared by all executions
    among as many others, and a plan for any name expects a few rows of it.
    """
    began = time.monotonic()
    with admin_connect(dsn, autocommit=False) as conn:
        origin = dt.datetime.now(dt.UTC) - dt.timedelta(days=400)
        cursor = conn.execute(
            HISTORY_SQL, history_parameters(JOB.value, history, origin, many_names=many_names)
        )
        steps = history * (2 if many_names else 1)
        if cursor.rowcount != steps:
            raise RuntimeError(f"loaded {cursor.rowcount} steps, expected {steps}")
        conn.commit()
    return time.monotonic() - began


def load_partitioned_history(dsn: str, first: int, plans: int) -> float:
    """Insert `plans` completed partitioned runs (PLAN_WIDTH partitions each); returns seconds."""
    began = time.monotonic()
    with admin_connect(dsn, autocommit=False) as conn:
        cursor = conn.execute(
            PARTITIONED_HISTORY_SQL,
            {
                "job_name": JOB.value,
                "revision": DefinitionIdentity.LEGACY.revision.value,
                "origin": dt.datetime.now(dt.UTC) - dt.timedelta(days=400),
                "first": first,
                "history": plans,
                "width": PLAN_WIDTH,
            },
        )
        if cursor.rowcount != plans * PLAN_WIDTH:
            raise RuntimeError(
                f"loaded {cursor.rowcount} partitions, expected {plans * PLAN_WIDTH}"
            )
        conn.commit()
    return time.monotonic() - began


def validate_history(dsn: str, history: int) -> None:
    """Read loaded rows back through pybatch: digests, JSON and states must all decode.

    A loaded instance must be Existing (its instance_key is the real digest), its one
    attempt and its steps must decode as COMPLETED, and a new launch of it must be refused
    with CompletedInstance, exactly as for an instance pybatch wrote itself.
    """
    key = JobInstanceKey(JOB, JobParameters.of({"run": max(1, history // 2)}))
    with JobRepository.connect(config_for(dsn)) as repository, repository.begin() as uow:
        selection = uow.instances.select_or_create(key)
        if not isinstance(selection, Existing):
            raise RuntimeError("a loaded instance_key differs from pybatch's digest")
        executions = uow.executions.of_instance(selection.instance.id)
        steps = uow.steps.of_execution(executions[0].id)
        if [e.status for e in executions] != [BatchStatus.COMPLETED] or {
            s.status for s in steps
        } != {BatchStatus.COMPLETED}:
            raise RuntimeError("a loaded instance does not read back as one COMPLETED attempt")
        try:
            uow.executions.create(selection.instance.id)
        except CompletedInstance:
            pass
        else:
            raise RuntimeError("a loaded COMPLETED instance accepted a new launch")


def vacuum_analyze(dsn: str) -> None:
    """What autovacuum long since did to an old history; also keeps it from starting mid-run."""
    with admin_connect(dsn) as conn:
        for table in ("job_definition", *HISTORY_TABLES):
            conn.execute(f"VACUUM (ANALYZE) pybatch.{table}".encode())


def table_counters(dsn: str) -> dict[str, dict[str, int]]:
    """Cumulative scan counters and live rows of pybatch's tables."""
    with admin_connect(dsn) as conn:
        rows = conn.execute(
            "SELECT t.relname, t.seq_scan, t.seq_tup_read, coalesce(t.idx_scan, 0),"
            " t.n_live_tup,"
            " coalesce(io.heap_blks_hit, 0) + coalesce(io.idx_blks_hit, 0),"
            " coalesce(io.heap_blks_read, 0) + coalesce(io.idx_blks_read, 0)"
            " FROM pg_stat_user_tables AS t"
            " JOIN pg_statio_user_tables AS io ON io.relid = t.relid"
            " WHERE t.schemaname = 'pybatch'"
        ).fetchall()
    keys = ("seq_scan", "seq_tup_read", "idx_scan", "rows", "blks_hit", "blks_read")
    return {str(row[0]): dict(zip(keys, map(int, row[1:]), strict=True)) for row in rows}


def execution_count(dsn: str) -> int:
    """Executions of JOB stored now."""
    with admin_connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pybatch.job_execution AS e"
            " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id WHERE i.job_name = %s",
            (JOB.value,),
        ).fetchone()
    return 0 if row is None else int(row[0])


# --------------------------------------------------------------------------- plans

_NAMED_PARAMETER = re.compile(r"%\((\w+)\)s")


def positional(query: str) -> tuple[str, int]:
    """psycopg's %(name)s form to PREPARE's $n form; returns the text and the arity."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return _NAMED_PARAMETER.sub(number, query).replace("%%", "%"), len(numbers)


def describe_plan(node: Mapping[str, Any]) -> str:
    """A one-line plan: node types with their index or table, children after '>'."""
    kind = str(node["Node Type"])
    if kind == "ModifyTable":
        label = f"{node['Operation']} on {node['Relation Name']}"
        if node.get("Conflict Arbiter Indexes"):
            label += f" [arbiter {', '.join(node['Conflict Arbiter Indexes'])}]"
    elif "Index Name" in node:
        backward = " Backward" if node.get("Scan Direction") == "Backward" else ""
        label = f"{kind}{backward} using {node['Index Name']}"
    elif "Relation Name" in node:
        label = f"{kind} on {node['Relation Name']}"
    else:
        label = kind
    children = [describe_plan(child) for child in node.get("Plans", [])]
    if len(children) == 1:
        return f"{label} > {children[0]}"
    if children:
        return f"{label} > ({'; '.join(children)})"
    return label


def _plan_of(row: tuple[Any, ...] | None) -> str:
    if row is None:
        return "n/a"
    document = row[0]
    if isinstance(document, str):
        document = json.loads(document)
    return describe_plan(document[0]["Plan"])


def explain(
    dsn: str, calls: Mapping[str, tuple[Statement, dict[str, Any]]]
) -> dict[str, dict[str, str]]:
    """EXPLAIN (no ANALYZE, nothing runs) each statement two ways.

    `custom`: planned with the parameters of a real cycle, as an unprepared statement or
    the first five executions of a prepared one are. `generic`: the parameter-blind plan
    PostgreSQL may switch a prepared statement to afterwards (psycopg prepares a statement
    once it has run prepare_threshold = 5 times on a connection, so the warm-up gets there).
    """
    plans: dict[str, dict[str, str]] = {}
    with admin_connect(dsn) as conn:
        for name, (statement, params) in calls.items():
            plan: dict[str, str] = {}
            try:
                with conn.transaction():
                    plan["custom"] = _plan_of(
                        conn.execute(b"EXPLAIN (FORMAT JSON) " + statement.query, params).fetchone()
                    )
            except psycopg.Error as error:
                plan["custom"] = f"n/a ({str(error).splitlines()[0]})"
            text, arity = positional(statement.query.decode())
            arguments = f"({', '.join(['NULL'] * arity)})" if arity else ""
            try:
                with conn.transaction():
                    conn.execute(f"PREPARE bench_generic AS {text}".encode())
                    conn.execute(b"SET LOCAL plan_cache_mode = force_generic_plan")
                    plan["generic"] = _plan_of(
                        conn.execute(
                            f"EXPLAIN (FORMAT JSON) EXECUTE bench_generic{arguments}".encode()
                        ).fetchone()
                    )
            except psycopg.Error as error:
                plan["generic"] = f"n/a ({str(error).splitlines()[0]})"
            finally:
                conn.execute(b"DEALLOCATE ALL")
            plans[name] = plan
    return plans


# --------------------------------------------------------------------------- figures


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was actually measured."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def ms(nanoseconds: float) -> float:
    """Nanoseconds to milliseconds, rounded for the table."""
    return round(nanoseconds / 1e6, 3)


@dataclass(frozen=True)
class Sample:
    """One measured cycle: wall time of each unit of work, CPU time of each side."""

    launch_ns: int
    completion_ns: int
    client_cpu_ns: int
    server_cpu_ns: int | None


def backend_cpu_ns(pid: int | None) -> int | None:
    """CPU time a local server process has used so far (/proc/PID/schedstat, in ns)."""
    if pid is None:
        return None
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def checkpoint(dsn: str) -> bool:
    """CHECKPOINT before measuring, as a long-running server has one every few minutes.

    After a checkpoint the first change to each page writes a full-page image to WAL:
    pages a cycle touches at random in a large index pay it again and again, hot pages of
    a small one once. Without it, pages the bulk load just wrote would be spared.
    """
    try:
        with admin_connect(dsn) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def enable_walinspect(dsn: str) -> bool:
    """pg_walinspect (PostgreSQL 15+, superuser) attributes full-page images to indexes."""
    try:
        with admin_connect(dsn) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error:
        return False
    return True


def flush_lsn(conn: psycopg.Connection[Any]) -> str:
    """The WAL flushed so far; pg_walinspect reads up to such a position."""
    row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    return "0/0" if row is None else str(row[0])


def full_page_images(dsn: str, start: str, end: str) -> Counter[tuple[int, int]]:
    """Full-page images between two WAL positions, by (database oid, relfilenode)."""
    with admin_connect(dsn) as conn:
        rows = conn.execute(
            "SELECT m[1]::bigint, m[2]::bigint, count(*)"
            " FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) AS r,"
            r" regexp_matches(r.block_ref, 'rel \d+/(\d+)/(\d+) fork main blk \d+ \(FPW\)', 'g')"
            " AS m GROUP BY 1, 2",
            (start, end),
        ).fetchall()
    return Counter({(int(db), int(node)): int(count) for db, node, count in rows})


def relation_files(dsn: str) -> tuple[int, dict[int, str]]:
    """The database's oid and its pybatch relations by relfilenode."""
    with admin_connect(dsn) as conn:
        row = conn.execute(
            "SELECT oid::bigint FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        files = conn.execute(
            "SELECT pg_relation_filenode(c.oid)::bigint, c.relname FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = 'pybatch'"
            " AND pg_relation_filenode(c.oid) IS NOT NULL"
        ).fetchall()
    return (0 if row is None else int(row[0])), {int(node): str(name) for node, name in files}


def wal_position(conn: psycopg.Connection[Any]) -> int:
    """The server's WAL insert position in bytes: differences are the WAL a cycle wrote."""
    row = conn.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
    ).fetchone()
    return 0 if row is None else int(row[0])


@dataclass
class Phase:
    """One database of the comparison and everything measured on it."""

    name: str
    dsn: str
    loaded: int
    #: Where the measured repository connects: `dsn`, or a family role's with --isolation.
    pybatch_dsn: str = ""
    repository: JobRepository | None = None
    next_run: int = LAUNCH_KEY_BASE
    executions_before: int = 0
    cycles_in_window: int = 0
    #: The pooled connection's server process, when it runs on this machine (CPU time).
    server_pid: int | None = None
    launch_ns: list[int] = field(default_factory=list)
    completion_ns: list[int] = field(default_factory=list)
    client_cpu_ns: list[int] = field(default_factory=list)
    server_cpu_ns: list[int] = field(default_factory=list)
    round_medians_ns: list[float] = field(default_factory=list)
    wal_bytes: list[int] = field(default_factory=list)
    #: Full-page images written for this database's relations over the window, or None.
    full_page_images: dict[str, int] | None = None
    #: pybatch statements per unit of work (launch, completion) -> measured cycles.
    statements: Counter[tuple[int, ...]] = field(default_factory=Counter)
    wire: list[WireCycle] = field(default_factory=list)
    calls: dict[str, tuple[Statement, dict[str, Any]]] = field(default_factory=dict)
    counters_before: dict[str, dict[str, int]] = field(default_factory=dict)
    counters_after: dict[str, dict[str, int]] = field(default_factory=dict)
    plans: dict[str, dict[str, str]] = field(default_factory=dict)

    def take_run(self) -> int:
        """A fresh `run` parameter, so every launch creates a new instance."""
        self.next_run += 1
        return self.next_run

    def cycle(self, recorder: StatementRecorder) -> Sample:
        """Run one cycle, count its statements and the CPU time it cost on both sides.

        CPU time barely moves when a busy machine delays a process, so it separates work
        that grows with the history from waiting for a core.
        """
        assert self.repository is not None
        recorder.take()
        server_before = backend_cpu_ns(self.server_pid)
        client_before = time.thread_time_ns()
        launch, completion = run_cycle(self.repository, self.take_run())
        client = time.thread_time_ns() - client_before
        server_after = backend_cpu_ns(self.server_pid)
        self.statements[recorder.take_per_unit()] += 1
        self.cycles_in_window += 1
        server = (
            None if server_before is None or server_after is None else server_after - server_before
        )
        return Sample(launch, completion, client, server)

    def record(self, samples: Sequence[Sample]) -> None:
        """Keep the measured samples of one round."""
        self.launch_ns += [s.launch_ns for s in samples]
        self.completion_ns += [s.completion_ns for s in samples]
        self.client_cpu_ns += [s.client_cpu_ns for s in samples]
        self.server_cpu_ns += [s.server_cpu_ns for s in samples if s.server_cpu_ns is not None]
        self.round_medians_ns.append(
            statistics.median(s.launch_ns + s.completion_ns for s in samples)
        )

    @property
    def cycle_ns(self) -> list[int]:
        """Launch plus completion, per cycle."""
        return [a + b for a, b in zip(self.launch_ns, self.completion_ns, strict=True)]

    def summary(self) -> dict[str, Any]:
        """The row of the main table."""
        return {
            "phase": self.name,
            "history_loaded": self.loaded,
            "executions_before_measuring": self.executions_before,
            "launches": len(self.launch_ns),
            "launch_ms": {
                "median": ms(statistics.median(self.launch_ns)),
                "p95": ms(percentile(self.launch_ns, 0.95)),
            },
            "completion_ms": {
                "median": ms(statistics.median(self.completion_ns)),
                "p95": ms(percentile(self.completion_ns, 0.95)),
            },
            "cycle_ms": {
                "median": ms(statistics.median(self.cycle_ns)),
                "p95": ms(percentile(self.cycle_ns, 0.95)),
            },
            "client_cpu_ms_median": ms(statistics.median(self.client_cpu_ns)),
            "server_cpu_ms_median": ms(statistics.median(self.server_cpu_ns))
            if self.server_cpu_ns
            else None,
            "wal_bytes_per_cycle_median": statistics.median(self.wal_bytes),
            "pybatch_statements_per_launch_completion": sorted(self.statements),
            "statements_per_launch_completion": self.totals(),
        }

    def totals(self) -> list[tuple[int, ...]]:
        """Statements per launch and per completion as sent: pybatch's, counted on every
        measured cycle, plus the transaction control seen in the traced cycles."""
        controls = {w.control_per_unit() for w in self.wire}
        sent = {
            tuple(a + b for a, b in zip(pybatch, control, strict=True))
            for pybatch in self.statements
            for control in controls
        }
        return sorted((units[0], sum(units[1:])) for units in sent)

    def scan_deltas(self) -> dict[str, dict[str, int]]:
        """Counter changes over the measuring window, per table."""
        deltas: dict[str, dict[str, int]] = {}
        for table, after in sorted(self.counters_after.items()):
            before = self.counters_before.get(table, dict.fromkeys(after, 0))
            deltas[table] = {
                key: after[key] - before[key]
                for key in ("seq_scan", "seq_tup_read", "idx_scan", "blks_hit", "blks_read")
            }
        return deltas


def machine_facts(dsn: str) -> dict[str, Any]:
    """What the figures depend on, printed with them."""
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line),
        platform.processor() or "unknown",
    )
    meminfo = Path("/proc/meminfo").read_text(errors="replace")
    total = re.search(r"MemTotal:\s+(\d+)", meminfo)
    kib = int(total.group(1)) if total else 0
    os_release = Path("/etc/os-release")
    os_name = platform.platform()
    if os_release.exists():
        found = re.search(r'^PRETTY_NAME="?([^"\n]*)', os_release.read_text(), re.MULTILINE)
        os_name = found.group(1) if found else os_name
    with admin_connect(dsn) as conn:
        settings = {
            str(name): str(value)
            for name, value in conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name IN"
                " ('server_version', 'shared_buffers', 'fsync', 'synchronous_commit')"
            ).fetchall()
        }
    libpq = pq.version()
    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": round(kib / 1024**2, 1),
        "cpu_model": model,
        "os": f"{os_name}, Linux {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "psycopg": f"{psycopg.__version__} ({pq.__impl__}, libpq {libpq // 10000}.{libpq % 100})",
        "postgresql": settings.get("server_version", "unknown"),
        "shared_buffers": settings.get("shared_buffers", "unknown"),
        "fsync": settings.get("fsync", "unknown"),
        "synchronous_commit": settings.get("synchronous_commit", "unknown"),
        "load_average_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# --------------------------------------------------------------------------- report


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table, pasted as is into docs/benchmarks.md."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fpi_summary(phase: Phase, cycles: int) -> str:
    """Full-page images per cycle by relation, largest first."""
    if phase.full_page_images is None:
        return "n/a (needs pg_walinspect: PostgreSQL 15+ and a superuser)"
    images = sorted(phase.full_page_images.items(), key=lambda item: -item[1])
    shown = [f"{name} {count / cycles:.2f}" for name, count in images if count / cycles >= 0.01]
    total = sum(phase.full_page_images.values()) / cycles
    return f"{total:.2f}" + (f" ({', '.join(shown)})" if shown else "")


def statements_cell(phase: Phase) -> str:
    """'launch / completion / cycle' statement counts; several values mean not constant."""
    return "; ".join(f"{a} / {b} / {a + b}" for a, b in phase.totals())


def report(
    machine: Mapping[str, Any], args: argparse.Namespace, empty: Phase, history: Phase
) -> tuple[str, dict[str, Any]]:
    """The printed tables and the JSON document with the same figures."""
    phases = (empty, history)
    summaries = [phase.summary() for phase in phases]
    ratios = {
        part: round(
            statistics.median(getattr(history, attr)) / statistics.median(getattr(empty, attr)), 3
        )
        for part, attr in (
            ("launch", "launch_ns"),
            ("completion", "completion_ns"),
            ("cycle", "cycle_ns"),
        )
    }
    round_ratios = sorted(
        h / e for h, e in zip(history.round_medians_ns, empty.round_medians_ns, strict=True)
    )
    observed = {total for p in phases for total in p.totals()}
    sequences = {w.sequence for p in phases for w in p.wire}
    wire_rows = []
    for phase in phases:
        counts = phase.wire[0].counts()
        pybatch = sum(v for k, v in counts.items() if k not in CONTROL)
        wire_rows.append(
            [
                phase.name,
                len(phase.wire),
                pybatch,
                counts["BEGIN"],
                counts["SAVEPOINT"],
                counts["RELEASE"],
                counts["COMMIT"],
                sum(counts.values()),
                phase.wire[0].round_trips,
                "yes" if len({w.sequence for w in phase.wire}) == 1 else "NO",
            ]
        )
    constant = len(sequences) == 1 and len(observed) == 1
    met = ratios["cycle"] <= TARGET_RATIO

    out: list[str] = []
    out.append(
        "- machine: "
        + "; ".join(
            f"{key} {machine[key]}"
            for key in (
                "date_utc",
                "nproc",
                "memory_gib",
                "cpu_model",
                "os",
                "python",
                "psycopg",
                "postgresql",
                "shared_buffers",
                "fsync",
                "synchronous_commit",
                "load_average_start",
                "load_average_end",
            )
        )
    )
    out.append(f"- command: {machine['command']}")
    out.append(
        "- isolation: "
        + (
            f"on: the measured cycles run as {ISOLATION_ROLE}, a job family role of"
            " docs/dba.md, with row-level security enabled"
            if machine.get("isolation")
            else "off (the default: migration 0008's policies are not enabled)"
        )
    )
    out.append(
        f"- method: {args.warmup} warm-up cycles per phase, then {args.launches} measured cycles"
        f" per phase in {args.rounds} rounds, alternating the databases cycle by cycle (ABBA);"
        " one pooled connection per database; history loaded in"
        f" {machine['history_load_seconds']:.1f} s, read back through pybatch, then VACUUM"
        " ANALYZE; CHECKPOINT before measuring: "
        + ("yes" if machine["checkpoint_before_measuring"] else "no (not permitted)")
    )
    out.append("")
    out.append(
        table(
            [
                "phase",
                "history loaded",
                "executions before measuring",
                "launches",
                "launch median / p95 (ms)",
                "completion median / p95 (ms)",
                "cycle median / p95 (ms)",
                "statements per launch / completion / cycle",
            ],
            [
                [
                    s["phase"],
                    f"{s['history_loaded']:,}",
                    f"{s['executions_before_measuring']:,}",
                    s["launches"],
                    f"{s['launch_ms']['median']:.2f} / {s['launch_ms']['p95']:.2f}",
                    f"{s['completion_ms']['median']:.2f} / {s['completion_ms']['p95']:.2f}",
                    f"{s['cycle_ms']['median']:.2f} / {s['cycle_ms']['p95']:.2f}",
                    statements_cell(phase),
                ]
                for s, phase in zip(summaries, phases, strict=True)
            ],
        )
    )
    out.append("")
    out.append(
        f"- ratio history/empty of the medians: launch {ratios['launch']:.3f}, completion"
        f" {ratios['completion']:.3f}, cycle {ratios['cycle']:.3f} (target <= {TARGET_RATIO}):"
        f" {'met' if met else 'MISSED'}"
    )
    out.append(
        f"- cycle ratio per round ({len(round_ratios)} rounds): min {round_ratios[0]:.3f},"
        f" median {statistics.median(round_ratios):.3f}, max {round_ratios[-1]:.3f}"
    )
    out.append(
        "- statements constant (the same counts on every measured cycle and the same ordered"
        f" sequence on every traced cycle, in both phases): {'yes' if constant else 'NO'}"
    )
    out.append("")
    out.append(
        "Work per cycle, which waiting for a core does not inflate (medians; CPU time of the"
        " client thread and of the server process, WAL of the traced cycles, buffer counters"
        " of pg_statio_user_tables over the window):"
    )
    out.append("")
    work_rows = []
    for phase, summary in zip(phases, summaries, strict=True):
        hits = sum(d["blks_hit"] for d in phase.scan_deltas().values())
        reads = sum(d["blks_read"] for d in phase.scan_deltas().values())
        server = summary["server_cpu_ms_median"]
        work_rows.append(
            [
                phase.name,
                f"{summary['client_cpu_ms_median']:.3f}",
                "n/a (remote server)" if server is None else f"{server:.3f}",
                f"{summary['wal_bytes_per_cycle_median']:,.0f}",
                f"{hits / max(1, phase.cycles_in_window):.1f}",
                f"{reads / max(1, phase.cycles_in_window):.2f}",
            ]
        )
    out.append(
        table(
            [
                "phase",
                "client CPU (ms)",
                "server CPU (ms)",
                "WAL bytes",
                "buffer hits",
                "blocks read into shared buffers",
            ],
            work_rows,
        )
    )
    out.append("")
    work_ratios = {
        key: round(float(h) / float(e), 3)
        for key in ("client_cpu_ms_median", "server_cpu_ms_median", "wal_bytes_per_cycle_median")
        if (e := summaries[0][key]) and (h := summaries[1][key]) is not None
    }
    out.append(
        "- full-page images per cycle (pg_walinspect over the measured and traced cycles, after"
        " a CHECKPOINT): "
        + "; ".join(
            f"{phase.name} " + fpi_summary(phase, args.launches + TRACED_CYCLES) for phase in phases
        )
    )
    out.append(
        "- ratio history/empty of the work medians: "
        + ", ".join(
            f"{label} {work_ratios[key]:.3f}"
            for key, label in (
                ("client_cpu_ms_median", "client CPU"),
                ("server_cpu_ms_median", "server CPU"),
                ("wal_bytes_per_cycle_median", "WAL bytes"),
            )
            if key in work_ratios
        )
    )
    out.append("")
    out.append("Statements per cycle, from libpq's protocol trace of untimed cycles:")
    out.append("")
    out.append(
        table(
            [
                "phase",
                "traced cycles",
                "pybatch statements",
                "BEGIN",
                "SAVEPOINT",
                "RELEASE",
                "COMMIT",
                "total statements",
                "round trips",
                "identical sequence",
            ],
            wire_rows,
        )
    )
    out.append("")
    for label, unit in zip(UNITS, history.wire[0].units_of_work(), strict=False):
        out.append(f"- {label} ({len(unit)} statements): " + ", ".join(unit))
    out.append("")
    out.append(
        "Plans in the history database (EXPLAIN without ANALYZE; custom = planned with a real"
        " cycle's parameters, generic = the plan a prepared statement may switch to):"
    )
    out.append("")
    out.append(
        table(
            ["statement", "custom plan", "generic plan"],
            [[name, plan["custom"], plan["generic"]] for name, plan in history.plans.items()],
        )
    )
    seq_on_history = sorted(
        name
        for name, plan in history.plans.items()
        for kind in ("custom", "generic")
        if any(f"Seq Scan on {t}" in plan[kind] for t in HISTORY_TABLES)
    )
    out.append("")
    out.append(
        "sequential scans of history tables in the history database's plans: "
        + (", ".join(seq_on_history) if seq_on_history else "none")
    )
    out.append("")
    out.append(
        "Scan counters over the measuring window (pg_stat_user_tables deltas over the warm-up,"
        " measured and traced cycles). The empty database's tables hold 1 to a few hundred"
        " rows, so its plans read them sequentially, the cheapest plan at that size:"
    )
    out.append("")
    scan_rows = []
    for phase in phases:
        for name, delta in phase.scan_deltas().items():
            if name not in (*HISTORY_TABLES, "job_definition"):
                continue
            scan_rows.append(
                [
                    phase.name,
                    name,
                    f"{phase.counters_after[name]['rows']:,}",
                    phase.cycles_in_window,
                    delta["seq_scan"],
                    f"{delta['seq_tup_read']:,}",
                    delta["idx_scan"],
                    f"{delta['idx_scan'] / max(1, phase.cycles_in_window):.2f}",
                ]
            )
    out.append(
        table(
            [
                "phase",
                "table",
                "live rows (estimate)",
                "cycles",
                "seq scans",
                "rows read by seq scans",
                "index scans",
                "index scans per cycle",
            ],
            scan_rows,
        )
    )
    document = {
        "machine": dict(machine),
        "parameters": {
            "history": args.history,
            "launches": args.launches,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "traced_cycles": TRACED_CYCLES,
            "target_ratio": TARGET_RATIO,
        },
        "phases": summaries,
        "ratio_of_medians": ratios,
        "ratio_of_work_medians": work_ratios,
        "ratio_met": met,
        "cycle_ratio_per_round": [round(r, 3) for r in round_ratios],
        "statements_constant": constant,
        "wire": {
            p.name: {
                "sequence": list(p.wire[0].sequence),
                "round_trips": p.wire[0].round_trips,
                "identical_sequences": len({w.sequence for w in p.wire}) == 1,
            }
            for p in phases
        },
        "plans": {p.name: p.plans for p in phases},
        "full_page_images_in_window": {p.name: p.full_page_images for p in phases},
        "cycles_in_fpi_window": args.launches + TRACED_CYCLES,
        "scan_deltas": {p.name: p.scan_deltas() for p in phases},
        "samples_ms": {
            p.name: {
                "launch": [ms(v) for v in p.launch_ns],
                "completion": [ms(v) for v in p.completion_ns],
                "client_cpu": [ms(v) for v in p.client_cpu_ns],
                "server_cpu": [ms(v) for v in p.server_cpu_ns],
            }
            for p in phases
        },
    }
    return "\n".join(out), document


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options; the defaults are the issue's figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.launch", description=__doc__)
    parser.add_argument(
        "--dsn",
        help="a server to use instead of an embedded one; its role needs CREATEDB (two"
        " scratch databases are created and dropped) and it must accept plaintext",
    )
    parser.add_argument("--history", type=int, default=100_000, help="prior executions to load")
    parser.add_argument("--launches", type=int, default=300, help="measured cycles per phase")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured cycles per phase")
    parser.add_argument(
        "--rounds", type=int, default=10, help="rounds (per-round ratios show the noise)"
    )
    parser.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="embedded server only: fsync on (default, what production pays) or off",
    )
    parser.add_argument(
        "--isolation",
        action="store_true",
        help="run the measured cycles as a job family role with isolation enabled"
        " (docs/dba.md, row-level security); compare with a run without it",
    )
    parser.add_argument(
        "--many-step-names",
        action="store_true",
        help="each loaded execution also ran a step of a name of its own (a date or tenant in"
        " the name): the measured step's name is then one of many in the statistics",
    )
    parser.add_argument(
        "--partitioned-plans",
        type=int,
        default=0,
        help="also load this many completed runs of a partitioned step of 1,000 partitions"
        " (with their worker steps) into the history: no run's end may read them",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    parser.add_argument(
        "--pooler",
        action="store_true",
        help="one-step jobs directly and through PgBouncer in session and transaction mode,"
        " side by side (bench.pooler)",
    )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not 0 <= args.history < LAUNCH_KEY_BASE:
        parser.error("--history must be between 0 and 10**12")
    if args.partitioned_plans < 0 or (args.partitioned_plans and not args.history):
        parser.error("--partitioned-plans needs a --history and must not be negative")
    if args.launches < 1 or args.rounds < 1 or args.launches < args.rounds or args.warmup < 0:
        parser.error("need --launches >= --rounds >= 1 and --warmup >= 0")
    return args


def command_line(argv: Sequence[str]) -> str:
    """The command as run, with a --dsn value (it may hold a password) replaced by DSN."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            shown.append("DSN")
            hide_next = False
        elif arg == "--dsn":
            shown.append(arg)
            hide_next = True
        elif arg.startswith("--dsn="):
            shown.append("--dsn=DSN")
        else:
            shown.append(arg)
    return shlex.join(["python", "-m", "bench.launch", *shown])


def is_local(dsn: str | None) -> bool:
    """Whether the server runs on this machine, so its processes' CPU time can be read."""
    if dsn is None:
        return True
    host = conninfo_to_dict(dsn).get("host") or os.environ.get("PGHOST", "")
    return str(host).startswith("/") or str(host) in ("", "localhost", "127.0.0.1", "::1")


def progress(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the report."""
    print(f"[bench.launch] {message}", file=sys.stderr, flush=True)


def prepare_phase(
    phase: Phase,
    history: int,
    *,
    isolation: bool = False,
    many_names: bool = False,
    partitioned_plans: int = 0,
) -> float:
    """Migrate, prime, load (history phase), VACUUM ANALYZE; returns the load seconds.

    With `isolation`, docs/dba.md's isolation is enabled and the measured cycles run as a
    job family role whose prefix covers the benchmark's job name.
    """
    config = config_for(phase.dsn)
    migrate(config)
    phase.pybatch_dsn = (
        isolate(phase.dsn, ISOLATION_ROLE, ISOLATION_PREFIX) if isolation else phase.dsn
    )
    with JobRepository.connect(config) as repository:
        # The first launch of a job name registers its legacy definition (its launch finds
        # it unregistered): do it before loading, so the history can reference it.
        legacy = DefinitionIdentity.LEGACY
        repository.run_in_unit_of_work(lambda uow: uow.definitions.register(JOB, legacy))
        run_cycle(repository, phase.take_run())
    seconds = 0.0
    if history:
        progress(f"loading {history:,} executions into the {phase.name} database")
        seconds = load_history(phase.dsn, history, many_names=many_names)
        validate_history(phase.dsn, history)
        if partitioned_plans:
            progress(f"loading {partitioned_plans:,} partitioned runs of {PLAN_WIDTH:,} partitions")
            seconds += load_partitioned_history(phase.dsn, history + 1, partitioned_plans)
    vacuum_analyze(phase.dsn)
    return seconds


def measure(
    args: argparse.Namespace, server_dsn: str, *, server_is_local: bool
) -> tuple[str, dict[str, Any]]:
    """Run the whole comparison on one server; returns the report and the JSON document."""
    recorder = StatementRecorder()
    with (
        scratch_database(server_dsn, "empty") as empty_dsn,
        scratch_database(server_dsn, "history") as history_dsn,
        recorder.installed(),
        contextlib.ExitStack() as repositories,
    ):
        machine = machine_facts(server_dsn)
        empty = Phase("empty", empty_dsn, 0)
        history = Phase("history", history_dsn, args.history)
        phases = (empty, history)
        prepare_phase(empty, 0, isolation=args.isolation)
        machine["history_load_seconds"] = prepare_phase(
            history,
            args.history,
            isolation=args.isolation,
            many_names=args.many_step_names,
            partitioned_plans=args.partitioned_plans,
        )
        machine["isolation"] = args.isolation
        machine["many_step_names"] = args.many_step_names
        machine["partitioned_plans"] = args.partitioned_plans
        inspect = enable_walinspect(history.dsn)
        machine["checkpoint_before_measuring"] = checkpoint(server_dsn)
        wal = repositories.enter_context(admin_connect(server_dsn))
        for phase in phases:
            phase.executions_before = execution_count(phase.dsn) + args.warmup
            wait_for_sessions(phase.dsn)
            phase.counters_before = table_counters(phase.dsn)
            phase.repository = repositories.enter_context(
                JobRepository.connect(config_for(phase.pybatch_dsn))
            )
            if server_is_local:
                phase.server_pid = pool_connection(phase.repository).info.backend_pid
            progress(f"warming up the {phase.name} database ({args.warmup} cycles)")
            for _ in range(args.warmup):
                phase.cycle(recorder)
            phase.statements.clear()
        progress(f"measuring {args.launches} cycles per phase in {args.rounds} rounds")
        window_start = flush_lsn(wal)
        for number in range(args.rounds):
            share = args.launches // args.rounds + (number < args.launches % args.rounds)
            samples: dict[str, list[Sample]] = {phase.name: [] for phase in phases}
            gc.collect()
            gc.disable()
            try:
                for index in range(share):
                    # Cycle by cycle, ABBA: both databases see the same moments of load.
                    for phase in phases if (number + index) % 2 == 0 else phases[::-1]:
                        samples[phase.name].append(phase.cycle(recorder))
            finally:
                gc.enable()
            for phase in phases:
                phase.record(samples[phase.name])
        progress(f"tracing {TRACED_CYCLES} untimed cycles per phase")
        for phase in phases:
            assert phase.repository is not None
            conn = pool_connection(phase.repository)
            if phase.server_pid not in (None, conn.info.backend_pid):
                raise RuntimeError("the pool replaced its connection: CPU times are void")
            for number in range(TRACED_CYCLES):
                recorder.capture = phase.calls if number == TRACED_CYCLES - 1 else None
                before = wal_position(wal)
                phase.wire.append(traced_cycle(phase.repository, conn, phase.take_run(), recorder))
                phase.wal_bytes.append(wal_position(wal) - before)
                phase.cycles_in_window += 1
            recorder.capture = None
        window_end = flush_lsn(wal)
        repositories.close()
        machine["load_average_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        progress("reading scan counters and plans")
        images = full_page_images(history.dsn, window_start, window_end) if inspect else None
        for phase in phases:
            wait_for_sessions(phase.dsn)
            phase.counters_after = table_counters(phase.dsn)
            # As the role the cycles ran as: with --isolation the plans include the policies'
            # subplans, so the sequential-scan check below covers them too.
            phase.plans = explain(phase.pybatch_dsn or phase.dsn, phase.calls)
            if images is not None:
                database, files = relation_files(phase.dsn)
                phase.full_page_images = {
                    name: images[(database, node)]
                    for node, name in files.items()
                    if images[(database, node)]
                }
        machine["command"] = command_line(args.argv)
        return report(machine, args, empty, history)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m bench.launch`."""
    args = parse_args(argv)
    if args.pooler:
        from bench import pooler

        return pooler.main(["--dsn", args.dsn] if args.dsn else [], workload="launch")
    with postgres_server(args.dsn, fsync=args.fsync) as server_dsn:
        text, document = measure(args, server_dsn, server_is_local=is_local(args.dsn))
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    progress(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
