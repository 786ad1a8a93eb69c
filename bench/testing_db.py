"""The per-test cost of pybatch.testing's fresh database, against migrating a new one per test.

Why: users' job tests each get their own database (pybatch_dsn / pybatch_repository); that
is only practical if a fresh database costs little. The plugin migrates a template once per
session and clones it per test (CREATE DATABASE ... TEMPLATE, pytest-postgresql's
DatabaseJanitor). Target: <= 50 ms per test for the fresh database.

    python -m bench.testing_db [--dsn DSN] [--cycles 60]

Measured, alternating cycle by cycle on one server (fsync off, as the plugin's own server):

* clone: what `pybatch_dsn` does per test: clone the template, then drop the database;
* clone + repository: what `pybatch_repository` adds: JobRepository.connect (pool, schema
  version check) and close;
* baseline: a new database from template0, `pybatch.migrate` into it, JobRepository.connect,
  close, drop: the per-test cost without a template.
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
from pybatch.testing import PostgresServer


def config(dsn: str) -> ConnectionConfig:
    return ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a server to use (CREATEDB); default: an embedded one")
    parser.add_argument("--cycles", type=int, default=60)
    args = parser.parse_args(argv)
    with postgres_server(args.dsn, fsync=False) as dsn:
        server = PostgresServer(dsn)
        template = f"pybatch_template_{uuid.uuid4().hex[:16]}"
        template_janitor = server.janitor(template, as_template=True)
        template_janitor.init()
        try:
            migrate(config(server.dsn_for(template)))

            def clone() -> None:
                janitor = server.janitor(f"pybatch_test_{uuid.uuid4().hex[:16]}", template=template)
                janitor.init()
                janitor.drop()

            def clone_and_repository() -> None:
                name = f"pybatch_test_{uuid.uuid4().hex[:16]}"
                janitor = server.janitor(name, template=template)
                janitor.init()
                with JobRepository.connect(config(server.dsn_for(name))):
                    pass
                janitor.drop()

            def baseline() -> None:
                name = f"pybatch_test_{uuid.uuid4().hex[:16]}"
                janitor = server.janitor(name, template="template0")
                janitor.init()
                migrate(config(server.dsn_for(name)))
                with JobRepository.connect(config(server.dsn_for(name))):
                    pass
                janitor.drop()

            cases: dict[str, Callable[[], None]] = {
                "clone (pybatch_dsn)": clone,
                "clone + repository (pybatch_repository)": clone_and_repository,
                "baseline: migrate a new database per test": baseline,
            }
            for case in cases.values():  # warm-up
                case()
            timings: dict[str, list[float]] = {name: [] for name in cases}
            for cycle in range(args.cycles):
                order = list(cases) if cycle % 2 == 0 else list(reversed(cases))
                for name in order:
                    started = time.perf_counter()
                    cases[name]()
                    timings[name].append(time.perf_counter() - started)
        finally:
            template_janitor.drop()
    print(f"Per-test fresh database, ms ({args.cycles} cycles, alternating)")
    print(f"{'case':45} {'p50':>8} {'p90':>8}")
    for name, values in timings.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        print(f"{name:45} {statistics.median(values) * 1e3:>8.1f} {p90 * 1e3:>8.1f}")
    plugin = statistics.median(timings["clone + repository (pybatch_repository)"])
    base = statistics.median(timings["baseline: migrate a new database per test"])
    print(f"\npybatch_repository p50: {plugin * 1e3:.1f} ms (target <= 50 ms)")
    print(f"ratio baseline / plugin: {base / plugin:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
