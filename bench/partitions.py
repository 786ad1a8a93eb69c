"""Partitioned steps: throughput by worker count, cost per partition, claim latency.

    python -m bench.partitions [--dsn DSN] [--partitions 128] [--copy-partitions 48]
                               [--workers 1,2,4,8] [--repeat 2]

Three measurements, printed as tables (and written as JSON under bench/results/):

1. Throughput at 1, 2, 4 and 8 worker processes, for no-op partitions and for partitions
   that COPY 1,000 rows, two ways side by side, alternating run by run (ABBA):
   * pybatch: `run.partitioned_step(name, plan, work, workers=N)` end to end (plan published,
     N forked workers claim, work and complete, the parent aggregates);
   * baseline: a hand-written psycopg pool doing the least a durable one can: a queue table
     filled in one transaction, N forked processes each looping `SELECT ... FOR UPDATE SKIP
     LOCKED LIMIT 1` + mark running + COMMIT, then the business COPY + mark done + COMMIT.
   Partitions/s and items/s, the scaling efficiency against one worker
   (throughput(N) / (N * throughput(1))), and the pybatch/baseline ratio.
2. Transactions, round trips and CPU per partition, on an in-process worker (`workers=0`):
   every pooled connection lease is one transaction, traced at the libpq protocol level
   (ReadyForQuery and CopyInResponse count as round trips); a worker holds no connection
   outside the pool (its lease is row state). CPU is this process's and its server backends'
   (/proc/PID/schedstat, local server only), read on a second, untraced run (the trace file
   costs client CPU): unlike wall time, a busy machine moves it little.
   The hand-written queue's loop is measured the same way. Target: at most 6 round trips per
   no-op partition.
3. Claim latency (claim unit of work: claim statement, COMMIT) over 1,024
   claims from plans of 10, 100 and 1,024 partitions, interleaved claim by claim (plans of 10
   and 100 are published again as they drain); target: median(1,024) / median(10) <= 1.2.

4. Primary capacity: with 1, 4 and 8 client processes for `--capacity-seconds` each (0: none),
   checkpoint-only chunk commits, claims (claim units of work), and
   launches (launch, one empty step, completion) per second of the whole server.

Without `--dsn` an EmbeddedPostgres is started with fsync on.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psycopg

from bench._server import postgres_server, scratch_database
from bench.chunks import (
    ProtocolCount,
    machine_info,
    print_machine,
    protocol_trace,
    write_results,
)
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch import _partitioned as partitioned_module
from pybatch import etl as etl_module
from pybatch._transaction import Lease
from pybatch.etl import Job, PartitionRun
from pybatch.values.flow import StartLimit
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import NodeId, StepName
from pybatch.values.ownership import ExecutionLease
from pybatch.values.partitions import PartitionPlanEntry
from pybatch.values.state import ExecutionContext
from pybatch.values.status import BatchStatus

ROWS = 1_000
TABLES_SQL = (
    "CREATE TABLE bench_part_pybatch (id BIGINT NOT NULL, part TEXT NOT NULL)",
    "CREATE TABLE bench_part_baseline (LIKE bench_part_pybatch)",
    "CREATE TABLE bench_queue (run TEXT NOT NULL, part_key TEXT NOT NULL, first BIGINT NOT NULL,"
    " status TEXT NOT NULL, PRIMARY KEY (run, part_key))",
)


def config(dsn: str) -> ConnectionConfig:
    return ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=4)


def plan(n: int) -> dict[str, dict[str, int]]:
    return {f"p{i:04d}": {"first": i * ROWS + 1} for i in range(n)}


def rows(first: int, key: str) -> list[tuple[int, str]]:
    return [(first + i, key) for i in range(ROWS)]


def noop(partition: PartitionRun) -> None:
    """A partition with nothing to do."""


def copy_rows(partition: PartitionRun) -> None:
    """COPY the partition's 1,000 rows in one chunk."""
    first = int(partition.partition_context["first"])
    with partition.chunk() as chunk:
        chunk.copy("COPY bench_part_pybatch (id, part) FROM STDIN", rows(first, partition.key))
        chunk.commit(read=ROWS, written=ROWS, checkpoint={"offset": ROWS})


# ---------------------------------------------------------------------- the two sides


def run_pybatch(repository: JobRepository, label: str, n: int, copy: bool, workers: int) -> float:
    work = copy_rows if copy else noop
    job = Job(repository, "bench_partitions", {"run": label})
    started = time.perf_counter()
    with job.launch() as run:
        run.partitioned_step("load", plan(n), work, workers=workers)
    return time.perf_counter() - started


def _baseline_loop(conn: psycopg.Connection[Any], label: str, copy: bool) -> None:
    """Claim (SKIP LOCKED, mark running, COMMIT), work and mark done (COMMIT) until empty."""
    while True:
        with conn.transaction():
            row = conn.execute(
                "SELECT part_key, first FROM bench_queue WHERE run = %s AND status ="
                " 'todo' ORDER BY part_key LIMIT 1 FOR UPDATE SKIP LOCKED",
                (label,),
            ).fetchone()
            if row is None:
                return
            conn.execute(
                "UPDATE bench_queue SET status = 'running' WHERE run = %s AND part_key = %s",
                (label, row[0]),
            )
        with conn.transaction():
            if copy:
                with conn.cursor().copy("COPY bench_part_baseline (id, part) FROM STDIN") as sink:
                    for item in rows(int(row[1]), str(row[0])):
                        sink.write_row(item)
            conn.execute(
                "UPDATE bench_queue SET status = 'done' WHERE run = %s AND part_key = %s",
                (label, row[0]),
            )


def _baseline_worker(dsn: str, label: str, copy: bool) -> None:
    code = 1
    try:
        with psycopg.connect(dsn) as conn:
            _baseline_loop(conn, label, copy)
        code = 0
    finally:
        os._exit(code)


def _fill_queue(dsn: str, label: str, n: int) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO bench_queue (run, part_key, first, status) VALUES (%s, %s, %s, 'todo')",
            [(label, key, ctx["first"]) for key, ctx in plan(n).items()],
        )


def run_baseline(dsn: str, label: str, n: int, copy: bool, workers: int) -> float:
    context = multiprocessing.get_context("fork")
    started = time.perf_counter()
    _fill_queue(dsn, label, n)
    processes = [
        context.Process(target=_baseline_worker, args=(dsn, label, copy)) for _ in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM bench_queue WHERE run = %s AND status = 'done'", (label,)
        ).fetchone()
    assert row is not None and row[0] == n, "baseline lost partitions"
    return time.perf_counter() - started


# ---------------------------------------------------------------------- cost per partition


class LeaseCounter:
    """Counts pooled connection leases (units of work) and their protocol round trips."""

    def __init__(self, repository: JobRepository, *, trace: bool = True) -> None:
        self.repository = repository
        #: Trace the protocol (round trips); off for CPU, which libpq's trace file inflates.
        self.trace = trace
        self.leases = 0
        self.trips: list[int] = []
        #: Server CPU nanoseconds of each backend leased, when first leased.
        self.backends: dict[int, int] = {}
        self._open: dict[int, tuple[Any, list[str]]] = {}

    def __enter__(self) -> LeaseCounter:
        transactions = self.repository.transactions
        lease, release = transactions.lease, transactions._release

        def traced_lease(**options: Any) -> Lease:
            leased = lease(**options)
            conn = leased.connection
            self.leases += 1
            if conn is not None:
                pid = conn.info.backend_pid
                if pid not in self.backends:
                    self.backends[pid] = backend_cpu_ns(pid)
                if self.trace:
                    manager = protocol_trace(conn)
                    self._open[id(conn)] = (manager, manager.__enter__())
            return leased

        def traced_release(conn: psycopg.Connection[Any], *, discard: bool) -> None:
            entry = self._open.pop(id(conn), None)
            if entry is not None:
                manager, out = entry
                manager.__exit__(None, None, None)
                self.trips.append(ProtocolCount.parse(out[0]).round_trips)
            release(conn, discard=discard)

        transactions.lease = traced_lease  # type: ignore[method-assign]
        transactions._release = traced_release  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc_info: object) -> None:
        del self.repository.transactions.lease, self.repository.transactions._release


def backend_cpu_ns(pid: int) -> int:
    """CPU nanoseconds a local server backend has used (/proc/PID/schedstat; 0 if remote)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _pybatch_worker(
    dsn: str, n: int, copy: bool, *, trace: bool
) -> tuple[LeaseCounter, float, float, float]:
    """One in-process worker over a plan of `n`: its leases, wall, client and server CPU seconds."""
    with JobRepository.connect(config(dsn)) as repository:
        with Job(repository, "bench_cost", {"copy": copy, "at": time.time_ns()}).launch() as run:
            # Publish the plan (untimed, uncounted), then count only the worker's loop.
            entries = partitioned_module.plan_entries(plan(n), run_schema())
            _, parent = partitioned_module.start_partitioned_step(
                repository,
                run.instance.id,
                run.execution.id,
                "load",
                entries,
                StartLimit.unrestricted(),
            )
            runner = etl_module._runners(run.instance, run.execution, copy_rows if copy else noop)
            with LeaseCounter(repository, trace=trace) as counter:
                wall, cpu = time.perf_counter(), time.process_time()
                partitioned_module.work_on_plan(
                    repository, parent, runner(repository), poll_seconds=0.01
                )
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            server = sum(backend_cpu_ns(pid) - ns for pid, ns in counter.backends.items())
            partitioned_module.aggregate_plan(repository, parent)  # the run completes after it
    return counter, wall, cpu, server / 1e9


def cost_per_partition(dsn: str, n: int, copy: bool) -> dict[str, float]:
    """Units of work, round trips and CPU per partition on one in-process worker.

    Round trips from a traced run; CPU from an untraced one, since libpq's trace writes every
    message to a file (about 0.3 ms of client CPU per no-op partition, the queue's half that).
    CPU: this process's (all threads) and the server backends' it leased (local server).
    """
    traced, _, _, _ = _pybatch_worker(dsn, n, copy, trace=True)
    _, _, cpu, server = _pybatch_worker(dsn, n, copy, trace=False)
    # The worker's final look (an empty claim, then the open-partition count) is two units
    # of work per worker, not per partition: leave it out.
    trips = sum(traced.trips[:-2])
    return {
        "units_of_work": (traced.leases - 2) / n,
        "round_trips": trips / n,
        "client_cpu_ms": cpu * 1000 / n,
        "server_cpu_ms": server * 1000 / n,
    }


def baseline_cost_per_partition(dsn: str, n: int, copy: bool) -> dict[str, float]:
    """The same figures for the hand-written queue's loop, in this process (two runs too)."""
    label = f"cost-{copy}-{time.time()}"
    _fill_queue(dsn, label, n)
    with psycopg.connect(dsn) as conn, protocol_trace(conn) as out:
        _baseline_loop(conn, label, copy)
    trips = ProtocolCount.parse(out[0]).round_trips if out else 0
    _fill_queue(dsn, f"{label}-cpu", n)
    with psycopg.connect(dsn) as conn:
        server, cpu = backend_cpu_ns(conn.info.backend_pid), time.process_time()
        _baseline_loop(conn, f"{label}-cpu", copy)
        cpu, server = time.process_time() - cpu, backend_cpu_ns(conn.info.backend_pid) - server
    return {
        "units_of_work": 2.0,
        "round_trips": trips / n,
        "client_cpu_ms": cpu * 1000 / n,
        "server_cpu_ms": server / 1e6 / n,
    }


def claim(repository: JobRepository, parent: Any, lease: ExecutionLease) -> Any:
    """One claim unit of work, as a worker's first claim."""
    return repository.run_in_unit_of_work(
        lambda uow: partitioned_module._claim_in(uow, (parent, lease, True))
    )


def run_schema() -> Any:
    from pybatch.etl import ETL_STATE_SCHEMA

    return ETL_STATE_SCHEMA


# ---------------------------------------------------------------------- claim latency


def _publish(repository: JobRepository, label: str, size: int) -> Any:
    """A STARTED parent with a committed plan of `size` partitions (untimed)."""
    run = Job(repository, "bench_claims", {"plan": label}).launch()
    with repository.begin() as uow:
        parent = uow.flow.create_step(run.execution.id, StepName("load"), NodeId("load"))
        parent = uow.steps.transition(
            parent.id, 0, LifecycleTransition.new(BatchStatus.STARTED, uow.clock.now())
        )
        uow.partitions.create_plan(
            parent.id,
            [
                PartitionPlanEntry(key, ExecutionContext(run_schema(), 1, ctx))
                for key, ctx in plan(size).items()
            ],
        )
        uow.commit()
    return run, parent


def _retire(run: Any) -> None:
    """End a drained plan's run FAILED: its parent and claimed workers never ran, so it
    cannot complete (a run completes only after its steps)."""
    run.__exit__(RuntimeError, RuntimeError("plan drained by the claim benchmark"), None)


def claim_latency(
    dsn: str, sizes: list[int], rounds: int, label: str = "claims"
) -> dict[int, float]:
    """Median milliseconds of a claim unit of work, claims of the plan sizes interleaved.

    Each round publishes one plan per size, then claims from them in turn (one claim of
    each plan per turn, the order reversed every turn) until all are drained, so every
    size sees the same moments of a busy machine; small plans are published again as
    they drain, so each size gets as many claims as the largest plan.
    """
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    with JobRepository.connect(config(dsn)) as repository:
        lease = ExecutionLease()
        for round_number in range(rounds):
            plans = {
                size: _publish(repository, f"{label}-{round_number}-{size}-0", size)
                for size in sizes
            }
            published = {size: 1 for size in sizes}
            remaining = {size: size for size in sizes}
            turn = 0
            while remaining[max(sizes)]:
                order = sizes if turn % 2 == 0 else list(reversed(sizes))
                turn += 1
                for size in order:
                    if not remaining[size]:
                        _retire(plans[size][0])
                        name = f"{label}-{round_number}-{size}-{published[size]}"
                        published[size] += 1
                        plans[size] = _publish(repository, name, size)
                        remaining[size] = size
                    started = time.perf_counter()
                    claimed = claim(repository, plans[size][1], lease)
                    samples[size].append(time.perf_counter() - started)
                    assert claimed is not None
                    remaining[size] -= 1
            for run, _parent in plans.values():
                _retire(run)
    return {size: statistics.median(values) * 1000 for size, values in samples.items()}


# ---------------------------------------------------------------------- primary capacity


def _capacity_worker(dsn: str, kind: str, index: int, seconds: float, out: Any) -> None:
    """One process doing `kind` operations for `seconds`; puts its count on `out`."""
    count = 0
    try:
        with JobRepository.connect(config(dsn)) as repository:
            if kind == "chunk commits":
                with Job(
                    repository, "bench_capacity_chunks", {"p": f"{index}-{os.getpid()}"}
                ).launch() as run:

                    def commits(step: Any) -> None:
                        nonlocal count
                        deadline = time.perf_counter() + seconds
                        while time.perf_counter() < deadline:
                            with step.chunk() as chunk:
                                chunk.commit(read=1, written=1, checkpoint={"n": count})
                            count += 1

                    run.step("commit", commits)
            elif kind == "claims":
                run, parent = _publish(repository, f"capacity-{index}-{time.time()}", 1024)
                lease = ExecutionLease()
                deadline = time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    claimed = claim(repository, parent, lease)
                    if claimed is None:
                        _retire(run)
                        run, parent = _publish(repository, f"capacity-{index}-{time.time()}", 1024)
                        continue
                    count += 1
                _retire(run)
            else:  # launches: launch, one step, complete
                deadline = time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    job = Job(
                        repository,
                        "bench_capacity_launch",
                        {"p": f"{index}-{os.getpid()}", "n": count},
                    )
                    with job.launch() as run:
                        run.step("s", lambda step: None)
                    count += 1
        out.put(count)
    except BaseException:
        traceback.print_exc()
        out.put(-1)
    finally:
        os._exit(0)


def primary_capacity(dsn: str, clients: list[int], seconds: float) -> list[dict[str, Any]]:
    """Operations per second of the whole primary with `clients` concurrent processes."""
    context = multiprocessing.get_context("fork")
    results: list[dict[str, Any]] = []
    for kind in ("chunk commits", "claims", "launches"):
        for n in clients:
            out = context.SimpleQueue()  # put() is synchronous: safe before os._exit
            processes = [
                context.Process(target=_capacity_worker, args=(dsn, kind, i, seconds, out))
                for i in range(n)
            ]
            for process in processes:
                process.start()
            counts = [out.get() for _ in processes]
            assert min(counts) >= 0, f"a {kind} client failed"
            for process in processes:
                process.join()
            results.append({"kind": kind, "clients": n, "per_second": sum(counts) / seconds})
    return results


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument("--partitions", type=int, default=128)
    parser.add_argument("--copy-partitions", type=int, default=48)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--capacity-seconds", type=float, default=3.0)
    parser.add_argument("--capacity-clients", default="1,4,8")
    args = parser.parse_args(argv)
    worker_counts = [int(w) for w in args.workers.split(",")]

    with postgres_server(args.dsn) as server, scratch_database(server, "partitions") as dsn:
        migrate(config(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in TABLES_SQL:
                conn.execute(statement)
        machine = machine_info(dsn)
        print_machine(machine)
        print()

        throughput: list[dict[str, Any]] = []
        with JobRepository.connect(config(dsn)) as repository:
            run_number = 0
            for copy, n in ((False, args.partitions), (True, args.copy_partitions)):
                for workers in worker_counts:
                    sides: dict[str, list[float]] = {"pybatch": [], "baseline": []}
                    for attempt in range(args.repeat):
                        order = (
                            ("pybatch", "baseline")
                            if attempt % 2 == 0
                            else (
                                "baseline",
                                "pybatch",
                            )
                        )
                        for side in order:
                            run_number += 1
                            label = f"r{run_number}"
                            if side == "pybatch":
                                seconds = run_pybatch(repository, label, n, copy, workers)
                            else:
                                seconds = run_baseline(dsn, label, n, copy, workers)
                            sides[side].append(seconds)
                    throughput.append(
                        {
                            "work": "1,000-row COPY" if copy else "no-op",
                            "partitions": n,
                            "workers": workers,
                            "pybatch_s": statistics.median(sides["pybatch"]),
                            "baseline_s": statistics.median(sides["baseline"]),
                        }
                    )
        print("Throughput (medians of", args.repeat, "runs per cell, end to end):\n")
        print(
            "| work | workers | pybatch partitions/s | pybatch items/s | scaling eff. |"
            " baseline partitions/s | baseline scaling eff. | ratio pybatch/baseline |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for row in throughput:
            one = next(r for r in throughput if r["work"] == row["work"] and r["workers"] == 1)
            p_rate = row["partitions"] / row["pybatch_s"]
            b_rate = row["partitions"] / row["baseline_s"]
            p_one = one["partitions"] / one["pybatch_s"]
            b_one = one["partitions"] / one["baseline_s"]
            items = p_rate * (ROWS if row["work"] != "no-op" else 0)
            row.update(
                pybatch_partitions_per_s=p_rate,
                baseline_partitions_per_s=b_rate,
                pybatch_efficiency=p_rate / (row["workers"] * p_one),
                baseline_efficiency=b_rate / (row["workers"] * b_one),
            )
            print(
                f"| {row['work']} | {row['workers']} | {p_rate:,.1f} | {items:,.0f} |"
                f" {row['pybatch_efficiency']:.2f} | {b_rate:,.1f} |"
                f" {row['baseline_efficiency']:.2f} | {p_rate / b_rate:.2f} |"
            )

        print("\nCost per partition (one in-process worker; round trips traced, CPU untraced):\n")
        costs = {
            f"{work} {side}": measure(dsn, n, copy=copy)
            for work, n, copy in (("no-op", 64, False), ("1,000-row COPY", 24, True))
            for side, measure in (
                ("pybatch", cost_per_partition),
                ("baseline", baseline_cost_per_partition),
            )
        }
        print("| work | side | transactions | round trips | client CPU (ms) | server CPU (ms) |")
        print("|---|---|---:|---:|---:|---:|")
        for name, cost in costs.items():
            work, side = name.rsplit(" ", 1)
            print(
                f"| {work} | {side} | {cost['units_of_work']:.2f} | {cost['round_trips']:.1f} |"
                f" {cost['client_cpu_ms']:.2f} | {cost['server_cpu_ms']:.2f} |"
            )
        verdict = "met" if costs["no-op pybatch"]["round_trips"] <= 6 else "MISSED"
        print(f"\ntarget: at most 6 round trips per no-op partition: {verdict}")

        print("\nClaim latency (median over every claim of the plan):\n")
        sizes = [10, 100, 1024]
        latency = claim_latency(dsn, sizes, rounds=2)
        print("| plan size | claim median (ms) |")
        print("|---:|---:|")
        for size in sizes:
            print(f"| {size:,} | {latency[size]:.3f} |")
        ratio = latency[1024] / latency[10]
        verdict = "met" if ratio <= 1.2 else "MISSED"
        print(f"\nratio 1,024 / 10: {ratio:.2f} (target <= 1.2): {verdict}")

        print(f"\nPrimary capacity ({args.capacity_seconds:g} s per cell, N client processes):\n")
        capacity = (
            primary_capacity(
                dsn,
                [int(c) for c in args.capacity_clients.split(",")],
                args.capacity_seconds,
            )
            if args.capacity_seconds > 0
            else []
        )
        print("| operation | clients | per second (whole primary) |")
        print("|---|---:|---:|")
        for row in capacity:
            print(f"| {row['kind']} | {row['clients']} | {row['per_second']:,.0f} |")

        path = write_results(
            "partitions",
            {
                "machine": machine,
                "throughput": throughput,
                "cost_per_partition": costs,
                "claim_latency_ms": {str(k): v for k, v in latency.items()},
                "primary_capacity": capacity,
            },
        )
        print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
