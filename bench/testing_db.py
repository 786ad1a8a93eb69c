"""The per-test cost of pybatch.testing's fresh database, against migrating one per test.

Why: users' job tests each get their own database (pybatch_dsn / pybatch_repository); that
is only practical if a fresh database costs a test little. The plugin migrates a template
once per session and clones it per test (CREATE DATABASE ... TEMPLATE through
pytest-postgresql's DatabaseJanitor), ahead of time in a background thread
(PYBATCH_TEST_PREFETCH, default 2), dropping used databases in that thread too.
Target: a test waits <= 50 ms for its fresh database and connected repository.

    python -m bench.testing_db [--dsn DSN] [--cycles 30] [--test-seconds 1.0]

Measured on one server (fsync off, as the plugin's own server), as the time a test's
fixtures block it:

* baseline: a new database from template0, `pybatch.migrate` into it, JobRepository
  connect and close, drop: the per-test cost without a template;
* clone in the fixture (PYBATCH_TEST_PREFETCH=0): clone, connect, close, drop;
* prefetch, back-to-back tests: the clone pool with tests that take no time, so every test
  waits for the clone that was started for it;
* prefetch, tests of `--test-seconds`: the same with tests that run for a while (a job in a
  subprocess, say), so clones finish during the tests; this is the figure for the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable

from bench._server import postgres_server
from pybatch.config import ConnectionConfig, TlsMode
from pybatch.job_repository import JobRepository
from pybatch.migrator import migrate
from pybatch.testing import ClonePool, PostgresServer


def config(dsn: str) -> ConnectionConfig:
    return ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=4)


def fixtures(server: PostgresServer, pool: ClonePool) -> Callable[[], float]:
    """One test's pybatch_repository set-up and tear-down; returns the time it blocked."""

    def run() -> float:
        started = time.perf_counter()
        name = pool.take()
        with JobRepository.connect(config(server.dsn_for(name))):
            pass
        pool.give_back(name)
        return time.perf_counter() - started

    return run


def measure(run: Callable[[], float], cycles: int, pause: float) -> list[float]:
    run()  # warm-up
    blocked = []
    for _ in range(cycles):
        blocked.append(run())
        time.sleep(pause)  # the test body, not counted
    return blocked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a server to use (CREATEDB); default: an embedded one")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--test-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {}
    with postgres_server(args.dsn, fsync=False) as dsn:
        server = PostgresServer(dsn)
        template = f"pybatch_template_{uuid.uuid4().hex[:16]}"
        template_janitor = server.janitor(template, as_template=True)
        template_janitor.init()
        try:
            migrate(config(server.dsn_for(template)))

            def baseline() -> float:
                started = time.perf_counter()
                name = f"pybatch_test_{uuid.uuid4().hex[:16]}"
                janitor = server.janitor(name, template="template0")
                janitor.init()
                migrate(config(server.dsn_for(name)))
                with JobRepository.connect(config(server.dsn_for(name))):
                    pass
                janitor.drop()
                return time.perf_counter() - started

            results["baseline: migrate a new database per test"] = measure(
                baseline, args.cycles, 0.0
            )
            for label, depth, pause in (
                ("clone in the fixture (prefetch 0)", 0, 0.0),
                ("prefetch 2, back-to-back tests", 2, 0.0),
                (f"prefetch 2, tests of {args.test_seconds:g} s", 2, args.test_seconds),
            ):
                pool = ClonePool(server, template, depth=depth)
                try:
                    results[label] = measure(fixtures(server, pool), args.cycles, pause)
                finally:
                    pool.close()
        finally:
            template_janitor.drop()
    print(
        "Time a test waits for a fresh database and a connected repository, ms "
        f"({args.cycles} tests)"
    )
    print(f"{'case':45} {'p50':>8} {'p90':>8}")
    for name, values in results.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        print(f"{name:45} {statistics.median(values) * 1e3:>8.1f} {p90 * 1e3:>8.1f}")
    target = statistics.median(results[f"prefetch 2, tests of {args.test_seconds:g} s"])
    base = statistics.median(results["baseline: migrate a new database per test"])
    print(
        f"\npybatch_repository wait p50 with tests of {args.test_seconds:g} s: "
        f"{target * 1e3:.1f} ms (target <= 50 ms); baseline/plugin {base / target:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
