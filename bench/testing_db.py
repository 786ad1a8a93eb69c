"""The per-test cost of pybatch.testing's fresh database, against migrating one per test.

Why: users' job tests each get their own database (pybatch_dsn / pybatch_repository); that
is only practical if a fresh database costs a test little. The plugin migrates a template
once per session and clones it per test (CREATE DATABASE ... TEMPLATE, a file copy on
every major: STRATEGY = FILE_COPY on PostgreSQL 15 and later), ahead of time in background
threads (PYBATCH_TEST_PREFETCH, default 2), which also drop used databases.
Target: a test waits <= 50 ms (p50) for its fresh database and connected repository, with
the default prefetch, whether the tests take no time (back-to-back) or run for a while.

    python -m bench.testing_db [--dsn DSN] [--cycles 30] [--test-seconds 1.0]

Without --dsn the server is started as the plugin starts its own: fsync off, binaries
found as the plugin finds them (PYBATCH_PG_BINDIR first), files in memory (/dev/shm) when
possible, else where PYBATCH_TEST_TMPDIR says. So
`PYBATCH_PG_BINDIR=/usr/lib/postgresql/13/bin python -m bench.testing_db` measures
PostgreSQL 13, and `PYBATCH_TEST_TMPDIR=/tmp python -m bench.testing_db` a server on disk.

Measured as the time a test's fixtures block it (take a database, connect a JobRepository,
close it, give the database back):

* baseline: a new database from template0, `pybatch.migrate` into it, JobRepository
  connect and close, drop: the per-test cost without a template;
* clone in the fixture (PYBATCH_TEST_PREFETCH=0): clone, connect, close, drop;
* prefetch 2, back-to-back tests: the clone pool with tests that take no time, so each test
  waits for the clone started for it, and the pool's throughput decides; once with the
  plugin's two threads, once with one (what the threads buy);
* prefetch 2, tests of `--test-seconds`: the same with tests that run for a while (a job in
  a subprocess, say), so clones finish during the tests.

Each case starts a new pool on the same template, as a session does; the "first" column is
its first test (the pool's first clones, not counted in p50 and p90).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
from pytest_postgresql.janitor import DatabaseJanitor

from pybatch._config import ConnectionConfig, TlsMode
from pybatch._demo.embedded import EmbeddedPostgres
from pybatch._job_repository import JobRepository
from pybatch._migrator import migrate
from pybatch.testing import ClonePool, PostgresServer, server_parent

TARGET_MS = 50.0
BASELINE = "baseline: migrate a new database per test"


@contextlib.contextmanager
def plugin_server(dsn: str | None) -> Iterator[tuple[str, str]]:
    """`dsn`, or a server started as the pybatch_server fixture starts one; and where."""
    if dsn is not None:
        yield dsn, "the --dsn server"
        return
    parent = server_parent()
    with EmbeddedPostgres(durable=False, parent=parent) as server:
        yield server.dsn, f"embedded, fsync off, files in {parent or tempfile.gettempdir()}"


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


def measure(run: Callable[[], float], cycles: int, pause: float) -> tuple[float, list[float]]:
    """The first test's wait, then the waits of `cycles` more."""
    first = run()
    time.sleep(pause)
    blocked = []
    for _ in range(cycles):
        blocked.append(run())
        time.sleep(pause)  # the test body, not counted
    return first, blocked


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a server to use (CREATEDB); default: an embedded one")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--test-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    results: dict[str, tuple[float, list[float]]] = {}
    back_to_back = "prefetch 2, back-to-back tests"
    long_tests = f"prefetch 2, tests of {args.test_seconds:g} s"
    with plugin_server(args.dsn) as (dsn, where):
        server = PostgresServer(dsn)
        with psycopg.connect(server.maintenance_dsn) as conn:
            number = conn.info.server_version
        version = f"{number // 10000}.{number % 10000}"
        with server.migrated_template() as template:

            def baseline() -> float:
                started = time.perf_counter()
                name = f"pybatch_test_{uuid.uuid4().hex[:16]}"
                janitor = DatabaseJanitor(
                    user=server.user,
                    host=server.host,
                    port=server.port,
                    password=server.password,
                    dbname=name,
                    template_dbname="template0",
                )
                janitor.init()
                migrate(config(server.dsn_for(name)))
                with JobRepository.connect(config(server.dsn_for(name))):
                    pass
                janitor.drop()
                return time.perf_counter() - started

            results[BASELINE] = measure(baseline, args.cycles, 0.0)
            for label, depth, workers, pause in (
                ("clone in the fixture (prefetch 0)", 0, None, 0.0),
                (back_to_back, 2, None, 0.0),
                ("prefetch 2 (one thread), back-to-back tests", 2, 1, 0.0),
                (long_tests, 2, None, args.test_seconds),
            ):
                pool = ClonePool(server, template, depth=depth, workers=workers)
                try:
                    results[label] = measure(fixtures(server, pool), args.cycles, pause)
                finally:
                    pool.close()
    load_end = os.getloadavg()
    base = statistics.median(results[BASELINE][1])
    print(
        "Time a test waits for a fresh database and a connected repository, ms "
        f"({args.cycles} tests per case after the first)\nPostgreSQL {version}, {where}"
    )
    print(f"{'case':45} {'first':>7} {'p50':>7} {'p90':>7} {'baseline/p50':>13}")
    for name, (first, values) in results.items():
        median = statistics.median(values)
        print(
            f"{name:45} {first * 1e3:>7.1f} {median * 1e3:>7.1f} {p90(values) * 1e3:>7.1f} "
            f"{base / median:>12.1f}x"
        )
    print()
    met = True
    for name in (back_to_back, long_tests):
        median = statistics.median(results[name][1]) * 1e3
        met = met and median <= TARGET_MS
        verdict = "met" if median <= TARGET_MS else "MISSED"
        print(f"{name}: p50 {median:.1f} ms, target <= {TARGET_MS:g} ms: {verdict}")
    print(
        f"target (default prefetch, both cases): {'met' if met else 'MISSED'}; "
        f"load average {' '.join(f'{x:.2f}' for x in load_start)} at the start, "
        f"{' '.join(f'{x:.2f}' for x in load_end)} at the end ({os.cpu_count()} CPUs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
