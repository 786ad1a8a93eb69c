"""Throughput of `StepRun.load` with 0, 1 and 10 bad rows per 10,000, beside a plain load.

    python -m bench.fault_tolerance [--dsn DSN] [--rows 100000] [--repeat 1] [--size 1000]

Each run is a new job instance with one step loading `--rows` rows by COPY in chunks of
`--size` into a table whose CHECK rejects a negative amount, timed over the step's work only.
The sides, alternated `--repeat` times each:

* plain: the hand-written chunk loop (`with step.chunk()`, `chunk.copy`, `chunk.commit`)
  over a source without bad rows: what a load costs without fault tolerance;
* load 0: `step.load` over the same clean source (its overhead when nothing fails);
* load 1, load 10: `step.load` over a source with 1 or 10 bad rows per 10,000, at positions
  drawn from a fixed seed; each bad row costs its chunk's bisection (about 2 log2(size)
  COPYs of shrinking halves, each in a savepoint) and a skip record.

An untimed 10,000-row plain run warms the server and the connections up first. Printed: the
load average, each side's median throughput, its write calls and skips, its ratio to plain,
and its client and server CPU per 1,000 rows (the server's when its backends are on this
machine), which a busy machine distorts less than throughput.
Without `--dsn` an EmbeddedPostgres is started. Keep runs short on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Iterator, Sequence

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import ServerCpu, gc_paused, make_rows, pybatch_repository
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch._config import APPLICATION_NAME
from pybatch.etl import Chunk, Job, StepRun

TABLE_SQL = (
    "CREATE TABLE bench_item_fault (id BIGINT PRIMARY KEY, name TEXT NOT NULL,"
    " amount BIGINT NOT NULL CONSTRAINT bench_item_fault_amount_nonnegative CHECK (amount >= 0))"
)
COPY_SQL = "COPY bench_item_fault (id, name, amount) FROM STDIN"
Row = tuple[int, str, int]
#: Bad rows per 10,000 of each `step.load` side.
BAD_PER_10K = {"load 0": 0, "load 1": 1, "load 10": 10}
SIDES = ("plain", *BAD_PER_10K)


def source(rows: int, bad_per_10k: int, seed: int = 20261204) -> list[Row]:
    """`rows` rows, of which `bad_per_10k` per 10,000 (at seeded positions) break the CHECK."""
    data = make_rows(rows)
    bad = random.Random(seed).sample(range(rows), rows * bad_per_10k // 10_000)
    for position in bad:
        row_id, name, _ = data[position]
        data[position] = (row_id, name, -1)
    return data


#: One run of a side: seconds, write calls, skips, client CPU seconds, server CPU seconds.
Run = tuple[float, int, int, float, float | None]


def run_once(
    repository: JobRepository,
    dsn: str,
    side: str,
    data: list[Row],
    size: int,
    run_id: int,
    cpu: ServerCpu,
) -> Run:
    """Load `data` as one job run, timing the step's work only."""
    with admin_connect(dsn) as conn:
        conn.execute("TRUNCATE bench_item_fault")
    timed: list[float] = []
    used: list[float | None] = []
    calls = [0]
    skipped = [0]

    def read(position: int) -> Iterator[Row]:
        return iter(data[position:])

    def write(chunk: Chunk, items: list[Row]) -> None:
        calls[0] += 1
        chunk.copy(COPY_SQL, items)

    def plain(step: StepRun) -> None:
        for offset in range(0, len(data), size):
            batch = data[offset : offset + size]
            with step.chunk() as chunk:
                write(chunk, batch)
                chunk.commit(
                    read=len(batch), written=len(batch), checkpoint={"position": offset + size}
                )

    def tolerant(step: StepRun) -> None:
        result = step.load(read, write, chunk_size=size, skip_limit=len(data))
        skipped[0] = result.skipped

    def work(step: StepRun) -> None:
        backends = cpu.snapshot(APPLICATION_NAME)
        client = time.process_time()
        started = time.perf_counter()
        (plain if side == "plain" else tolerant)(step)
        timed.extend((time.perf_counter() - started, time.process_time() - client))
        used.append(cpu.since(backends))

    with gc_paused(), Job(repository, "bench_fault_tolerance", run_id=run_id).launch() as run:
        run.step("load", work)
    return timed[0], calls[0], skipped[0], timed[1], used[0]


def measure(dsn: str, rows: int, repeat: int, size: int) -> dict[str, list[Run]]:
    """Alternate the sides (`repeat` runs each); return each side's runs."""
    with admin_connect(dsn) as conn:
        conn.execute(TABLE_SQL)
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    clean = source(rows, 0)
    data = {"plain": clean, **{side: source(rows, bad) for side, bad in BAD_PER_10K.items()}}
    results: dict[str, list[Run]] = {side: [] for side in SIDES}
    run_id = 1  # the warm-up's
    cpu = ServerCpu(dsn, local=False)
    with pybatch_repository(dsn) as repository:
        run_once(repository, dsn, "plain", clean[:10_000], size, 1, cpu)  # untimed warm-up
        for round_ in range(repeat):
            order = SIDES if round_ % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                run_id += 1
                outcome = run_once(repository, dsn, side, data[side], size, run_id, cpu)
                results[side].append(outcome)
                print(
                    f"  round {round_ + 1}/{repeat} {side:>7}: "
                    f"{rows / outcome[0]:>9,.0f} items/s, {outcome[1]} writes, "
                    f"{outcome[2]} skipped",
                    flush=True,
                )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fault_tolerance",
        description="StepRun.load throughput with 0, 1 and 10 bad rows per 10,000.",
    )
    parser.add_argument("--dsn", help="use this server (its role needs CREATEDB)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per run (100000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side (1)")
    parser.add_argument("--size", type=int, default=1000, help="rows per chunk (1000)")
    args = parser.parse_args(argv)
    if args.rows < 10_000 or args.repeat < 1 or args.size < 1:
        parser.error("--rows must be at least 10000, and --repeat and --size at least 1")
    print("load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg()))
    with postgres_server(args.dsn) as server, scratch_database(server, "fault") as dsn:
        print(
            f"workload: {args.rows:,} rows by COPY in chunks of {args.size}, "
            f"{args.repeat} run(s) per side"
        )
        results = measure(dsn, args.rows, args.repeat, args.size)
    throughput = {
        side: args.rows / statistics.median(run[0] for run in runs)
        for side, runs in results.items()
    }

    def per_1000_rows(values: list[float | None]) -> str:
        known = [value for value in values if value is not None]
        return f"{statistics.median(known) / args.rows * 1e6:,.1f}" if known else "n/a"

    print(
        f"{'side':>8} {'items/s':>10} {'writes':>7} {'skipped':>8} {'vs plain':>9}"
        f" {'client CPU ms/1000 rows':>24} {'server CPU ms/1000 rows':>24}"
    )
    for side in SIDES:
        _, calls, skipped, _, _ = results[side][-1]
        ratio = throughput[side] / throughput["plain"]
        print(
            f"{side:>8} {throughput[side]:>10,.0f} {calls:>7} {skipped:>8} {ratio:>9.3f}"
            f" {per_1000_rows([run[3] for run in results[side]]):>24}"
            f" {per_1000_rows([run[4] for run in results[side]]):>24}"
        )
    print("load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
