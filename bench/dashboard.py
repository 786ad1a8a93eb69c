"""Dashboard page latency (p50, p95) over a generated history, and the plans of its statements.

Why: the dashboard is the explorer behind a web page, so each page must cost the same however
long the history is: a handful of bounded, index-backed statements in one read-only transaction,
plus rendering. This measures whole pages through the WSGI app (Flask's test client: routing,
the explorer's reads, Jinja rendering, headers; no socket) and shows that no statement scans a
history table.

    python -m bench.dashboard [--dsn DSN] [--executions 10000] [--names 100] [--samples 50]

Method: a scratch database migrated by pybatch and filled server-side by bench/explorer.py's
generator (`--executions` executions: one instance per two executions, one step each, every
100th instance with a recovery decision, an operator request and a two-partition plan, 500
unresolved); then every page kind is requested `--samples` times with ids drawn at random, after
one warm-up request each, and p50 and p95 are printed per page; then EXPLAIN (ANALYZE, BUFFERS) of
every explorer statement (bench/explorer.py's `explain_all`), flagging sequential scans of a
history table. The generated rows bypass the audit chain, so the audit page walks an empty chain
here: its cost grows with the chain (`pybatch audit verify` walks all of it) and is left out of
the size comparison. Run it at 1,000,000 executions with `--executions 1000000` (generation takes
a few minutes on a small machine). Without `--dsn` an embedded server is started.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable

from bench._server import postgres_server, scratch_database
from bench.explorer import explain_all, percentile, populate, shape
from pybatch import ConnectionConfig, JobRepository, TlsMode
from pybatch._dashboard import create_app
from pybatch._explorer import JobExplorer


def page_paths(params: dict[str, int], rng: random.Random) -> dict[str, Callable[[], str]]:
    """Page kind -> a function drawing one path of that kind (random ids in the history)."""
    instances = params["instances"]
    every100 = list(range(100, instances + 1, 100))

    def hot_name() -> str:
        return f"job_{rng.randint(1, params['hot']):04d}"

    return {
        "jobs": lambda: "/",
        "instances": lambda: f"/job?name={hot_name()}",
        "executions": lambda: f"/instances/{rng.randint(1, instances)}",
        "execution": lambda: f"/executions/{2 * rng.randint(1, instances)}",
        "execution+decision": lambda: f"/executions/{2 * rng.choice(every100) - 1}",
        "partitions": lambda: f"/steps/{2 * rng.choice(every100)}/partitions",
        "unresolved": lambda: "/unresolved?older_than=600",
        "audit": lambda: "/audit",
    }


def measure(dsn: str, params: dict[str, int], samples: int, seed: int) -> dict[str, list[float]]:
    """Seconds per request, by page kind; every response must be 200."""
    rng = random.Random(seed)
    paths = page_paths(params, rng)
    timings: dict[str, list[float]] = {}
    config = ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=1)
    with JobRepository.connect(config) as repository:
        client = create_app(JobExplorer(repository)).test_client()
        for draw in paths.values():  # warm-up: statements prepared, templates compiled
            assert client.get(draw()).status_code == 200
        gc.collect()
        gc.disable()
        try:
            for _ in range(samples):
                for kind, draw in paths.items():
                    path = draw()
                    started = time.perf_counter()
                    response = client.get(path)
                    elapsed = time.perf_counter() - started
                    assert response.status_code == 200, (path, response.status_code)
                    timings.setdefault(kind, []).append(elapsed)
        finally:
            gc.enable()
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a server to use (CREATEDB); default: an embedded one")
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--names", type=int, default=100)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with postgres_server(args.dsn, fsync=False) as server:
        with scratch_database(server, "dashboard") as dsn:
            params = shape(args.executions, args.names, args.executions)
            started = time.perf_counter()
            populate(dsn, params)
            print(
                f"populated: {args.executions:,} executions in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
            timings = measure(dsn, params, args.samples, args.seed)
            print(
                f"\nPage latency, ms ({args.executions:,} executions, {args.samples} requests"
                " per page, Flask test client)"
            )
            print(f"{'page':20} {'p50':>8} {'p95':>8} {'max':>8}")
            for kind, values in timings.items():
                print(
                    f"{kind:20} {statistics.median(values) * 1e3:>8.2f} "
                    f"{percentile(values, 0.95) * 1e3:>8.2f} {max(values) * 1e3:>8.2f}"
                )
            print("\nEXPLAIN (ANALYZE, BUFFERS) of every explorer statement:")
            flagged = explain_all(dsn)
            print("\nsequential scans of history tables:", "none" if not flagged else "")
            for line in flagged:
                print(f"  {line}")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
