"""What a partition costs when its row alone records the claim: a floor for a redesign.

    python -m bench.partition_row [--dsn DSN] [--partitions 300] [--rounds 4]

A no-op partition through pybatch writes a worker step row (inserted at the claim, ended at
the partition's end, mirrored onto the partition): about three times the CPU of a hand-written
queue's two transactions (docs/scaling.md). This module measures, in one run and one process,
three loops over plans of `--partitions` no-op partitions, the sides rotating round by round:

* queue: bench.partitions' hand-written SKIP LOCKED loop (claim + COMMIT, mark done + COMMIT);
* row protocol: the least a fenced partition could cost with no worker step - one statement per
  partition that ends the previous partition (fenced by its owner token and version, under the
  parent's share lock) and claims the next (SKIP LOCKED, a new owner token, a lease on the
  database clock), on a table shaped like `pybatch.step_partition` with a checkpoint column and a
  row-rules trigger like pybatch's. It is a design study, not pybatch: no audit, no fault state,
  no recovery, a minimal Python loop;
* pybatch: `work_on_plan` as a worker runs it today (bench.partitions' cost loop), timed.

Per partition it prints wall time, this process's CPU and the server backend's CPU
(/proc/PID/schedstat; local server only), medians over rounds, and the queue's wall time over
each side's. Without `--dsn` an EmbeddedPostgres is started with fsync on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import partitions as bp
from bench._server import postgres_server, scratch_database
from bench.chunks import machine_info, print_machine, write_results
from pybatch import migrate

ROW_TABLES_SQL = (
    "CREATE TABLE row_parent (id BIGINT PRIMARY KEY, status TEXT NOT NULL)",
    """CREATE TABLE row_partition (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        parent_id BIGINT NOT NULL REFERENCES row_parent (id),
        partition_key TEXT NOT NULL,
        partition_ordinal INTEGER NOT NULL,
        status TEXT NOT NULL,
        exit_code TEXT NOT NULL DEFAULT 'UNKNOWN',
        read_count BIGINT NOT NULL DEFAULT 0,
        write_count BIGINT NOT NULL DEFAULT 0,
        commit_count BIGINT NOT NULL DEFAULT 0,
        context_payload JSONB NOT NULL,
        context_checksum BYTEA NOT NULL,
        checkpoint_payload JSONB NOT NULL DEFAULT '{}',
        attempt INTEGER NOT NULL DEFAULT 0,
        version BIGINT NOT NULL DEFAULT 0,
        owner_token BYTEA,
        lease_expires_at TIMESTAMPTZ,
        started_at TIMESTAMPTZ,
        ended_at TIMESTAMPTZ,
        UNIQUE (parent_id, partition_key),
        UNIQUE (parent_id, partition_ordinal)
    )""",
    "CREATE INDEX row_partition_unclaimed ON row_partition (parent_id, partition_ordinal)"
    " WHERE status = 'STARTING'",
    """CREATE FUNCTION row_partition_rules() RETURNS TRIGGER LANGUAGE plpgsql AS $$
    DECLARE broken TEXT;
    BEGIN
        broken := CASE
            WHEN NOT (NEW.read_count >= 0) THEN 'read_count'
            WHEN NOT (NEW.write_count >= 0) THEN 'write_count'
            WHEN NOT (NEW.commit_count >= 0) THEN 'commit_count'
            WHEN NOT (octet_length(NEW.context_checksum) = 32) THEN 'context_checksum'
            WHEN NOT (NEW.status IN ('STARTING', 'STARTED', 'STOPPING', 'STOPPED', 'FAILED',
                'COMPLETED', 'ABANDONED', 'UNKNOWN')) THEN 'status'
            WHEN NOT (NEW.lease_expires_at IS NULL OR NEW.owner_token IS NOT NULL) THEN 'lease'
            WHEN NOT (NEW.owner_token IS NULL OR NEW.status = 'STARTED') THEN 'owner'
        END;
        IF broken IS NOT NULL THEN RAISE EXCEPTION 'rule % broken', broken; END IF;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER row_partition_rules AFTER INSERT OR UPDATE ON row_partition"
    " FOR EACH ROW EXECUTE FUNCTION row_partition_rules()",
)

END_AND_CLAIM = """
WITH parent AS (
    SELECT id FROM row_parent WHERE id = %(parent)s AND status = 'STARTED' FOR SHARE
),
ended AS (
    UPDATE row_partition AS p
    SET status = %(status)s, exit_code = %(status)s, owner_token = NULL,
        lease_expires_at = NULL, ended_at = clock_timestamp(), version = p.version + 1
    WHERE p.id = %(ended_id)s AND p.version = %(ended_version)s
        AND p.owner_token = %(owner)s AND p.status = 'STARTED' AND EXISTS (SELECT 1 FROM parent)
    RETURNING p.id
),
picked AS (
    SELECT p.id, p.version FROM row_partition AS p
    WHERE p.parent_id = %(parent)s AND p.status = 'STARTING' AND EXISTS (SELECT 1 FROM parent)
        AND (CAST(%(ended_id)s AS BIGINT) IS NULL OR EXISTS (SELECT 1 FROM ended))
    ORDER BY p.partition_ordinal
    LIMIT 1
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE row_partition AS p
    SET status = 'STARTED', owner_token = %(new_owner)s, attempt = p.attempt + 1,
        lease_expires_at = clock_timestamp() + INTERVAL '30 seconds',
        started_at = clock_timestamp(), version = p.version + 1
    FROM picked
    WHERE p.id = picked.id AND p.version = picked.version
    RETURNING p.id, p.partition_key, p.partition_ordinal, p.context_payload,
        p.context_checksum, p.checkpoint_payload, p.read_count, p.write_count,
        p.commit_count, p.attempt, p.version
)
SELECT (SELECT id FROM ended) AS ended, c.*
FROM (SELECT 1) AS one LEFT JOIN claimed AS c ON TRUE
"""


def publish_row_plan(conn: psycopg.Connection[Any], parent: int, n: int) -> None:
    conn.execute("INSERT INTO row_parent VALUES (%s, 'STARTED')", (parent,))
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO row_partition (parent_id, partition_key, partition_ordinal, status,"
            " context_payload, context_checksum) VALUES (%s, %s, %s, 'STARTING', %s, %s)",
            [(parent, f"p{i:04d}", i + 1, '{"first": 1}', bytes(32)) for i in range(n)],
        )


def row_protocol_loop(conn: psycopg.Connection[Any], parent: int) -> int:
    """End the last partition and claim the next in one statement, until none is left."""
    ended: tuple[Any, Any, Any] = (None, None, None)
    ran = 0
    cursor = conn.cursor(row_factory=dict_row)
    while True:
        owner = os.urandom(16)
        params = {
            "parent": parent,
            "status": "COMPLETED",
            "ended_id": ended[0],
            "ended_version": ended[1],
            "owner": ended[2],
            "new_owner": owner,
        }
        row = cursor.execute(END_AND_CLAIM, params, prepare=True).fetchone()
        assert row is not None
        if ended[0] is not None and row["ended"] != ended[0]:
            raise AssertionError("the end was refused")
        if row["id"] is None:
            return ran
        ended = (row["id"], row["version"], owner)
        ran += 1


Measured = tuple[float, float, float]  # wall, client CPU, server CPU (seconds)


def measure(pid: int, run: Callable[[], object]) -> Measured:
    server, cpu, wall = bp.backend_cpu_ns(pid), time.process_time(), time.perf_counter()
    run()
    return (
        time.perf_counter() - wall,
        time.process_time() - cpu,
        (bp.backend_cpu_ns(pid) - server) / 1e9,
    )


def queue_side(dsn: str, n: int) -> Measured:
    label = f"row-study-{time.time_ns()}"
    bp._fill_queue(dsn, label, n)
    with psycopg.connect(dsn) as conn:
        return measure(conn.info.backend_pid, lambda: bp._baseline_loop(conn, label, False))


def row_side(dsn: str, n: int) -> Measured:
    parent = time.time_ns()
    with psycopg.connect(dsn, autocommit=True) as conn:
        publish_row_plan(conn, parent, n)
        return measure(conn.info.backend_pid, lambda: row_protocol_loop(conn, parent))


def pybatch_side(dsn: str, n: int) -> Measured:
    """One in-process worker's loop over a published plan of `n` no-op partitions."""
    return bp._pybatch_worker(dsn, n, False, trace=False)[1:]


SIDES: dict[str, Callable[[str, int], Measured]] = {
    "queue": queue_side,
    "row protocol": row_side,
    "pybatch": pybatch_side,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument("--partitions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    n = args.partitions
    with postgres_server(args.dsn) as server, scratch_database(server, "partition_row") as dsn:
        migrate(bp.config(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in (*bp.TABLES_SQL, *ROW_TABLES_SQL):
                conn.execute(statement)
        machine = machine_info(dsn)
        print_machine(machine)
        for side in SIDES.values():  # warm-up: plans, caches
            side(dsn, 20)
        samples: dict[str, list[Measured]] = {name: [] for name in SIDES}
        names = list(SIDES)
        for round_number in range(args.rounds):
            order = names[round_number % 3 :] + names[: round_number % 3]
            for name in order:
                samples[name].append(SIDES[name](dsn, n))
        print(f"\nPer no-op partition, {n} per plan, medians of {args.rounds} rounds:\n")
        print("| side | wall (ms) | client CPU (ms) | server CPU (ms) | queue wall / side wall |")
        print("|---|---:|---:|---:|---:|")
        medians = {
            name: [statistics.median(s[i] for s in values) * 1000 / n for i in range(3)]
            for name, values in samples.items()
        }
        for name, (wall, client, server_cpu) in medians.items():
            print(
                f"| {name} | {wall:.3f} | {client:.3f} | {server_cpu:.3f} |"
                f" {medians['queue'][0] / wall:.2f} |"
            )
        path = write_results(
            "partition_row",
            {"machine": machine, "partitions": n, "per_partition_ms": medians},
        )
        print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
