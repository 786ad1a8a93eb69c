"""Checkpoint-only commits per second: pybatch against pgbench on the same server.

    python -m bench.checkpoint_commits [--dsn DSN] [--seconds 1] [--repeat 15] [--pgbench PATH]

pybatch side: one client, one job instance per run, one step, and chunks that run no
business statement and only commit progress and a checkpoint:
`with step.chunk() as chunk: chunk.commit(read=0, written=0, checkpoint={"offset": n})`.

pgbench side: `pgbench -M prepared -n -c 1 -T <seconds>` running a custom script of one
`UPDATE bench_counter SET n = n + 1 WHERE id = 1` (one transaction, autocommit) against a
one-row table in the same database of the same server.

Two hand-written psycopg loops on the same table run alongside: the same UPDATE in
autocommit (one round trip per commit, like pgbench but from Python) and BEGIN; UPDATE;
COMMIT (the minimum any client that commits a transaction of its own pays, three round
trips). The second is the target's baseline: what a chunk commit costs written by hand.

Runs are short and many (1 s, 15 rounds by default) and rotate (the side that goes first
changes every round), so that the four sides share the same minutes of a busy machine,
whose commit flush time can change tenfold within a minute; before each run a CHECKPOINT
and a garbage collection (untimed; the collector is then off during the run). Medians of
the runs are compared, and the per-round ratios printed. The target is at least 0.85 times
the commits/s of the psycopg BEGIN; UPDATE; COMMIT loop; the ratio to pgbench is printed
too. Without `--dsn` an EmbeddedPostgres is started with fsync on, so every commit waits
for its WAL flush as in production. Results are printed and written as JSON under
bench/results/.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import (
    BASELINE_APPLICATION,
    ChunkTracer,
    ServerCpu,
    gc_paused,
    machine_info,
    median,
    print_machine,
    pybatch_repository,
    write_results,
)
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch._config import APPLICATION_NAME
from pybatch._demo.embedded import EmbeddedPostgresUnavailable, find_bindir
from pybatch.etl import Job, StepRun

__all__ = ["main"]

TARGET_RATIO = 0.85
#: The side the target compares pybatch with.
TARGET_BASELINE = "transaction"
SETUP_SQL = (
    "CREATE TABLE bench_counter (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)",
    "INSERT INTO bench_counter (id, n) VALUES (1, 0)",
)
UPDATE_SQL = "UPDATE bench_counter SET n = n + 1 WHERE id = 1"
PGBENCH_SCRIPT = UPDATE_SQL + ";\n"
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)
_PROCESSED = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)


@dataclass
class Run:
    """One timed run of one side."""

    commits: int
    seconds: float
    client_cpu: float | None = None  # Python sides: CPU seconds of this process
    server_cpu: float | None = None  # Python sides: CPU seconds of their backends (local)
    latency_ms: float | None = None  # pgbench only: its reported average latency

    @property
    def per_second(self) -> float:
        return self.commits / self.seconds


# ---------------------------------------------------------------------- pybatch


def checkpoint_only_chunks(
    repository: JobRepository, seconds: float, label: str, cpu: ServerCpu
) -> Run:
    """Commit checkpoint-only chunks for `seconds` in a new job instance; count them."""
    measured: list[Run] = []

    def commit_checkpoints(step: StepRun) -> None:
        offset = 0
        backends = cpu.snapshot(APPLICATION_NAME)
        client = time.process_time()
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            with step.chunk() as chunk:
                offset += 1
                chunk.commit(read=0, written=0, checkpoint={"offset": offset})
        elapsed = time.perf_counter() - started
        measured.append(Run(offset, elapsed, time.process_time() - client, cpu.since(backends)))

    with Job(repository, "bench_checkpoint_commits", {"run": label}).launch() as run:
        run.step("commit", commit_checkpoints)
    return measured[0]


def trace_one_chunk(repository: JobRepository) -> dict[str, int]:
    """Untimed: statements and round trips of one steady-state checkpoint-only chunk."""
    with ChunkTracer(repository) as tracer:

        def traced(step: StepRun) -> None:
            for offset in range(1, 8):
                if offset == 7:
                    tracer.arm()
                with step.chunk() as chunk:
                    chunk.commit(read=0, written=0, checkpoint={"offset": offset})

        with Job(repository, "bench_checkpoint_commits", {"run": "trace"}).launch() as run:
            run.step("commit", traced)
    if len(tracer.counts) != 1:
        raise RuntimeError("the tracing pass recorded no chunk")
    return asdict(tracer.counts[0])


# ---------------------------------------------------------------------- psycopg references


def psycopg_loop(
    conn: psycopg.Connection[Any], seconds: float, cpu: ServerCpu, *, transaction: bool
) -> Run:
    """The UPDATE in a loop for `seconds`: autocommit, or BEGIN; UPDATE; COMMIT."""
    conn.autocommit = not transaction
    commits = 0
    backends = cpu.snapshot(BASELINE_APPLICATION)
    client = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        conn.execute(UPDATE_SQL, prepare=True)
        if transaction:
            conn.commit()
        commits += 1
    elapsed = time.perf_counter() - started
    return Run(commits, elapsed, time.process_time() - client, cpu.since(backends))


# ---------------------------------------------------------------------- pgbench


def find_pgbench(explicit: str | None) -> Path:
    """The pgbench to run: `--pgbench`, else the server binaries' one, else PATH's."""
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(Path(explicit))
    else:
        try:
            candidates.append(find_bindir() / "pgbench")
        except EmbeddedPostgresUnavailable:
            pass
        found = shutil.which("pgbench")
        if found is not None:
            candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(
        "pgbench not found: install it (Debian: it ships with postgresql-15) or pass --pgbench"
    )


def pgbench_version(pgbench: Path) -> str:
    result = subprocess.run(
        [str(pgbench), "--version"], capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


def run_pgbench(pgbench: Path, dsn: str, script: Path, seconds: int) -> Run:
    """`pgbench -M prepared -n -c 1 -T seconds -f script` against the database of `dsn`."""
    params = conninfo_to_dict(dsn)
    command = [str(pgbench), "-M", "prepared", "-n", "-c", "1", "-T", str(seconds)]
    command += ["-f", str(script)]
    for flag, key in (("-h", "host"), ("-p", "port"), ("-U", "user")):
        if params.get(key):
            command += [flag, str(params[key])]
    command.append(str(params.get("dbname", "postgres")))
    env = dict(os.environ)
    if params.get("password"):
        env["PGPASSWORD"] = str(params["password"])
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=seconds + 120, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"pgbench failed ({result.returncode}):\n{result.stderr}")
    tps, processed = _TPS.search(result.stdout), _PROCESSED.search(result.stdout)
    latency = _LATENCY.search(result.stdout)
    if tps is None or processed is None:
        raise RuntimeError(f"unexpected pgbench output:\n{result.stdout}")
    commits = int(processed.group(1))
    return Run(
        commits=commits,
        seconds=commits / float(tps.group(1)),
        latency_ms=None if latency is None else float(latency.group(1)),
    )


# ---------------------------------------------------------------------- orchestration


def settle(dsn: str) -> None:
    """Untimed: vacuum the two updated tables and flush dirty pages before a run."""
    with admin_connect(dsn) as conn:
        conn.execute("VACUUM bench_counter, pybatch.step_execution")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass  # --dsn with a role lacking pg_checkpoint: the runs just carry more noise


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


SIDES = {
    "pybatch": "pybatch checkpoint-only chunk",
    "pgbench": "pgbench -M prepared, 1 UPDATE",
    "autocommit": "(reference) psycopg autocommit UPDATE",
    "transaction": "(reference) psycopg BEGIN; UPDATE; COMMIT",
}
PROTOCOL = {"pgbench": "1 / 1", "autocommit": "1 / 1", "transaction": "3 / 3"}


def rate(runs: list[Run]) -> float:
    return median([run.per_second for run in runs])


def table(runs: dict[str, list[Run]], trace: dict[str, int]) -> str:
    """The printed table (also pasted into docs/benchmarks.md)."""

    def per_commit(side_runs: list[Run], attribute: str) -> float | None:
        values = [getattr(run, attribute) for run in side_runs]
        known = [value / run.commits for value, run in zip(values, side_runs, strict=True) if value]
        return median(known) * 1e6 if known else None

    lines = [
        "| side | commits/s (median) | runs (min-max) | us per commit (wall) "
        "| statements / round trips per commit | client CPU us per commit "
        "| server CPU us per commit |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for side, label in SIDES.items():
        side_runs = runs[side]
        protocol = PROTOCOL.get(side, f"{trace['statements']} / {trace['round_trips']}")
        client = "n/a (C)" if side == "pgbench" else _us(per_commit(side_runs, "client_cpu"))
        lines.append(
            f"| {label} | {rate(side_runs):,.0f} "
            f"| {min(run.per_second for run in side_runs):,.0f}"
            f"-{max(run.per_second for run in side_runs):,.0f} "
            f"| {1e6 / rate(side_runs):,.0f} | {protocol} | {client} "
            f"| {_us(per_commit(side_runs, 'server_cpu'))} |"
        )

    def ratios(side: str, against: str) -> tuple[float, list[float]]:
        per_round = [
            p.per_second / b.per_second for p, b in zip(runs[side], runs[against], strict=True)
        ]
        return rate(runs[side]) / rate(runs[against]), per_round

    ratio, per_round = ratios("pybatch", TARGET_BASELINE)
    verdict = "ok" if ratio >= TARGET_RATIO else "MISSED"
    to_pgbench, pgbench_rounds = ratios("pybatch", "pgbench")
    references = ", ".join(
        f"{side} / pgbench = {rate(runs[side]) / rate(runs['pgbench']):.2f}"
        for side in ("autocommit", "transaction")
    )
    return (
        "\n".join(lines)
        + f"\n\nratio pybatch / psycopg BEGIN; UPDATE; COMMIT: {ratio:.2f} "
        + f"(target >= {TARGET_RATIO}) {verdict}; per round "
        + f"{min(per_round):.2f}-{max(per_round):.2f} (median {median(per_round):.2f})"
        + f"\nratio pybatch / pgbench: {to_pgbench:.2f}; per round "
        + f"{min(pgbench_rounds):.2f}-{max(pgbench_rounds):.2f} "
        + f"(median {median(pgbench_rounds):.2f})"
        + f"\n(references: {references})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoint_commits",
        description="Checkpoint-only commits per second: pybatch against pgbench.",
    )
    parser.add_argument(
        "--dsn", help="use this server (its role needs CREATEDB); default: an embedded one"
    )
    parser.add_argument("--seconds", type=int, default=1, help="seconds per run (1)")
    parser.add_argument("--repeat", type=int, default=15, help="runs per side (15)")
    parser.add_argument("--pgbench", help="the pgbench binary (default: the server's)")
    args = parser.parse_args(argv)
    if args.seconds < 1 or args.repeat < 1:
        parser.error("--seconds and --repeat must be at least 1")
    pgbench = find_pgbench(args.pgbench)
    with (
        postgres_server(args.dsn) as server,
        scratch_database(server, "commits") as dsn,
        tempfile.TemporaryDirectory(prefix="pybatch-bench-") as scratch,
    ):
        machine = machine_info(dsn)
        machine["pgbench"] = pgbench_version(pgbench)
        print_machine(machine)
        print(f"pgbench: {machine['pgbench']} ({pgbench})")
        print(f"workload: {args.seconds} s per run, {args.repeat} runs per side, one client")
        script = Path(scratch) / "update.sql"
        script.write_text(PGBENCH_SCRIPT)
        os.chmod(scratch, 0o755)
        script.chmod(0o644)
        with admin_connect(dsn) as conn:
            for statement in SETUP_SQL:
                conn.execute(statement)
        migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
        cpu = ServerCpu(dsn, local=args.dsn is None)
        runs: dict[str, list[Run]] = {side: [] for side in SIDES}
        with (
            pybatch_repository(dsn) as repository,
            psycopg.connect(dsn, application_name=BASELINE_APPLICATION) as reference,
        ):
            trace = trace_one_chunk(repository)  # also warms the pool and statements up
            run_pgbench(pgbench, dsn, script, 1)  # warm-ups, discarded
            psycopg_loop(reference, 0.5, cpu, transaction=True)
            order = list(SIDES)
            for round_ in range(args.repeat):
                for side in order[round_ % len(order) :] + order[: round_ % len(order)]:
                    settle(dsn)
                    with gc_paused():
                        if side == "pybatch":
                            run = checkpoint_only_chunks(
                                repository, args.seconds, f"r{round_}", cpu
                            )
                        elif side == "pgbench":
                            run = run_pgbench(pgbench, dsn, script, args.seconds)
                        else:
                            transaction = side == "transaction"
                            run = psycopg_loop(
                                reference, args.seconds, cpu, transaction=transaction
                            )
                    runs[side].append(run)
                print(
                    f"  round {round_ + 1}/{args.repeat}: "
                    + ", ".join(f"{side} {runs[side][-1].per_second:,.0f}/s" for side in SIDES),
                    flush=True,
                )
    machine["load_average_at_end"] = list(os.getloadavg())
    print()
    print(table(runs, trace))
    summary: dict[str, Any] = {f"{side}_commits_per_s": rate(runs[side]) for side in SIDES}
    summary["ratio"] = rate(runs["pybatch"]) / rate(runs[TARGET_BASELINE])
    summary["ratio_to_pgbench"] = rate(runs["pybatch"]) / rate(runs["pgbench"])
    path = write_results(
        "checkpoint_commits",
        {
            "benchmark": "checkpoint_commits",
            "machine": machine,
            "seconds": args.seconds,
            "repeat": args.repeat,
            "target_ratio": TARGET_RATIO,
            "target_baseline": TARGET_BASELINE,
            "pgbench_script": PGBENCH_SCRIPT,
            "pybatch_per_commit_protocol": trace,
            "runs": {side: [asdict(run) for run in runs[side]] for side in SIDES},
            "summary": summary,
        },
    )
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
