"""Chunks and launches directly and through PgBouncer (session and transaction mode), side by side.

    python -m bench.pooler [--dsn DSN] [--workload chunks|launch|both] [--rows 20000]
                           [--launches 100] [--repeat 3]

The same server, three ways in: `direct` (pybatch's settings in the startup options),
`session` (PgBouncer pool_mode=session, PYBATCH_POOLER=session: settings set once per
connection) and `transaction` (pool_mode=transaction, PYBATCH_POOLER=transaction: every
transaction sets them, nothing is prepared). The three rotate over rounds, so each sees the
same moments of a busy machine, and the ratios are against `direct`.

* chunks: one job run loading `--rows` rows in chunks of 100, by `executemany` and by COPY,
  timed over the chunk loop (`with step.chunk()`, the writes, `chunk.commit(...)`);
* launch: `--launches` one-step jobs in a row, each launched and completed through the ETL
  API (`Job(...).launch()`, `run.step(...)`), timed per job.

PgBouncer is Debian's `pgbouncer` (apt-get install pgbouncer), started on free loopback ports
in front of the server (tests/support/pgbouncer.py). Without `--dsn` an EmbeddedPostgres with
fsync on is started.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import psycopg.conninfo

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import gc_paused, make_rows
from pybatch import ConnectionConfig, JobRepository, Pooler, TlsMode, migrate
from pybatch.etl import Job, StepRun
from tests.support.pgbouncer import pgbouncer

MODES = ("direct", "session", "transaction")
CHUNK = 100
TABLE_SQL = (
    "CREATE TABLE bench_item_pooler (id BIGINT PRIMARY KEY, name TEXT NOT NULL,"
    " amount BIGINT NOT NULL)"
)
INSERT_SQL = "INSERT INTO bench_item_pooler (id, name, amount) VALUES (%s, %s, %s)"
COPY_SQL = "COPY bench_item_pooler (id, name, amount) FROM STDIN"


@contextmanager
def ways_in(dsn: str) -> Iterator[dict[str, ConnectionConfig]]:
    """The scratch database directly and through a PgBouncer of each mode."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    port, user, dbname = int(str(info["port"])), str(info["user"]), str(info["dbname"])
    configs = {"direct": ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT)}
    with ExitStack() as stack:
        for mode in ("session", "transaction"):
            bouncer = stack.enter_context(pgbouncer(server_port=port, user=user, pool_mode=mode))
            configs[mode] = ConnectionConfig(
                dsn=bouncer.dsn(user=user, dbname=dbname),
                tls_mode=TlsMode.PLAINTEXT,
                pooler=Pooler(mode),
            )
        yield configs


def chunk_seconds(
    repository: JobRepository, dsn: str, rows: Sequence[tuple[int, str, int]], method: str, run: int
) -> float:
    """One job run loading `rows` by `method`; the seconds of its chunk loop."""
    with admin_connect(dsn) as conn:
        conn.execute("TRUNCATE bench_item_pooler")
    timed: list[float] = []

    def work(step: StepRun) -> None:
        started = time.perf_counter()
        for offset in range(0, len(rows), CHUNK):
            batch = rows[offset : offset + CHUNK]
            with step.chunk() as chunk:
                if method == "copy":
                    chunk.copy(COPY_SQL, batch)
                else:
                    chunk.executemany(INSERT_SQL, batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"o": offset})
        timed.append(time.perf_counter() - started)

    with gc_paused(), Job(repository, "bench_pooler_chunks", run_id=run).launch() as job_run:
        job_run.step("load", work)
    return timed[0]


def launch_seconds(repository: JobRepository, launches: int, first_run: int) -> list[float]:
    """`launches` one-step jobs in a row; the seconds of each, launch to completion."""
    seconds = []
    with gc_paused():
        for run in range(first_run, first_run + launches):
            started = time.perf_counter()
            with Job(repository, "bench_pooler_launch", run_id=run).launch() as job_run:
                job_run.step("noop", lambda step: None)
            seconds.append(time.perf_counter() - started)
    return seconds


def measure(
    dsn: str, workload: str, rows: int, launches: int, repeat: int
) -> dict[str, dict[str, list[float]]]:
    """Per measure and way in, the timings of every round (the ways rotate over rounds)."""
    with admin_connect(dsn) as conn:
        conn.execute(TABLE_SQL)
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    data = make_rows(rows)
    measures = []
    if workload in ("chunks", "both"):
        measures += ["100 executemany", "100 copy"]
    if workload in ("launch", "both"):
        measures.append("one-step job")
    results: dict[str, dict[str, list[float]]] = {m: {mode: [] for mode in MODES} for m in measures}
    run = 0
    with ways_in(dsn) as configs, ExitStack() as stack:
        repositories = {
            mode: stack.enter_context(JobRepository.connect(configs[mode])) for mode in MODES
        }
        for round_ in range(repeat):
            order = MODES[round_ % 3 :] + MODES[: round_ % 3]
            for mode in order:
                repository = repositories[mode]
                for name in measures:
                    run += launches + 1
                    if name == "one-step job":
                        results[name][mode] += launch_seconds(repository, launches, run)
                    else:
                        method = name.split()[1]
                        results[name][mode].append(
                            chunk_seconds(repository, dsn, data, method, run)
                        )
            print(f"  round {round_ + 1}/{repeat} done ({', '.join(order)})", flush=True)
    return results


def report(results: dict[str, dict[str, list[float]]], rows: int) -> str:
    lines = [
        "| measure | direct | session | transaction | session / direct | transaction / direct |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, by_mode in results.items():
        if name == "one-step job":
            rate = {mode: 1 / statistics.median(times) for mode, times in by_mode.items()}
            unit = "jobs/s"
        else:
            rate = {mode: rows / statistics.median(times) for mode, times in by_mode.items()}
            unit = "items/s"
        cells = [f"{rate[mode]:,.0f} {unit}" for mode in MODES]
        ratios = [f"{rate[mode] / rate['direct']:.2f}" for mode in ("session", "transaction")]
        lines.append(f"| {name} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, *, workload: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pooler",
        description="Chunks and launches directly and through PgBouncer, side by side.",
    )
    parser.add_argument("--dsn", help="use this server (its role needs CREATEDB)")
    parser.add_argument("--workload", choices=["chunks", "launch", "both"], default="both")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per chunk run (20000)")
    parser.add_argument("--launches", type=int, default=100, help="jobs per launch run (100)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds over the three ways (3)")
    args = parser.parse_args(argv)
    if args.rows < CHUNK or args.launches < 1 or args.repeat < 1:
        parser.error("--rows must be at least 100, --launches and --repeat at least 1")
    chosen = workload or args.workload
    with postgres_server(args.dsn) as server, scratch_database(server, "pooler") as dsn:
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}")
        print(
            f"workload: {chosen}; {args.rows:,} rows in chunks of {CHUNK}, {args.launches}"
            f" one-step jobs, {args.repeat} rounds over {', '.join(MODES)}"
        )
        results = measure(dsn, chosen, args.rows, args.launches, args.repeat)
    print(f"load average at the end: {os.getloadavg()}")
    print(report(results, args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
