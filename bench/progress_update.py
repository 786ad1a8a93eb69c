"""What the chunk's progress UPDATE costs the server, by the shape of the table it updates.

    python -m bench.progress_update [--dsn DSN] [--updates 3000] [--rounds 5] [--copy-rows 0]

Every chunk commit runs one compare-and-swap UPDATE of its step's row: the counters, the
checkpoint, `updated_at` and `version` (`update_step_chunk_progress` in queries/chunks.sql).
This benchmark runs that statement's own text, aimed at another table, in its own
`BEGIN; UPDATE; COMMIT` against copies of one STARTED step row in tables of four shapes:

* `step_execution` as migrated (`LIKE pybatch.step_execution INCLUDING ALL`): the domain
  columns, the five cross-column CHECK constraints and the indexes;
* the same without the table CHECK constraints (the domains stay);
* a narrow progress table: only the columns the chunk writes and its guard reads, on the
  same domains, with the one cross-column rule that involves them (`updated_at >=
  created_at`);
* a one-column table: the hand-written loop's `UPDATE ... SET "offset" = %s` (reference).

The shapes take turns round by round (the first one rotates), each on its own connection
with the statement prepared. The figure that matters is the server CPU per transaction,
read from /proc/<pid>/schedstat of each backend (local servers only), because on a shared
machine wall time mixes in everybody else's work; wall time is printed too. The total size
of the stored CHECK expressions (`pg_constraint.conbin`) is printed per shape: PostgreSQL
reads every table CHECK back from that text and prepares it again at each execution of an
UPDATE, while a domain's CHECK is prepared once per session.

With `--copy-rows N` every transaction first COPYs N rows `(id, name, amount)` into a
business table of its own, as a chunk of the chunk benchmark does: each shape's transaction
is then a chunk that sends exactly pybatch's statements with no pybatch code on the client,
and the one-column shape is the chunk benchmark's hand-written loop. The printed ratio (the
loop's wall time over the shape's) is the best a chunk whose progress lives in that table
can reach against the loop.

Without `--dsn` an EmbeddedPostgres is started with fsync on. Results are printed and
written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import (
    ServerCpu,
    gc_paused,
    machine_info,
    print_machine,
    progress_update_on,
    write_results,
)
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch.etl import Job, StepRun

__all__ = ["SHAPES", "main"]

#: application_name of the benchmark's measuring connections.
APPLICATION = "pybatch-bench-progress"

ONE_COLUMN_UPDATE = 'UPDATE bench_one_column SET "offset" = %s WHERE id = 1'
BUSINESS_TABLE_SQL = (
    "CREATE TABLE business_{table} (id BIGINT PRIMARY KEY, name TEXT NOT NULL,"
    " amount BIGINT NOT NULL)"
)
BUSINESS_COPY_SQL = "COPY business_{table} (id, name, amount) FROM STDIN"
BUSINESS_TRUNCATE_SQL = "TRUNCATE business_{table}"

#: The owner token of the live execution the progress UPDATE's fence reads (bench_execution).
BENCH_OWNER = b"\x42" * 16
#: The fence's execution: a live copy of the step's execution, with BENCH_OWNER as its owner.
EXECUTION_SQL = (
    "CREATE TABLE bench_execution (id BIGINT PRIMARY KEY, owner_token BYTEA NOT NULL,"
    " status TEXT NOT NULL)",
    "INSERT INTO bench_execution SELECT job_execution_id, %s, 'STARTED'"
    " FROM pybatch.step_execution WHERE id = %s",
)
SETUP_SQL = (
    # as migrated: domains, CHECK constraints, indexes (foreign keys are not copied; an
    # UPDATE that keeps the keys skips their triggers' checks)
    "CREATE TABLE bench_step_migrated (LIKE pybatch.step_execution INCLUDING ALL)",
    "CREATE TABLE bench_step_no_checks"
    " (LIKE pybatch.step_execution INCLUDING DEFAULTS INCLUDING INDEXES)",
    "CREATE TABLE bench_step_narrow ("
    " id BIGINT PRIMARY KEY, job_execution_id BIGINT NOT NULL,"
    " status pybatch.batch_status NOT NULL, version pybatch.nonnegative_count NOT NULL,"
    " read_count pybatch.nonnegative_count NOT NULL,"
    " processed_count pybatch.nonnegative_count NOT NULL,"
    " write_count pybatch.nonnegative_count NOT NULL,"
    " filter_count pybatch.nonnegative_count NOT NULL,"
    " commit_count pybatch.nonnegative_count NOT NULL,"
    " checkpoint_schema pybatch.name_128 NOT NULL,"
    " checkpoint_schema_version pybatch.state_schema_version NOT NULL,"
    " checkpoint_payload pybatch.jsonb_document NOT NULL,"
    " created_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL,"
    " CONSTRAINT bench_step_narrow_updated_order CHECK (updated_at >= created_at))",
    'CREATE TABLE bench_one_column (id INTEGER PRIMARY KEY, "offset" BIGINT NOT NULL)',
    'INSERT INTO bench_one_column (id, "offset") VALUES (1, 0)',
)
COPY_ROW_SQL = (
    "INSERT INTO {table} SELECT * FROM pybatch.step_execution WHERE id = %s",
    "INSERT INTO bench_step_narrow SELECT id, job_execution_id, status, version, read_count,"
    " processed_count, write_count, filter_count, commit_count, checkpoint_schema,"
    " checkpoint_schema_version, checkpoint_payload, created_at, updated_at"
    " FROM pybatch.step_execution WHERE id = %s",
)
# The copied row is the step as it ended; put it back in STARTED (one statement per table,
# so that the copied CHECKs hold at every moment).
REOPEN_SQL = (
    "UPDATE bench_step_narrow SET status = 'STARTED', version = 0",
    "UPDATE {table} SET status = 'STARTED', ended_at = NULL, exit_code = 'EXECUTING', version = 0",
)
STEP_KEY_SQL = "SELECT id, job_execution_id FROM {table}"
CHECK_TEXT_SQL = (
    "SELECT COUNT(*), COALESCE(SUM(LENGTH(pg_get_expr(conbin, conrelid, false))), 0),"
    " COALESCE(SUM(LENGTH(conbin::TEXT)), 0)"
    " FROM pg_constraint WHERE conrelid = %s::REGCLASS AND contype = 'c'"
)


@dataclass(frozen=True)
class Shape:
    """One table the progress UPDATE runs against."""

    name: str
    table: str
    progress: bool  # the chunk's UPDATE (True) or the one-column reference


SHAPES = (
    Shape("step_execution as migrated", "bench_step_migrated", True),
    Shape("the same, no table CHECKs", "bench_step_no_checks", True),
    Shape("narrow progress table", "bench_step_narrow", True),
    Shape("one column (the loop's UPDATE)", "bench_one_column", False),
)


@dataclass
class Measured:
    """Per-round figures of one shape, per transaction."""

    wall_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    checks: tuple[int, int, int] = (0, 0, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_us": self.wall_us,
            "server_us": self.server_us,
            "check_constraints": self.checks[0],
            "check_source_chars": self.checks[1],
            "check_stored_chars": self.checks[2],
        }


def started_step_row(dsn: str) -> int:
    """Run a one-chunk step through the ETL API; return its step execution id."""
    ids: list[int] = []

    def load(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=100, written=100, checkpoint={"offset": 100})
        ids.append(int(step.execution.id))

    with (
        JobRepository.connect(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT)) as repository,
        Job(repository, "bench_progress_update", {"run": 1}).launch() as run,
    ):
        run.step("load", load)
    return ids[0]


def prepare(dsn: str) -> None:
    """Untimed: the four tables, each holding a STARTED copy of one real step row."""
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    step_id = started_step_row(dsn)
    with admin_connect(dsn) as conn:
        for statement in SETUP_SQL:
            conn.execute(statement)
        conn.execute(EXECUTION_SQL[0])
        conn.execute(EXECUTION_SQL[1], (BENCH_OWNER, step_id))
        for table in ("bench_step_migrated", "bench_step_no_checks"):
            conn.execute(COPY_ROW_SQL[0].format(table=table), (step_id,))
        conn.execute(COPY_ROW_SQL[1], (step_id,))
        for shape in SHAPES:
            conn.execute(BUSINESS_TABLE_SQL.format(table=shape.table))
        conn.execute(REOPEN_SQL[0])
        for table in ("bench_step_migrated", "bench_step_no_checks"):
            conn.execute(REOPEN_SQL[1].format(table=table))


#: `updated_at` candidate of every UPDATE (GREATEST keeps the row's own when it is later).
NOW = "2026-01-01T00:00:00+00:00"


def run_round(
    conn: psycopg.Connection[Any],
    shape: Shape,
    step_key: tuple[int, int],
    updates: int,
    cpu: ServerCpu,
    first: int,
    copy_rows: int,
) -> tuple[float, float | None]:
    """`updates` transactions of one UPDATE each (after a COPY of `copy_rows` rows, if any);
    (wall us, server CPU us) per transaction.

    Update n expects version n - 1: the versions run on from round to round.
    """
    copy_in = BUSINESS_COPY_SQL.format(table=shape.table)
    progress_sql = progress_update_on(shape.table, executions="bench_execution")
    batches = {  # built before the clock starts, as the chunk benchmark's rows are
        n: [(i, f"item-{i:09d}", i % 100_003) for i in range(n * copy_rows, (n + 1) * copy_rows)]
        for n in range(first, first + updates)
    }
    before = cpu.snapshot(APPLICATION + "-" + shape.table)
    started = time.perf_counter()
    with conn.cursor() as cursor:
        for n in range(first, first + updates):
            if copy_rows:
                with cursor.copy(copy_in) as writer:
                    for row in batches[n]:
                        writer.write_row(row)
            if shape.progress:
                cursor.execute(
                    progress_sql,
                    {
                        "read_count": n,
                        "processed_count": n,
                        "write_count": n,
                        "filter_count": 0,
                        "commit_count": n // 100,
                        "checkpoint_schema": "pybatch.etl.v1",
                        "checkpoint_schema_version": 1,
                        "checkpoint_payload": f'{{"offset":{n}}}',
                        "now": NOW,
                        "step_execution_id": step_key[0],
                        "job_execution_id": step_key[1],
                        "expected_version": n - 1,
                        "owner_token": BENCH_OWNER,
                    },
                    prepare=True,
                )
            else:
                cursor.execute(ONE_COLUMN_UPDATE, (n,), prepare=True)
            if cursor.rowcount != 1:
                raise RuntimeError(f"{shape.name}: the guarded UPDATE matched no row")
            conn.commit()
    wall = (time.perf_counter() - started) / updates * 1e6
    server = cpu.since(before)
    return wall, None if server is None else server / updates * 1e6


def measure(
    dsn: str, updates: int, rounds: int, cpu: ServerCpu, copy_rows: int
) -> dict[str, Measured]:
    prepare(dsn)
    results = {shape.table: Measured() for shape in SHAPES}
    conns: dict[str, psycopg.Connection[Any]] = {}
    step_keys: dict[str, tuple[int, int]] = {}  # (id, job_execution_id) of each copied row
    try:
        for shape in SHAPES:
            conn = psycopg.connect(dsn, application_name=APPLICATION + "-" + shape.table)
            conns[shape.table] = conn
            if shape.progress:
                row = conn.execute(STEP_KEY_SQL.format(table=shape.table)).fetchone()
                if row is None:
                    raise RuntimeError(f"{shape.table} holds no step row")
                step_keys[shape.table] = (int(row[0]), int(row[1]))
            conn.commit()
            results[shape.table].checks = _check_text(conn, shape.table)
        done = 0
        for round_ in range(rounds):
            order = SHAPES[round_ % len(SHAPES) :] + SHAPES[: round_ % len(SHAPES)]
            with gc_paused():
                for shape in order:
                    key = step_keys.get(shape.table, (1, 1))
                    wall, server = run_round(
                        conns[shape.table], shape, key, updates, cpu, done + 1, copy_rows
                    )
                    results[shape.table].wall_us.append(wall)
                    if server is not None:
                        results[shape.table].server_us.append(server)
            done += updates
            with admin_connect(dsn) as admin:  # untimed
                for shape in SHAPES:
                    admin.execute(BUSINESS_TRUNCATE_SQL.format(table=shape.table))
            print(f"  round {round_ + 1}/{rounds} done", flush=True)
    finally:
        for conn in conns.values():
            conn.close()
    return results


def _check_text(conn: psycopg.Connection[Any], table: str) -> tuple[int, int, int]:
    row = conn.execute(CHECK_TEXT_SQL, (table,)).fetchone()
    conn.commit()
    return (0, 0, 0) if row is None else (int(row[0]), int(row[1]), int(row[2]))


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(results: dict[str, Measured]) -> str:
    reference = results["bench_one_column"]
    ref_server = _median(reference.server_us)
    ref_wall = _median(reference.wall_us)
    lines = [
        "| table shape | table CHECKs (stored text, chars) | server CPU us / tx | "
        "minus one-column | wall us / tx | ratio: one-column wall / this |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for shape in SHAPES:
        measured = results[shape.table]
        server = _median(measured.server_us)
        count, _, stored = measured.checks
        lines.append(
            f"| {shape.name} | {count} ({stored:,}) | {server:,.0f} | {server - ref_server:+,.0f} "
            f"| {_median(measured.wall_us):,.0f} | {ref_wall / _median(measured.wall_us):.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.progress_update",
        description="Server cost of the chunk's progress UPDATE by table shape.",
    )
    parser.add_argument(
        "--dsn", help="use this server (its role needs CREATEDB); default: an embedded one"
    )
    parser.add_argument("--updates", type=int, default=3000, help="transactions per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per shape (5)")
    parser.add_argument(
        "--copy-rows",
        type=int,
        default=0,
        help="rows COPYed in before each UPDATE, as in a chunk (0: the UPDATE alone)",
    )
    args = parser.parse_args(argv)
    if args.updates < 100 or args.rounds < 1 or not 0 <= args.copy_rows <= 100_000:
        parser.error("--updates must be at least 100, --rounds at least 1, --copy-rows 0 to 100000")
    with postgres_server(args.dsn) as server, scratch_database(server, "progress") as dsn:
        machine = machine_info(dsn)
        print_machine(machine)
        cpu = ServerCpu(dsn, local=args.dsn is None)
        print(
            f"workload: {args.updates:,} transactions per round, {args.copy_rows} rows COPYed each"
        )
        results = measure(dsn, args.updates, args.rounds, cpu, args.copy_rows)
    machine["load_average_at_end"] = list(os.getloadavg())
    print()
    print(table(results))
    path = write_results(
        "progress_update",
        {
            "benchmark": "progress_update",
            "machine": machine,
            "updates": args.updates,
            "rounds": args.rounds,
            "copy_rows": args.copy_rows,
            "shapes": {shape.name: results[shape.table].to_json() for shape in SHAPES},
        },
    )
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
