"""Chunk throughput with the `otel` extra absent and present (the API's no-op provider).

    python -m bench.telemetry [--dsn DSN] [--rows 20000] [--repeat 1] [--size 100]
                              [--method executemany|copy]

Each run is a new job instance with one step loading `--rows` rows in chunks of `--size`
(`with step.chunk()`, the business writes, `chunk.commit(...)`), timed over the chunk loop
only. Runs alternate between the two sides, `--repeat` times each:

* absent: `pybatch._telemetry.TRACER` is None, which is exactly what the module sets when
  opentelemetry cannot be imported; the step binds the plain `Chunk` class, so the chunk
  path is the one of an installation without the extra;
* present: opentelemetry-api is imported and no SDK is configured, so every span and
  instrument is the API's no-op; the step binds the observed chunk class (a span, four
  counter adds and one histogram record per chunk).

With `--sdk` the present side runs under the OpenTelemetry SDK instead, configured as a job
script would (a tracer provider with a batch span processor, a meter provider with a reader;
both keep what they get in memory, so no exporter's network time is counted): the cost of
spans and counters that are actually recorded. The SDK comes with the `testing` extra.

The printed ratio is present / absent throughput (medians): 1.00 means the hooks cost
nothing measurable. Without `--dsn` an
EmbeddedPostgres is started. Keep runs short on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import gc_paused, make_rows, pybatch_repository
from pybatch import ConnectionConfig, JobRepository, TlsMode, _telemetry, migrate
from pybatch.etl import Job, StepRun

TABLE_SQL = (
    "CREATE TABLE bench_item_telemetry"
    " (id BIGINT PRIMARY KEY, name TEXT NOT NULL, amount BIGINT NOT NULL)"
)
INSERT_SQL = "INSERT INTO bench_item_telemetry (id, name, amount) VALUES (%s, %s, %s)"
COPY_SQL = "COPY bench_item_telemetry (id, name, amount) FROM STDIN"


def run_once(
    repository: JobRepository,
    dsn: str,
    rows: Sequence[tuple[int, str, int]],
    size: int,
    method: str,
    run_id: int,
) -> float:
    """Load `rows` as one job run; return the seconds of its chunk loop."""
    with admin_connect(dsn) as conn:
        conn.execute("TRUNCATE bench_item_telemetry")
    timed: list[float] = []

    def work(step: StepRun) -> None:
        started = time.perf_counter()
        for offset in range(0, len(rows), size):
            batch = rows[offset : offset + size]
            with step.chunk() as chunk:
                if method == "copy":
                    chunk.copy(COPY_SQL, batch)
                else:
                    chunk.executemany(INSERT_SQL, batch)
                chunk.commit(
                    read=len(batch), written=len(batch), checkpoint={"offset": offset + size}
                )
        timed.append(time.perf_counter() - started)

    with gc_paused(), Job(repository, "bench_telemetry", run_id=run_id).launch() as run:
        run.step("load", work)
    return timed[0]


def install_sdk() -> Any:
    """Set the SDK's global providers, recording in memory, as a job script would set them."""
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        raise SystemExit("--sdk needs opentelemetry-sdk: pip install pybatch[testing]") from None
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return tracer_provider, exporter


def measure(
    dsn: str, rows: int, repeat: int, size: int, method: str, sdk: bool = False
) -> dict[str, list[float]]:
    """Alternate absent and present runs (`repeat` each); return each side's chunk seconds."""
    installed = install_sdk() if sdk else None
    with admin_connect(dsn) as conn:
        conn.execute(TABLE_SQL)
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    data = make_rows(rows)
    present_tracer: Any = _telemetry.TRACER
    if present_tracer is None:
        raise SystemExit("opentelemetry-api is not installed: pip install pybatch[otel]")
    seconds: dict[str, list[float]] = {"absent": [], "present": []}
    run_id = 0
    with pybatch_repository(dsn) as repository:
        for round_ in range(repeat):
            order = ("absent", "present") if round_ % 2 == 0 else ("present", "absent")
            for side in order:
                run_id += 1
                _telemetry.TRACER = None if side == "absent" else present_tracer
                try:
                    seconds[side].append(run_once(repository, dsn, data, size, method, run_id))
                finally:
                    _telemetry.TRACER = present_tracer
                print(
                    f"  round {round_ + 1}/{repeat} {side:>7}: "
                    f"{rows / seconds[side][-1]:>9,.0f} items/s",
                    flush=True,
                )
    if installed is not None:  # the present runs' spans really were recorded
        provider, exporter = installed
        provider.force_flush()
        print(f"  spans recorded by the SDK: {len(exporter.get_finished_spans()):,}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.telemetry",
        description="Chunk throughput without and with the otel extra.",
    )
    parser.add_argument("--dsn", help="use this server (its role needs CREATEDB)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per run (20000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side (1)")
    parser.add_argument("--size", type=int, default=100, help="rows per chunk (100)")
    parser.add_argument("--method", choices=["executemany", "copy"], default="executemany")
    parser.add_argument(
        "--sdk", action="store_true", help="present side under the SDK (spans recorded)"
    )
    args = parser.parse_args(argv)
    if args.rows < args.size or args.repeat < 1 or args.size < 1:
        parser.error("--rows must be at least --size, and --repeat and --size at least 1")
    with postgres_server(args.dsn) as server, scratch_database(server, "telemetry") as dsn:
        print(
            f"workload: {args.rows:,} rows in chunks of {args.size} ({args.method}), "
            f"{args.repeat} run(s) per side, present side: "
            f"{'SDK, recording in memory' if args.sdk else 'no-op provider'}; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        seconds = measure(dsn, args.rows, args.repeat, args.size, args.method, args.sdk)
    absent = args.rows / statistics.median(seconds["absent"])
    present = args.rows / statistics.median(seconds["present"])
    print(
        f"absent {absent:,.0f} items/s, present ({'SDK' if args.sdk else 'no-op provider'}) "
        f"{present:,.0f} items/s, ratio present/absent {present / absent:.3f}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
