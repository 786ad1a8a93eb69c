"""Memory of a long load: a streamed CSV through the ETL API, peak RSS and its growth.

    python -m bench.memory [--dsn DSN] [--rows 2000000] [--chunk 1000]

Claim (target): loading a CSV through `pybatch.etl` the way the README and
docs/etl-guide.md show it (the file read row by row, one chunk of rows in memory at a
time, `COPY` per chunk) grows the client's resident memory by at most 50 MB over the whole
run, whatever the row count: nothing pybatch keeps per chunk accumulates.

How: a CSV of `--rows` rows `(id, customer, amount)` is generated on disk first (streamed,
so the generator itself holds nothing). The loader then runs in this process, and the
resident set size (VmRSS of /proc/self/status) is sampled after every chunk. Printed:
RSS before the launch (imports done, repository connected), after the first chunk, at each
tenth of the run, the peak (VmHWM, the kernel's high-water mark, which also catches peaks
between samples), and the growth: peak minus RSS before the launch, and RSS at the end
minus RSS after the first tenth (a leak per chunk would show there, whatever the warm-up).
The table is then checked: count and sum of ids must match the CSV.

Without `--dsn` an EmbeddedPostgres is started (fsync on); the load runs in a scratch
database created and dropped by the benchmark. Results are also written as JSON under
bench/results/.
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import machine_info, print_machine, pybatch_repository, write_results
from pybatch import ConnectionConfig, TlsMode, migrate
from pybatch.etl import Job, StepRun

__all__ = ["TARGET_GROWTH_MB", "main"]

#: Target: the load grows resident memory by at most this much, whatever the row count.
TARGET_GROWTH_MB = 50.0
TABLE = "bench_orders"


def _status_kib(field: str) -> int:
    """A memory line of /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _mb(kib: int) -> float:
    return kib * 1024 / 1_000_000


def write_csv(path: Path, rows: int) -> None:
    """Write `rows` orders to `path`, one line at a time."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        for i in range(1, rows + 1):
            writer.writerow((i, f"customer-{i % 9973}", f"{i % 100_000}.{i % 100:02d}"))


class RssSampler:
    """RSS after each chunk, kept as one sample per tenth of the run (not per chunk)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.marks: list[tuple[int, int]] = []
        self._next_tenth = 1

    def sample(self, loaded: int) -> None:
        if not self.marks:
            self.marks.append((loaded, _status_kib("VmRSS")))
        while self._next_tenth <= 10 and loaded * 10 >= self._next_tenth * self.rows:
            self.marks.append((loaded, _status_kib("VmRSS")))
            self._next_tenth += 1


def streaming_loader(csv_path: Path, chunk_rows: int, sampler: RssSampler) -> Any:
    """The README's loader, sampling RSS after each chunk."""

    def load(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        with csv_path.open(newline="") as handle:
            rows = csv.reader(handle)
            for _ in islice(rows, offset):  # skip what an earlier attempt loaded
                pass
            while batch := list(islice(rows, chunk_rows)):
                with step.chunk() as chunk:
                    chunk.copy(f"COPY {TABLE} (id, customer, amount) FROM STDIN", batch)
                    offset += len(batch)
                    chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})
                sampler.sample(offset)

    return load


def run(dsn: str, rows: int, chunk_rows: int, workdir: Path) -> dict[str, Any]:
    csv_path = workdir / "orders.csv"
    started = time.perf_counter()
    write_csv(csv_path, rows)
    generated_s = time.perf_counter() - started
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    with admin_connect(dsn) as conn:
        conn.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, customer text NOT NULL,"
            " amount numeric(12, 2) NOT NULL)"
        )
    sampler = RssSampler(rows)
    with pybatch_repository(dsn) as repository:
        before_kib = _status_kib("VmRSS")
        started = time.perf_counter()
        with Job(repository, "bench_memory", {"rows": rows}).launch() as job_run:
            job_run.step("load", streaming_loader(csv_path, chunk_rows, sampler))
        load_s = time.perf_counter() - started
        end_kib = _status_kib("VmRSS")
    peak_kib = _status_kib("VmHWM")
    with admin_connect(dsn) as conn:
        count, id_sum = conn.execute(f"SELECT count(*), sum(id) FROM {TABLE}").fetchone() or (0, 0)
    if (count, int(id_sum or 0)) != (rows, rows * (rows + 1) // 2):
        raise SystemExit(f"loaded {count} rows, expected {rows}: the benchmark is wrong")
    first_tenth_kib = sampler.marks[1][1] if len(sampler.marks) > 1 else sampler.marks[0][1]
    return {
        "rows": rows,
        "chunk_rows": chunk_rows,
        "csv_bytes": csv_path.stat().st_size,
        "generate_s": generated_s,
        "load_s": load_s,
        "rss_before_kib": before_kib,
        "rss_marks_kib": sampler.marks,
        "rss_end_kib": end_kib,
        "peak_kib": peak_kib,
        "growth_peak_mb": _mb(peak_kib - before_kib),
        "growth_after_first_tenth_mb": _mb(end_kib - first_tenth_kib),
    }


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "| point | rows loaded | RSS (MB) |",
        "|---|---:|---:|",
        f"| before the launch | 0 | {_mb(result['rss_before_kib']):.1f} |",
    ]
    marks: Sequence[tuple[int, int]] = result["rss_marks_kib"]
    for index, (loaded, kib) in enumerate(marks):
        label = "after the first chunk" if index == 0 else f"{index}/10 of the run"
        lines.append(f"| {label} | {loaded:,} | {_mb(kib):.1f} |")
    lines.append(f"| after the job ended | {rows:,} | {_mb(result['rss_end_kib']):.1f} |")
    lines.append(f"| peak (VmHWM) | | {_mb(result['peak_kib']):.1f} |")
    growth = result["growth_peak_mb"]
    verdict = "met" if growth <= TARGET_GROWTH_MB else "MISSED"
    lines += [
        "",
        f"loaded {rows:,} rows ({result['csv_bytes'] / 1e6:.0f} MB of CSV) in "
        f"{result['load_s']:.1f} s, chunks of {result['chunk_rows']:,} rows by COPY",
        f"growth, peak minus before the launch: {growth:.1f} MB "
        f"(target <= {TARGET_GROWTH_MB:.0f} MB): {verdict}",
        f"growth from 1/10 of the run to its end: {result['growth_after_first_tenth_mb']:.1f} MB",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory",
        description="Peak RSS and its growth while loading a CSV through the ETL API.",
    )
    parser.add_argument(
        "--dsn", help="use this server (its role needs CREATEDB); default: an embedded one"
    )
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows (2000000)")
    parser.add_argument("--chunk", type=int, default=1000, help="rows per chunk (1000)")
    args = parser.parse_args(argv)
    if args.rows < 10 or args.chunk < 1:
        parser.error("--rows must be at least 10 and --chunk at least 1")
    with (
        tempfile.TemporaryDirectory(prefix="pybatch-bench-memory-") as workdir,
        postgres_server(args.dsn) as server,
        scratch_database(server, "memory") as dsn,
    ):
        machine = machine_info(dsn)
        print_machine(machine)
        result = run(dsn, args.rows, args.chunk, Path(workdir))
    machine["load_average_at_end"] = list(os.getloadavg())
    print()
    print(table(result))
    path = write_results("memory", {"benchmark": "memory", "machine": machine, **result})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
