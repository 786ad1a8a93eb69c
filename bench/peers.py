"""pybatch beside its peers, DBOS Transact and dlt, on one PostgreSQL server in one run.

    python -m bench.peers [--dsn DSN] [--rounds 3] [--jobs 200] [--rows 10000]
                          [--sizes 100 1000] [--dlt-chunk-runs 5]
                          [--kill-rows 20000] [--kill-size 500] [--skip jobs|chunks|kill]

Needs the `bench` extra (`pip install -c constraints.txt -e '.[bench]'`): dbos and dlt are
imported only when this benchmark runs, never by pybatch.

Three measures, each printed as a table of pybatch, the peer and the ratio pybatch/peer:

1. one-step jobs per second: pybatch `Job(repository, name, run_id=n).launch()` running
   `run.step("s", noop)`, against a DBOS workflow calling one `DBOS.step()` that does
   nothing. DBOS's system database is a separate scratch database of the same server.
   pybatch's round trips per job, and DBOS's per workflow, are counted by libpq's protocol
   trace (ReadyForQuery and CopyInResponse messages) over a few untimed jobs.
2. chunk throughput, rows/s for each chunk size: a pybatch job of one step writing each
   chunk with `chunk.executemany` or `chunk.copy` and committing it with its checkpoint;
   a DBOS workflow running one datasource transaction per chunk (`SQLAlchemyDatasource`,
   which in DBOS 3 replaces `DBOS.transaction()`: its SQLAlchemy session's executemany, or
   COPY through the session's raw psycopg connection; the transaction also records the
   step's output, the durable checkpoint); and dlt loading the same rows with a pipeline
   (destination postgres, write_disposition append), once as one run of all rows (not
   resumable mid-way) and once as one run per chunk (each chunk durable, as pybatch's and
   DBOS's are) over the first `--dlt-chunk-runs` chunks. dlt's default file format
   (insert_values, multi-row INSERT) is compared with executemany and its csv format
   (COPY) with COPY.
3. one SIGKILL and rerun per side: a child process (`python -m bench.peers --child SIDE`)
   loads `--kill-rows` rows in chunks of `--kill-size`; it is killed with SIGKILL once a
   third of the rows are in the target, then run again to completion. pybatch: a job
   whose step checkpoints the offset with every chunk (the rerun restarts the instance
   once the dead run's 2 s lease runs out); DBOS: a workflow of one datasource
   transaction per chunk with a fixed workflow id (the rerun's `DBOS.launch()` recovers
   it); dlt: one pipeline run per chunk with a `dlt.sources.incremental("id")` cursor
   (the rerun finishes pending load packages, then resumes from the cursor). The target
   is then compared with the source: "exact" (same count and rows), else "duplicated"
   and/or "lost".

Sides alternate over rounds (the first side rotates), so the load of a shared machine
falls on all alike; medians over rounds are compared. Every side writes its own table of
the same shape (dlt creates its own, with its two bookkeeping columns and no primary
key). Without `--dsn` an EmbeddedPostgres is started with fsync on. Results are printed
(with the load average at start and end) and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

from bench._server import admin_connect, postgres_server, scratch_database
from bench.chunks import (
    ProtocolCount,
    Row,
    gc_paused,
    machine_info,
    make_rows,
    median,
    print_machine,
    protocol_trace,
    write_results,
)
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch.etl import Job, StepRun

EXTRA_MISSING = (
    "bench/peers.py needs the `bench` extra (dbos, dlt[postgres]): "
    "pip install -c constraints.txt -e '.[bench]'"
)

TABLE_DDL = (
    "CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, amount BIGINT NOT NULL)"
)
INSERT_SQL = "INSERT INTO {table} (id, name, amount) VALUES (%s, %s, %s)"
COPY_SQL = "COPY {table} (id, name, amount) FROM STDIN"
#: The same INSERT in SQLAlchemy's named-parameter form, for DBOS's session.
SA_INSERT_SQL = "INSERT INTO {table} (id, name, amount) VALUES (:id, :name, :amount)"

DLT_DATASET = "bench_dlt"
#: The lease of the pybatch side of the kill test: the rerun waits for it to run out.
KILL_LEASE = dt.timedelta(seconds=2)


# ---------------------------------------------------------------------- peers, lazily


def load_peers() -> tuple[Any, Any, Any]:
    """dbos, dlt and sqlalchemy, imported on first use; a clear exit when they are absent."""
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
    try:
        dbos = importlib.import_module("dbos")
        dlt = importlib.import_module("dlt")
        sqlalchemy = importlib.import_module("sqlalchemy")
        importlib.import_module("psycopg2")  # dlt's postgres destination driver
    except ImportError as missing:
        raise SystemExit(f"{EXTRA_MISSING} ({missing})") from None
    return dbos, dlt, sqlalchemy


def version_of(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "absent"


def url_of(dsn: str, driver: str) -> str:
    """A libpq DSN as the URL SQLAlchemy and dlt want (dlt insists on a password: trust
    authentication ignores the placeholder)."""
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.get("user") or "postgres"))
    password = quote(str(parts.get("password") or "unused"))
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    return f"{driver}://{user}:{password}@{host}:{port}/{parts['dbname']}"


def as_dicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [{"id": i, "name": name, "amount": amount} for i, name, amount in rows]


_SOURCES: dict[int, tuple[list[Row], list[dict[str, Any]]]] = {}


def source(total: int) -> tuple[list[Row], list[dict[str, Any]]]:
    """The `total` source rows as tuples and as dicts, built once: no side pays for them."""
    if total not in _SOURCES:
        rows = make_rows(total)
        _SOURCES[total] = (rows, as_dicts(rows))
    return _SOURCES[total]


def create_table(dsn: str, table: str) -> None:
    with admin_connect(dsn) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(TABLE_DDL.format(table=table))


def truncate(dsn: str, table: str) -> None:
    with admin_connect(dsn) as conn:
        with contextlib.suppress(pg_errors.UndefinedTable):
            conn.execute(f"TRUNCATE {table}")


def count_rows(dsn: str, table: str) -> int:
    with admin_connect(dsn) as conn:
        try:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        except pg_errors.UndefinedTable:
            return 0
        return 0 if row is None else int(row[0])


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the DBOS side


class DbosSide:
    """One DBOS instance for the process: the workflows below, registered before launch."""

    def __init__(self, sys_dsn: str, app_dsn: str, name: str) -> None:
        dbos, _, sa = load_peers()
        self.dbos_module = dbos
        DBOS = dbos.DBOS
        self.DBOS = DBOS
        self.sa = sa
        ds = dbos.SQLAlchemyDatasource.create(url_of(app_dsn, "postgresql+psycopg"))
        self.datasource = ds

        def noop_step() -> int:
            return 1

        step = DBOS.step()(noop_step)

        def one_step() -> int:
            return int(step())

        self.one_step = DBOS.workflow()(one_step)

        def insert_chunk(table: str, total: int, first: int, size: int) -> int:
            rows = source(total)[1][first - 1 : first - 1 + size]
            ds.sql_session().execute(sa.text(SA_INSERT_SQL.format(table=table)), rows)
            return len(rows)

        def copy_chunk(table: str, total: int, first: int, size: int) -> int:
            rows = source(total)[0][first - 1 : first - 1 + size]
            raw = ds.sql_session().connection().connection.driver_connection
            with raw.cursor() as cur, cur.copy(COPY_SQL.format(table=table)) as copy:
                for row in rows:
                    copy.write_row(row)
            return len(rows)

        insert_tx = ds.transaction()(insert_chunk)
        copy_tx = ds.transaction()(copy_chunk)

        def load(table: str, total: int, size: int, method: str) -> int:
            chunk = copy_tx if method == "copy" else insert_tx
            written = 0
            for first in range(1, total + 1, size):
                written += int(chunk(table, total, first, size))
            return written

        self.load = DBOS.workflow()(load)
        DBOS(
            config={
                "name": name,
                "system_database_url": url_of(sys_dsn, "postgresql+psycopg"),
                "log_level": "WARNING",
            }
        )
        DBOS.launch()

    def close(self) -> None:
        self.DBOS.destroy()


class DbosTracer:
    """Traces the protocol of every pooled connection DBOS checks out in this thread.

    A workflow spreads its statements over connections of two engines (system database,
    datasource); pool events see each checkout, background threads are left out.
    """

    def __init__(self, sa: Any) -> None:
        self.sa = sa
        self.armed = False
        self.thread = threading.get_ident()
        self.open: dict[int, tuple[Any, list[str]]] = {}
        self.texts: list[str] = []

    def __enter__(self) -> DbosTracer:
        pool = self.sa.pool.Pool
        self.sa.event.listen(pool, "checkout", self._checkout)
        self.sa.event.listen(pool, "checkin", self._checkin)
        return self

    def __exit__(self, *exc_info: object) -> None:
        pool = self.sa.pool.Pool
        self.sa.event.remove(pool, "checkout", self._checkout)
        self.sa.event.remove(pool, "checkin", self._checkin)

    def _checkout(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if self.armed and threading.get_ident() == self.thread:
            trace = protocol_trace(dbapi_conn)
            self.open[id(dbapi_conn)] = (trace, trace.__enter__())

    def _checkin(self, dbapi_conn: Any, record: Any) -> None:
        entry = self.open.pop(id(dbapi_conn), None)
        if entry is not None:
            trace, out = entry
            trace.__exit__(None, None, None)
            self.texts.append(out[0])

    def take(self) -> ProtocolCount:
        total = ProtocolCount()
        for text in self.texts:
            count = ProtocolCount.parse(text)
            total.statements += count.statements
            total.round_trips += count.round_trips
        self.texts = []
        return total


# ---------------------------------------------------------------------- measure 1: jobs/s


def noop(step: StepRun) -> None:
    """The step of a one-step job: nothing but the step's own bookkeeping."""


def pybatch_jobs(repository: JobRepository, first_run: int, jobs: int) -> float:
    started = time.perf_counter()
    for run_id in range(first_run, first_run + jobs):
        with Job(repository, "peers_one_step", run_id=run_id).launch() as run:
            run.step("s", noop)
    return time.perf_counter() - started


def dbos_jobs(side: DbosSide, jobs: int) -> float:
    started = time.perf_counter()
    for _ in range(jobs):
        side.one_step()
    return time.perf_counter() - started


def pybatch_round_trips(dsn: str, first_run: int, jobs: int) -> ProtocolCount:
    """Round trips of `jobs` one-step jobs on a one-connection pool, traced, untimed."""
    config = ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT, pool_size=1)
    with JobRepository.connect(config) as repository:
        with repository.begin() as uow:
            conn = uow.connection
        with protocol_trace(conn) as out:
            pybatch_jobs(repository, first_run, jobs)
    count = ProtocolCount.parse(out[0])
    return ProtocolCount(count.statements // jobs, count.round_trips // jobs)


def dbos_round_trips(side: DbosSide, jobs: int) -> ProtocolCount:
    with DbosTracer(side.sa) as tracer:
        tracer.armed = True
        dbos_jobs(side, jobs)
        tracer.armed = False
    count = tracer.take()
    return ProtocolCount(count.statements // jobs, count.round_trips // jobs)


def measure_jobs(
    app_dsn: str, repository: JobRepository, side: DbosSide, rounds: int, jobs: int
) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {"pybatch": [], "DBOS": []}
    run_id = 1
    # Warm-up: psycopg prepares after five executions, DBOS's engines open their pools.
    pybatch_jobs(repository, run_id, 20)
    run_id += 20
    dbos_jobs(side, 20)
    for round_ in range(rounds):
        order = ("pybatch", "DBOS") if round_ % 2 == 0 else ("DBOS", "pybatch")
        for name in order:
            with gc_paused():
                if name == "pybatch":
                    seconds[name].append(pybatch_jobs(repository, run_id, jobs))
                    run_id += jobs
                else:
                    seconds[name].append(dbos_jobs(side, jobs))
        progress(
            f"  jobs round {round_ + 1}/{rounds}: pybatch {jobs / seconds['pybatch'][-1]:,.0f}/s,"
            f" DBOS {jobs / seconds['DBOS'][-1]:,.0f}/s"
        )
    pybatch_wire = pybatch_round_trips(app_dsn, run_id, 10)
    dbos_wire = dbos_round_trips(side, 10)
    return {
        "jobs_per_round": jobs,
        "seconds": seconds,
        "pybatch_per_s": jobs / median(seconds["pybatch"]),
        "dbos_per_s": jobs / median(seconds["DBOS"]),
        "pybatch_round_trips": pybatch_wire.round_trips,
        "pybatch_statements": pybatch_wire.statements,
        "dbos_round_trips": dbos_wire.round_trips,
        "dbos_statements": dbos_wire.statements,
    }


# ---------------------------------------------------------------------- measure 2: chunks


def pybatch_load(
    repository: JobRepository,
    rows: Sequence[Row],
    size: int,
    method: str,
    run_id: int,
    table: str,
) -> float:
    """A job of one step writing `rows` in chunks with checkpoints; its wall seconds."""
    statement = (COPY_SQL if method == "copy" else INSERT_SQL).format(table=table)

    def work(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < len(rows):
            batch = rows[offset : offset + size]
            with step.chunk() as chunk:
                if method == "copy":
                    chunk.copy(statement, batch)
                else:
                    chunk.executemany(statement, batch)
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})

    started = time.perf_counter()
    with Job(repository, f"peers_chunks_{method}", run_id=run_id).launch() as run:
        run.step("load", work)
    return time.perf_counter() - started


@dataclass(frozen=True)
class DltTarget:
    """A dlt pipeline and the loader file format its runs ask for."""

    pipeline: Any
    file_format: str


def dlt_pipeline(dlt: Any, dsn: str, name: str, pipelines_dir: str, file_format: str) -> DltTarget:
    destination = dlt.destinations.postgres(credentials=url_of(dsn, "postgresql"))
    pipeline = dlt.pipeline(
        pipeline_name=name,
        destination=destination,
        dataset_name=DLT_DATASET,
        pipelines_dir=pipelines_dir,
    )
    return DltTarget(pipeline, file_format)


def dlt_run(target: DltTarget, data: Any, table: str) -> None:
    info = target.pipeline.run(
        data, table_name=table, write_disposition="append", loader_file_format=target.file_format
    )
    info.raise_on_failed_jobs()


def dlt_load_once(
    pipeline: DltTarget, rows: Sequence[dict[str, Any]], size: int, table: str
) -> float:
    """All rows in one pipeline run, handed over in pages of `size`."""

    def pages() -> Iterator[Sequence[dict[str, Any]]]:
        for offset in range(0, len(rows), size):
            yield rows[offset : offset + size]

    started = time.perf_counter()
    dlt_run(pipeline, pages(), table)
    return time.perf_counter() - started


def dlt_load_per_chunk(
    pipeline: DltTarget, rows: Sequence[dict[str, Any]], size: int, table: str
) -> float:
    """One pipeline run per chunk of `size` rows."""
    started = time.perf_counter()
    for offset in range(0, len(rows), size):
        dlt_run(pipeline, rows[offset : offset + size], table)
    return time.perf_counter() - started


CHUNK_SIDES = (
    ("pybatch executemany", "DBOS executemany"),
    ("pybatch COPY", "DBOS COPY"),
    ("pybatch executemany", "dlt one run, insert_values"),
    ("pybatch COPY", "dlt one run, csv (COPY)"),
    ("pybatch executemany", "dlt run per chunk, insert_values"),
)


def measure_chunks(
    app_dsn: str,
    repository: JobRepository,
    side: DbosSide,
    dlt: Any,
    rounds: int,
    rows_count: int,
    sizes: Sequence[int],
    dlt_chunk_runs: int,
    pipelines_dir: str,
) -> dict[str, Any]:
    rows, dicts = source(rows_count)
    tables = {
        "pybatch executemany": "bench_peer_pybatch",
        "pybatch COPY": "bench_peer_pybatch",
        "DBOS executemany": "bench_peer_dbos",
        "DBOS COPY": "bench_peer_dbos",
        "dlt one run, insert_values": f"{DLT_DATASET}.bench_peer_dlt",
        "dlt one run, csv (COPY)": f"{DLT_DATASET}.bench_peer_dlt",
        "dlt run per chunk, insert_values": f"{DLT_DATASET}.bench_peer_dlt",
    }
    create_table(app_dsn, "bench_peer_pybatch")
    create_table(app_dsn, "bench_peer_dbos")
    insert_dlt = dlt_pipeline(dlt, app_dsn, "peers_insert", pipelines_dir, "insert_values")
    csv_dlt = dlt_pipeline(dlt, app_dsn, "peers_csv", pipelines_dir, "csv")
    names = list(tables)
    results: dict[str, Any] = {}
    run_id = 1
    for size in sizes:
        per_chunk_rows = dicts[: size * dlt_chunk_runs]
        # Warm-up, untimed: dlt creates its table, DBOS and pybatch prepare their statements.
        dlt_load_once(insert_dlt, dicts[:size], size, "bench_peer_dlt")
        dlt_load_once(csv_dlt, dicts[:size], size, "bench_peer_dlt")
        loaded: dict[str, int] = {}
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(rounds + 1):  # round 0 warms up every side
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                truncate(app_dsn, tables[name])
                with gc_paused():
                    if name.startswith("pybatch"):
                        method = "copy" if "COPY" in name else "executemany"
                        took = pybatch_load(repository, rows, size, method, run_id, tables[name])
                        run_id += 1
                    elif name.startswith("DBOS"):
                        method = "copy" if "COPY" in name else "executemany"
                        started = time.perf_counter()
                        side.load(tables[name], len(rows), size, method)
                        took = time.perf_counter() - started
                    elif name == "dlt run per chunk, insert_values":
                        took = dlt_load_per_chunk(
                            insert_dlt, per_chunk_rows, size, "bench_peer_dlt"
                        )
                    else:
                        pipeline = csv_dlt if "csv" in name else insert_dlt
                        took = dlt_load_once(pipeline, dicts, size, "bench_peer_dlt")
                loaded[name] = count_rows(app_dsn, tables[name])
                if round_ > 0:
                    seconds[name].append(took)
            if round_ > 0:
                progress(f"  chunks of {size}, round {round_}/{rounds} done")
        if any(set(row) != {"id", "name", "amount"} for row in dicts):
            raise RuntimeError("a side changed the shared source rows")
        for name in names:
            expected = len(per_chunk_rows) if "per chunk" in name else len(rows)
            if loaded[name] != expected:
                raise RuntimeError(f"{name} loaded {loaded[name]} rows, expected {expected}")
        results[str(size)] = {
            name: {
                "seconds": seconds[name],
                "rows": len(per_chunk_rows) if "per chunk" in name else len(rows),
                "rows_per_s": (len(per_chunk_rows) if "per chunk" in name else len(rows))
                / median(seconds[name]),
            }
            for name in names
        }
    return results


# ---------------------------------------------------------------------- measure 3: SIGKILL


def child_pybatch(dsn: str, table: str, total: int, size: int) -> None:
    rows = make_rows(total)
    statement = INSERT_SQL.format(table=table)

    def work(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < total:
            batch = rows[offset : offset + size]
            with step.chunk() as chunk:
                chunk.executemany(statement, batch)
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})

    config = ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT)
    with JobRepository.connect(config) as repository:
        job = Job(repository, "peers_kill", {"table": table}, lease=KILL_LEASE)
        with job.launch() as run:
            run.step("load", work)


def child_dbos(dsn: str, sys_dsn: str, table: str, total: int, size: int) -> None:
    side = DbosSide(sys_dsn, dsn, "peers_kill")
    try:
        DBOS = side.DBOS
        workflow_id = f"peers-kill-{table}"
        existing = DBOS.list_workflows(workflow_ids=[workflow_id])
        if existing:  # the rerun: launch() has started recovering it; wait for the end
            DBOS.retrieve_workflow(workflow_id).get_result()
        else:
            with side.dbos_module.SetWorkflowID(workflow_id):
                side.load(table, total, size, "executemany")
    finally:
        side.close()


def child_dlt(
    dsn: str, table: str, total: int, size: int, pipelines_dir: str, abort_pending: bool
) -> None:
    _, dlt, _ = load_peers()
    pipeline = dlt_pipeline(dlt, dsn, table, pipelines_dir, "insert_values")
    if abort_pending:
        pipeline.pipeline.abort_packages()
    yielded = [False]

    # dlt binds a resource's cursor through its argument's default: its documented idiom.
    cursor_default = dlt.sources.incremental("id", initial_value=0)

    def chunk(cursor: Any = cursor_default) -> Iterator[Any]:
        first = int(cursor.last_value or 0) + 1
        last = min(first + size - 1, total)
        if first <= last:
            yielded[0] = True
            yield source(total)[1][first - 1 : last]

    resource = dlt.resource(chunk, name=table, write_disposition="append")
    while True:
        # With load packages left pending (by a killed run), `run` loads them and exits
        # without extracting: the loop goes on until a run with nothing pending yields nothing.
        pending = bool(pipeline.pipeline.has_pending_data)
        yielded[0] = False
        dlt_run(pipeline, resource(), table)
        if not pending and not yielded[0]:
            break


def run_child(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.peers", *argv],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def verdict(dsn: str, table: str, total: int) -> dict[str, Any]:
    """Compare the target with the source rows: exact, duplicated and/or lost."""
    with admin_connect(dsn) as conn:
        try:
            found = conn.execute(
                f"SELECT id, name, amount, count(*) FROM {table} GROUP BY id, name, amount"
            ).fetchall()
        except pg_errors.UndefinedTable:
            found = []
    source = set(make_rows(total))
    copies = {(int(i), str(n), int(a)): int(c) for i, n, a, c in found}
    duplicated = sum(c - 1 for c in copies.values() if c > 1)
    lost = sum(1 for row in source if row not in copies)
    foreign = sum(1 for row in copies if row not in source)
    words = []
    if duplicated:
        words.append(f"duplicated ({duplicated:,} extra)")
    if lost:
        words.append(f"lost ({lost:,} missing)")
    if foreign:
        words.append(f"altered ({foreign:,} unknown rows)")
    return {
        "rows": sum(copies.values()),
        "duplicated": duplicated,
        "lost": lost,
        "verdict": ", ".join(words) or "exact",
    }


def last_line(stderr: bytes) -> str:
    """The error a failed child ended with: the last line naming an exception."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines()]
    named = [line for line in lines if "Exception" in line or "Error" in line]
    return (named or lines or ["(no output)"])[-1][:200]


def run_to_end(argv: Sequence[str], timeout: float) -> tuple[bool, str]:
    """Run a child to its end: (True, "") or (False, the error it ended with)."""
    child = run_child(argv)
    try:
        _, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return False, f"did not end within {timeout:.0f} s"
    if child.returncode != 0:
        return False, f"rc {child.returncode}: {last_line(stderr)}"
    return True, ""


def kill_mid_load(
    side: str,
    argv: Sequence[str],
    dsn: str,
    table: str,
    total: int,
    timeout: float,
    moment: str,
    rng: Any,
) -> tuple[int, float]:
    """Start the child, SIGKILL it once a third of the rows is loaded; (rows, phase).

    moment "commit": as soon as the row count says so, i.e. just after a chunk's rows
    were committed, where bookkeeping kept apart from the rows is still unwritten.
    moment "random": a random fraction (the phase) of one chunk's period later, the period
    measured as the time to the next change of the row count.
    """
    threshold = max(1, total // 3)
    child = run_child(argv)
    deadline = time.monotonic() + timeout
    crossed: tuple[float, int] | None = None
    period = 0.0
    while time.monotonic() < deadline and child.poll() is None:
        count = count_rows(dsn, table)
        now = time.monotonic()
        if crossed is None and count >= threshold:
            crossed = (now, count)
            if moment == "commit":
                break
        elif crossed is not None and count != crossed[1]:
            period = now - crossed[0]
            break
        time.sleep(0.002)
    delay = rng.uniform(0.0, period)
    time.sleep(delay)
    killed = child.poll() is None
    if killed:
        child.send_signal(signal.SIGKILL)
    _, stderr = child.communicate()
    if not killed:
        raise RuntimeError(
            f"{side}: the child ended (rc {child.returncode}) before it could be killed:"
            f" {last_line(stderr)}"
        )
    return count_rows(dsn, table), delay / period if period else 0.0


def kill_and_rerun(
    side: str,
    argv: Sequence[str],
    dsn: str,
    table: str,
    total: int,
    timeout: float,
    moment: str,
    rng: Any,
) -> dict[str, Any]:
    at_kill, phase = kill_mid_load(side, argv, dsn, table, total, timeout, moment, rng)
    started = time.monotonic()
    ok, error = run_to_end(argv, timeout)
    result: dict[str, Any] = {
        "moment": moment,
        "rows_at_kill": at_kill,
        "kill_phase": phase,
        "rerun_error": error,
    }
    result["rerun_seconds"] = time.monotonic() - started
    if not ok and side == "dlt":
        # dlt's documented way out of a package it cannot finish: abort it (its state
        # goes back to where the package started), then run again.
        ok, second = run_to_end([*argv, "--abort-pending"], timeout)
        result["remedy"] = "abort_packages, then run" + ("" if ok else f" (failed: {second})")
    result.update(verdict(dsn, table, total))
    if error:
        result["verdict"] = (
            f"rerun failed; after {result['remedy']}: {result['verdict']}"
            if ("remedy" in result)
            else f"rerun failed ({error}): {result['verdict']}"
        )
    progress(f"  kill {side}: {result['verdict']} (killed at {at_kill:,} rows)")
    if error:
        progress(f"    rerun error: {error}")
    return result


def measure_kill(
    server: str,
    total: int,
    size: int,
    sides: Sequence[str],
    moments: Sequence[str],
    kills: int,
    timeout: float,
    pipelines_dir: str,
    seed: int,
) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with (
        scratch_database(server, "kill") as dsn,
        scratch_database(server, "killsys") as sys_dsn,
    ):
        migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
        trials = [moment for moment in moments for _ in range(kills)]
        for trial, moment in enumerate(trials, 1):
            common = ["--target", dsn, "--rows", str(total), "--size", str(size)]
            shift = trial % len(sides)
            for side in [*sides[shift:], *sides[:shift]]:
                name = f"bench_kill_{side.lower()}_{trial}"
                argv = ["--child", side, "--table", name, *common]
                target = name
                if side == "DBOS":
                    argv += ["--sys-target", sys_dsn]
                if side == "dlt":
                    argv += ["--pipelines-dir", pipelines_dir]
                    target = f"{DLT_DATASET}.{name}"
                else:
                    create_table(dsn, name)
                results[side].append(
                    kill_and_rerun(side, argv, dsn, target, total, timeout, moment, rng)
                )
    return results


# ---------------------------------------------------------------------- report


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def report(results: dict[str, Any]) -> None:
    jobs = results.get("jobs")
    if jobs is not None:
        print("\n1. one-step jobs per second (median over rounds)")
        print(
            table(
                ["measure", "pybatch", "DBOS", "pybatch/DBOS"],
                [
                    [
                        "jobs/s",
                        f"{jobs['pybatch_per_s']:,.0f}",
                        f"{jobs['dbos_per_s']:,.0f}",
                        f"{jobs['pybatch_per_s'] / jobs['dbos_per_s']:.2f}",
                    ],
                    [
                        "statements per job (Query + Execute messages)",
                        jobs["pybatch_statements"],
                        jobs["dbos_statements"],
                        f"{jobs['pybatch_statements'] / max(1, jobs['dbos_statements']):.2f}",
                    ],
                    [
                        "round trips per job",
                        jobs["pybatch_round_trips"],
                        jobs["dbos_round_trips"],
                        f"{jobs['pybatch_round_trips'] / max(1, jobs['dbos_round_trips']):.2f}",
                    ],
                ],
            )
        )
    chunks = results.get("chunks")
    if chunks is not None:
        print("\n2. chunk throughput, rows/s (median over rounds)")
        lines = []
        for size, sides in chunks.items():
            for mine, peer in CHUNK_SIDES:
                ours, theirs = sides[mine]["rows_per_s"], sides[peer]["rows_per_s"]
                lines.append(
                    [f"{int(size):,}", mine, f"{ours:,.0f}", peer, f"{theirs:,.0f}",
                     f"{ours / theirs:.2f}"]
                )  # fmt: skip
        print(table(["chunk rows", "pybatch", "rows/s", "peer", "rows/s", "ratio"], lines))
    kill = results.get("kill")
    if kill is not None:
        print("\n3. SIGKILL mid-load, then rerun to completion")
        print(
            table(
                ["side", "killed", "rows at kill", "rows after rerun", "rerun s", "verdict"],
                [
                    [
                        name,
                        "just after a commit"
                        if value["moment"] == "commit"
                        else f"{value['kill_phase']:.0%} into a chunk",
                        f"{value['rows_at_kill']:,}",
                        f"{value['rows']:,}",
                        f"{value['rerun_seconds']:.1f}",
                        value["verdict"],
                    ]
                    for name, trials in kill.items()
                    for value in trials
                ],
            )
        )
        for name, trials in kill.items():
            for value in trials:
                if value["rerun_error"]:
                    print(f"{name} rerun ({value['moment']}): {value['rerun_error']}")


# ---------------------------------------------------------------------- entry point


def child_main(args: argparse.Namespace) -> int:
    if args.child == "pybatch":
        child_pybatch(args.target, args.table, args.rows, args.size)
    elif args.child == "DBOS":
        child_dbos(args.target, args.sys_target, args.table, args.rows, args.size)
    else:
        child_dlt(
            args.target, args.table, args.rows, args.size, args.pipelines_dir, args.abort_pending
        )
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="pybatch beside DBOS Transact and dlt on one PostgreSQL server.",
    )
    parser.add_argument("--dsn", help="use this server (its role needs CREATEDB)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measure (3)")
    parser.add_argument("--jobs", type=int, default=200, help="one-step jobs per round (200)")
    parser.add_argument("--rows", type=int, default=10_000, help="rows per chunk load (10000)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--dlt-chunk-runs", type=int, default=5, help="chunks loaded one dlt run each (5)"
    )
    parser.add_argument("--kill-rows", type=int, default=20_000, help="rows of the kill test")
    parser.add_argument("--kill-size", type=int, default=500, help="chunk rows, kill test")
    parser.add_argument(
        "--kill-sides",
        nargs="+",
        choices=["pybatch", "DBOS", "dlt"],
        default=["pybatch", "DBOS", "dlt"],
        help="sides of the kill test (all)",
    )
    parser.add_argument(
        "--kill-at",
        nargs="+",
        choices=["commit", "random"],
        default=["commit", "random"],
        help="kill moments, each tried on every side (commit random)",
    )
    parser.add_argument(
        "--kills", type=int, default=1, help="SIGKILL trials per side and moment (1)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seeds the kill moments (1)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per child process (s)")
    parser.add_argument("--skip", action="append", choices=["jobs", "chunks", "kill"], default=[])
    # The kill test's child process.
    parser.add_argument("--child", choices=["pybatch", "DBOS", "dlt"], help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--sys-target", help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=500, help=argparse.SUPPRESS)
    parser.add_argument("--pipelines-dir", help=argparse.SUPPRESS)
    parser.add_argument("--abort-pending", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None and (
        args.rounds < 1
        or args.jobs < 1
        or args.dlt_chunk_runs < 1
        or min(args.sizes) < 1
        or args.rows < max(args.sizes) * args.dlt_chunk_runs
        or args.kill_size < 1
        or args.kills < 1
        or args.kill_rows < 3 * args.kill_size
    ):
        parser.error(
            "--rounds, --jobs, --dlt-chunk-runs and --sizes must be at least 1, --rows at"
            " least the largest size times --dlt-chunk-runs, --kill-rows at least 3 chunks"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args)
    load_peers()  # fail before starting a server when the extra is missing
    with (
        postgres_server(args.dsn) as server,
        scratch_database(server, "peers") as app_dsn,
        scratch_database(server, "peerssys") as sys_dsn,
        tempfile.TemporaryDirectory(prefix="pybatch-peers-") as pipelines_dir,
    ):
        machine = machine_info(app_dsn)
        machine["peers"] = {
            name: version_of(name) for name in ("dbos", "dlt", "SQLAlchemy", "psycopg2-binary")
        }
        print_machine(machine)
        print("peers:   " + ", ".join(f"{k} {v}" for k, v in machine["peers"].items()))
        results: dict[str, Any] = {}
        migrate(ConnectionConfig(dsn=app_dsn, tls_mode=TlsMode.PLAINTEXT))
        _, dlt, _ = load_peers()
        if "jobs" not in args.skip or "chunks" not in args.skip:
            side = DbosSide(sys_dsn, app_dsn, "peers")
            repository = JobRepository.connect(
                ConnectionConfig(dsn=app_dsn, tls_mode=TlsMode.PLAINTEXT)
            )
            try:
                if "jobs" not in args.skip:
                    progress(f"1. one-step jobs: {args.jobs} per side per round")
                    results["jobs"] = measure_jobs(
                        app_dsn, repository, side, args.rounds, args.jobs
                    )
                if "chunks" not in args.skip:
                    progress(f"2. chunks: {args.rows:,} rows, chunk sizes {args.sizes}")
                    results["chunks"] = measure_chunks(
                        app_dsn, repository, side, dlt, args.rounds, args.rows,
                        args.sizes, args.dlt_chunk_runs, pipelines_dir,
                    )  # fmt: skip
            finally:
                repository.close()
                side.close()
        if "kill" not in args.skip:
            progress(f"3. SIGKILL: {args.kill_rows:,} rows in chunks of {args.kill_size}")
            results["kill"] = measure_kill(
                server, args.kill_rows, args.kill_size, args.kill_sides, args.kill_at,
                args.kills, args.timeout, pipelines_dir, args.seed,
            )  # fmt: skip
        report(results)
        machine["load_average_at_end"] = list(os.getloadavg())
        print(f"\nload average at end: {load_average()}")
    path = write_results("peers", {"machine": machine, "args": vars(args), **results})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
