"""Chunk throughput: pybatch chunks against a hand-written psycopg loop doing the same work.

    python -m bench.chunks [--dsn DSN] [--rows 200000] [--repeat 3] [--variant "100 copy" ...]
                           [--pin] [--isolation]

The reference workload loads `--rows` rows in chunks of 100 and of 1000, with the business
writes done by `executemany` (one INSERT per row, pipelined) and by `COPY ... FROM STDIN`.
Each variant runs two ways, into two tables of the same shape:

* pybatch: a new job instance per run, one step, and per chunk `with step.chunk()`, the
  business writes, and `chunk.commit(read=, written=, checkpoint={"offset": n})`;
* baseline: one plain psycopg connection doing the same business statements per chunk,
  then ONE `UPDATE bench_checkpoint SET "offset" = %s WHERE id = 1` and COMMIT;
* replay (a reference, not part of the target): pybatch's own chunk statements sent from
  another plain psycopg connection, with no pybatch code: the same business statements,
  then the chunk's compare-and-swap UPDATE (the text of `update_step_chunk_progress`, aimed
  at a STARTED copy of the step's row in `bench_step_replay`), and COMMIT. What the
  replay loses against the baseline is the cost of pybatch's SQL; what pybatch loses
  against the replay is the cost of pybatch's code.

The sides alternate chunk by chunk (the first side rotates: pybatch, baseline, replay, then
baseline, replay, pybatch, ...) and
each chunk is timed on its own, so both see the same moments of a busy shared machine;
whole runs are repeated `--repeat` times and medians compared. Before every run both
targets are truncated, a CHECKPOINT is taken and garbage is collected (untimed); the
garbage collector is then off until the run ends. pybatch's fixed cost per run
(launch, step start, step end, job end) is measured apart and shown as end-to-end items/s.

Per chunk, nothing is guessed: an untimed pass traces one steady-state chunk of each side
at the libpq protocol level (`PQtrace`) and counts statements and round trips; every timed
run also records the client's CPU time per side and, when the server is local (the
embedded one), the CPU time of each side's server backends (/proc/<pid>/schedstat),
because wall time on a busy machine mixes in everybody else's work while CPU time does not.

Without `--dsn` an EmbeddedPostgres is started with fsync on, so COMMIT costs what it
costs in production. Results are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb

import pybatch._chunks as chunks_module
from bench._server import ADMIN_APPLICATION, admin_connect, postgres_server, scratch_database
from bench.isolation import isolate
from pybatch import ConnectionConfig, JobRepository, TlsMode, migrate
from pybatch._config import APPLICATION_NAME
from pybatch._statements import _positional_form, load_statements
from pybatch.etl import ETL_STATE_SCHEMA, Job, StepRun

__all__ = [
    "BASELINE_APPLICATION",
    "ChunkTracer",
    "PhaseMeter",
    "ProtocolCount",
    "ServerCpu",
    "Variant",
    "gc_paused",
    "machine_info",
    "main",
    "median",
    "print_machine",
    "progress_update_on",
    "protocol_trace",
    "pybatch_repository",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: With --isolation: the family role pybatch's side runs as, and its job name prefix.
ISOLATION_ROLE = "pybatch_bench"
ISOLATION_PREFIX = "bench_"
#: application_name of the hand-written baseline's connection.
BASELINE_APPLICATION = "pybatch-bench-baseline"
#: application_name of the replay's connection (pybatch's statements without pybatch).
REPLAY_APPLICATION = "pybatch-bench-replay"

Row = tuple[int, str, int]
T = TypeVar("T")

# The two sides load the same rows into two tables of the same shape.
TABLES_SQL = (
    "CREATE TABLE bench_item_pybatch"
    " (id BIGINT PRIMARY KEY, name TEXT NOT NULL, amount BIGINT NOT NULL)",
    "CREATE TABLE bench_item_baseline (LIKE bench_item_pybatch INCLUDING ALL)",
    'CREATE TABLE bench_checkpoint (id INTEGER PRIMARY KEY, "offset" BIGINT NOT NULL)',
    'INSERT INTO bench_checkpoint (id, "offset") VALUES (1, 0)',
    "CREATE TABLE bench_item_replay (LIKE bench_item_pybatch INCLUDING ALL)",
)
# After the migration: the step's row as migrated (domains, CHECK constraints, indexes).
REPLAY_TABLES_SQL = ("CREATE TABLE bench_step_replay (LIKE pybatch.step_execution INCLUDING ALL)",)
# The replay's copy of the running step's row, taken (untimed) when the step starts.
REPLAY_STEP_SQL = (
    "DELETE FROM bench_step_replay",
    "INSERT INTO bench_step_replay SELECT * FROM pybatch.step_execution WHERE id = %s",
    "SELECT job_execution_id, version, read_count, commit_count FROM bench_step_replay",
)
#: update_step_chunk_progress's parameters (bound by name).
PROGRESS_PARAMETERS = frozenset(
    {
        "read_count",
        "processed_count",
        "write_count",
        "filter_count",
        "commit_count",
        "checkpoint_schema",
        "checkpoint_schema_version",
        "checkpoint_payload",
        "now",
        "step_execution_id",
        "job_execution_id",
        "expected_version",
        "owner_token",
    }
)

INSERT_SQL = "INSERT INTO {table} (id, name, amount) VALUES (%s, %s, %s)"
COPY_SQL = "COPY {table} (id, name, amount) FROM STDIN"
# OFFSET is a reserved word in PostgreSQL, hence the quotes.
CHECKPOINT_SQL = 'UPDATE bench_checkpoint SET "offset" = %s WHERE id = 1'


def progress_update_on(table: str, executions: str = "pybatch.job_execution") -> str:
    """pybatch's own chunk progress UPDATE (chunks.sql update_step_chunk_progress) on `table`.

    The statement's text as pybatch runs it (parameters by name, PROGRESS_PARAMETERS), with
    `table` as the updated step table and `executions` as the table its ownership fence reads,
    so a replay sends exactly pybatch's SQL. Raises RuntimeError when the statement no longer
    has that shape.
    """
    query = load_statements().update_step_chunk_progress.query.decode()
    _, names = _positional_form(query.encode())
    target = "UPDATE pybatch.step_execution"
    if set(names) != PROGRESS_PARAMETERS or query.count(target) != 1:
        raise RuntimeError("update_step_chunk_progress changed: update the replays")
    return query.replace(target, f"UPDATE {table}").replace("pybatch.job_execution", executions)


#: Chunks of the untimed tracing pass; the last one is traced (statements prepared by then).
TRACE_CHUNKS = 8
#: Rows of the untimed phase pass (per variant).
PHASE_ROWS = 100_000
TARGET_RATIO = 0.9


@dataclass(frozen=True)
class Variant:
    """One cell of the workload: a chunk size and a way to write the business rows."""

    size: int
    method: str  # "executemany" or "copy"

    @property
    def name(self) -> str:
        return f"{self.size} {self.method}"


VARIANTS = (
    Variant(100, "executemany"),
    Variant(100, "copy"),
    Variant(1000, "executemany"),
    Variant(1000, "copy"),
)


# ---------------------------------------------------------------------- machine and output


def machine_info(dsn: str) -> dict[str, Any]:
    """The machine and server the figures describe."""
    cpu = "unknown"
    memory_kib = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
                break
    except OSError:
        pass
    settings: dict[str, str] = {}
    with admin_connect(dsn) as conn:
        for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method"):
            row = conn.execute(f"SHOW {name}").fetchone()
            settings[name] = "" if row is None else str(row[0])
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "libpq": pq.version(),
        "postgresql": settings.pop("server_version"),
        "server_settings": settings,
        "load_average_at_start": list(os.getloadavg()),
        "command": " ".join(["python -m", _module_name(), *sys.argv[1:]]),
    }


def _module_name() -> str:
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).name


def print_machine(machine: dict[str, Any]) -> None:
    settings = machine["server_settings"]
    load = ", ".join(f"{value:.2f}" for value in machine["load_average_at_start"])
    print(
        f"machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['memory_gib']} GiB, "
        f"load average {load}\n"
        f"server:  PostgreSQL {machine['postgresql']} (fsync={settings['fsync']}, "
        f"synchronous_commit={settings['synchronous_commit']}, "
        f"wal_sync_method={settings['wal_sync_method']})\n"
        f"client:  Python {machine['python']}, psycopg {machine['psycopg']} "
        f"(libpq {machine['libpq']}); {machine['date']}\n"
        f"command: {machine['command']}"
    )


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write `payload` as bench/results/<name>-<UTC timestamp>.json; return the path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------- protocol counting


@dataclass
class ProtocolCount:
    """What one traced span sent: statements executed and times the client waited.

    statements: simple Query messages (BEGIN, COMMIT, COPY) plus extended-protocol
        Execute messages (one per executemany row).
    round_trips: ReadyForQuery messages (one per sync point) plus CopyInResponse
        (COPY waits for it before sending data).
    """

    statements: int = 0
    round_trips: int = 0

    @classmethod
    def parse(cls, trace: str) -> ProtocolCount:
        count = cls()
        for line in trace.splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            direction, message = parts[0], parts[2]
            if direction == "F" and message in ("Query", "Execute"):
                count.statements += 1
            elif direction == "B" and message in ("ReadyForQuery", "CopyInResponse"):
                count.round_trips += 1
        return count


@contextmanager
def protocol_trace(conn: psycopg.Connection[Any]) -> Iterator[list[str]]:
    """Trace `conn`'s protocol messages for the block; the list receives the trace text."""
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as handle:
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield out
        finally:
            conn.pgconn.untrace()
            handle.seek(0)
            out.append(handle.read())


class ChunkTracer:
    """Counts the protocol messages of one pybatch chunk, from its opening to its end.

    A step holds its connection from chunk to chunk, so a chunk is traced from the moment
    its session opens it (before the first chunk's state read, if any) until its commit or
    rollback returns. Benchmark instrumentation, never timed: it wraps the step session's
    and chunk's methods while installed, and `arm()` traces the next chunk only.
    """

    def __init__(self, repository: JobRepository) -> None:
        self.repository = repository
        self.counts: list[ProtocolCount] = []
        self._armed = False
        self._open: dict[int, tuple[Any, list[str]]] = {}

    def arm(self) -> None:
        self._armed = True

    def __enter__(self) -> ChunkTracer:
        session, transaction = chunks_module.StepSession, chunks_module.ChunkTransaction
        self._originals = {
            (session, "begin"): session.__dict__["begin"],
            # `commit_counts`: what the ETL API's `Chunk.commit` calls.
            (transaction, "commit_counts"): transaction.__dict__["commit_counts"],
            (transaction, "rollback"): transaction.__dict__["rollback"],
        }
        begin, commit, rollback = (self._originals[key] for key in self._originals)
        tracer = self

        def trace_on(conn: Any) -> None:
            tracer._armed = False
            trace = protocol_trace(conn)
            tracer._open[id(conn)] = (trace, trace.__enter__())

        def traced_begin(self: Any) -> Any:
            held = self._conn
            if tracer._armed and held is not None:
                trace_on(held)  # the session's connection, before anything of the chunk
            opened = begin(self)
            if tracer._armed:
                trace_on(opened.connection)  # the first chunk: it leased its connection
            return opened

        def ended(conn: Any) -> None:
            entry = tracer._open.pop(id(conn), None)
            if entry is not None:
                trace, out = entry
                trace.__exit__(None, None, None)
                tracer.counts.append(ProtocolCount.parse(out[0]))

        def traced_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
            conn = self._conn
            try:
                return commit(self, *args, **kwargs)
            finally:
                ended(conn)

        def traced_rollback(self: Any) -> None:
            conn = self._conn
            try:
                rollback(self)
            finally:
                ended(conn)

        session.begin = traced_begin  # type: ignore[method-assign]
        transaction.commit_counts = traced_commit  # type: ignore[method-assign]
        transaction.rollback = traced_rollback  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for (cls, name), original in self._originals.items():
            setattr(cls, name, original)


# ---------------------------------------------------------------------- CPU accounting


class ServerCpu:
    """CPU time of server backends, read from /proc/<pid>/schedstat (local servers only).

    Only meaningful when the server runs on this machine, so it is off with `--dsn`.
    """

    def __init__(self, dsn: str, *, local: bool) -> None:
        self.dsn = dsn
        self.local = Path("/proc/self/schedstat").exists() and (local or self._backend_visible())

    def _backend_visible(self) -> bool:
        """Whether this machine sees the server's backends (`--dsn` of a local server)."""
        with admin_connect(self.dsn) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        try:
            return (
                row is not None and Path(f"/proc/{row[0]}/cmdline").read_bytes()[:8] == b"postgres"
            )
        except OSError:
            return False

    def snapshot(self, application_name: str) -> dict[int, int]:
        """CPU nanoseconds so far of each backend serving `application_name`."""
        if not self.local:
            return {}
        with admin_connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                (application_name,),
            ).fetchall()
        return {int(row[0]): self._cpu_ns(int(row[0])) for row in rows}

    def since(self, before: dict[int, int]) -> float | None:
        """CPU seconds the backends of `before` used since then (None: not measured)."""
        if not self.local or not before:
            return None
        return sum(max(0, self._cpu_ns(pid) - ns) for pid, ns in before.items()) / 1e9

    @staticmethod
    def _cpu_ns(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0


@dataclass
class RunStats:
    """One timed run of one side."""

    seconds: float  # wall time of the chunk loop
    client_cpu: float  # CPU seconds of this process in the chunk loop
    server_cpu: float | None  # CPU seconds of the side's backends in the loop (local only)
    fixed: float | None = None  # pybatch: launch, step start, step end, job end


class PhaseMeter:
    """Wall time, client CPU and server CPU per phase of a chunk (the untimed phase pass).

    pybatch's phases are its chunk methods, wrapped while `pybatch_phases()` is active:
    open (`StepSession.begin`; the first chunk's pool acquire, BEGIN, the state SELECT and
    decode), business
    (`executemany` / `copy`) and progress (`commit`: the CAS UPDATE, COMMIT, release). The
    baseline's are its three steps. Server CPU is read from /proc/<pid>/schedstat of the
    connection's backend between the phases (local servers only), when the backend is idle.
    """

    def __init__(self, *, local: bool) -> None:
        self.local = local
        self.totals: dict[str, list[float]] = {}
        self.pybatch_pid = 0

    def measure(self, phase: str, pid: int, call: Callable[[], T]) -> T:
        server = self._server_ns(pid)
        client = time.process_time()
        started = time.perf_counter()
        try:
            return call()
        finally:
            wall = time.perf_counter() - started
            cpu = time.process_time() - client
            used = self._server_ns(pid) - server
            totals = self.totals.setdefault(phase, [0.0, 0.0, 0.0])
            totals[0] += wall
            totals[1] += cpu
            totals[2] += used / 1e9 if self.local and pid and server else 0.0

    def _server_ns(self, pid: int) -> int:
        return ServerCpu._cpu_ns(pid) if self.local and pid else 0

    @contextmanager
    def pybatch_phases(self) -> Iterator[None]:
        """Wrap the chunk classes' methods with `measure` (diagnostic instrumentation)."""
        session, transaction = chunks_module.StepSession, chunks_module.ChunkTransaction
        begin = session.begin
        executemany, copy = transaction.executemany, transaction.copy
        commit = transaction.commit_counts  # what the ETL API's commit calls
        meter = self

        def open_(self: Any) -> Any:
            opened = meter.measure(PHASE_OPEN, meter.pybatch_pid, lambda: begin(self))
            meter.pybatch_pid = opened.connection.info.backend_pid
            return opened

        def business_many(self: Any, *args: Any) -> Any:
            return meter.measure(
                PHASE_BUSINESS, meter.pybatch_pid, lambda: executemany(self, *args)
            )

        def business_copy(self: Any, *args: Any) -> Any:
            return meter.measure(PHASE_BUSINESS, meter.pybatch_pid, lambda: copy(self, *args))

        def progress(self: Any, *args: Any, **kwargs: Any) -> Any:
            return meter.measure(
                PHASE_PROGRESS, meter.pybatch_pid, lambda: commit(self, *args, **kwargs)
            )

        wrapped: dict[tuple[type, str], Any] = {
            (session, "begin"): open_,
            (transaction, "executemany"): business_many,
            (transaction, "copy"): business_copy,
            (transaction, "commit_counts"): progress,
        }
        originals = {(cls, name): cls.__dict__[name] for cls, name in wrapped}
        for (cls, name), wrapper in wrapped.items():
            setattr(cls, name, wrapper)
        try:
            yield
        finally:
            for (cls, name), original in originals.items():
                setattr(cls, name, original)

    def rows(self, chunks: int) -> list[tuple[str, float, float, float | None]]:
        """(phase, wall us, client CPU us, server CPU us) per chunk, in phase order."""
        result: list[tuple[str, float, float, float | None]] = []
        for phase in (*PYBATCH_PHASES, *BASELINE_PHASES):
            wall, client, server = self.totals.get(phase, [0.0, 0.0, 0.0])
            result.append(
                (
                    phase,
                    wall / chunks * 1e6,
                    client / chunks * 1e6,
                    server / chunks * 1e6 if self.local else None,
                )
            )
        return result


PHASE_OPEN = "pybatch open: acquire, BEGIN, state SELECT, decode"
PHASE_BUSINESS = "pybatch business statements"
PHASE_PROGRESS = "pybatch progress: CAS UPDATE, COMMIT, release"
PYBATCH_PHASES = (PHASE_OPEN, PHASE_BUSINESS, PHASE_PROGRESS)
BASELINE_PHASES = (
    "baseline business statements (with BEGIN)",
    "baseline checkpoint UPDATE",
    "baseline COMMIT",
)

# ---------------------------------------------------------------------- the two sides


def pybatch_repository(dsn: str) -> JobRepository:
    """A repository on `dsn` with the default configuration (plaintext: a local server)."""
    return JobRepository.connect(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))


class _Side:
    """Accumulates one side's timed chunks: wall time and client CPU."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.client_cpu = 0.0

    def timed(
        self, chunk: Callable[[Sequence[Row], int], None], batch: Sequence[Row], offset: int
    ) -> None:
        cpu = time.process_time()
        started = time.perf_counter()
        chunk(batch, offset)
        self.seconds += time.perf_counter() - started
        self.client_cpu += time.process_time() - cpu


def run_interleaved(
    repository: JobRepository,
    baseline: psycopg.Connection[Any],
    variant: Variant,
    batches: Sequence[Sequence[Row]],
    label: str,
    cpu: ServerCpu,
    *,
    replay: psycopg.Connection[Any] | None = None,
    trace: ChunkTracer | None = None,
    meter: PhaseMeter | None = None,
) -> RunResult:
    """Load `batches` both ways, alternating the sides chunk by chunk (ABBA).

    With `replay`, a third side runs pybatch's chunk statements on that connection (the
    first side of each chunk rotates over the three).

    pybatch: a new job instance with one step, whose chunks go to `bench_item_pybatch`.
    Baseline: the same business statements into `bench_item_baseline` on `baseline`, then
    one checkpoint UPDATE and COMMIT. Each chunk of one side is timed on its own, so both
    sides see the same moments of a busy machine. With `trace`, the last chunk of each side
    is traced instead (untimed use only); the baseline's count is returned. With `meter`,
    the baseline's chunks are split into its phases (pybatch's are split by
    `meter.pybatch_phases()`, which the caller activates).
    """
    copy = variant.method == "copy"
    target = {
        "pybatch": "bench_item_pybatch",
        "baseline": "bench_item_baseline",
        "replay": "bench_item_replay",
    }
    insert = {side: INSERT_SQL.format(table=table) for side, table in target.items()}
    copy_in = {side: COPY_SQL.format(table=table) for side, table in target.items()}
    sides = {"pybatch": _Side(), "baseline": _Side(), "replay": _Side()}
    # The replay's copy of the step row: (id, job_execution_id), version, counters.
    replayed: dict[str, int] = {}
    traced: list[ProtocolCount] = []
    fixed: list[float] = []
    backends: dict[str, dict[int, int]] = {}
    server: dict[str, float | None] = {}

    def business(cursor: psycopg.Cursor[Any], side: str, batch: Sequence[Row]) -> None:
        """The variant's business statements of one side, as a hand-written loop sends them."""
        if copy:
            with cursor.copy(copy_in[side]) as writer:
                for row in batch:
                    writer.write_row(row)
        else:
            cursor.executemany(insert[side], batch)

    def baseline_chunk(batch: Sequence[Row], offset: int) -> None:
        with baseline.cursor() as cursor:
            business(cursor, "baseline", batch)
            cursor.execute(CHECKPOINT_SQL, (offset,))
        baseline.commit()

    def baseline_phases(batch: Sequence[Row], offset: int) -> None:
        assert meter is not None
        pid = baseline.info.backend_pid
        with baseline.cursor() as cursor:
            meter.measure(BASELINE_PHASES[0], pid, lambda: business(cursor, "baseline", batch))
            meter.measure(
                BASELINE_PHASES[1], pid, lambda: cursor.execute(CHECKPOINT_SQL, (offset,))
            )
        meter.measure(BASELINE_PHASES[2], pid, baseline.commit)

    progress_sql = progress_update_on("bench_step_replay")
    replay_owner: list[bytes | None] = [None]  # the running execution's owner (the fence)

    def replay_chunk(batch: Sequence[Row], offset: int) -> None:
        assert replay is not None
        with replay.cursor() as cursor:
            business(cursor, "replay", batch)
            read = replayed["read"] + len(batch)
            commits = replayed["commits"] + 1
            cursor.execute(
                progress_sql,
                {
                    "read_count": read,
                    "processed_count": read,
                    "write_count": read,
                    "filter_count": 0,
                    "commit_count": commits,
                    "checkpoint_schema": ETL_STATE_SCHEMA.value,
                    "checkpoint_schema_version": 1,
                    "checkpoint_payload": Jsonb({"offset": offset}),
                    "now": dt.datetime.now(dt.UTC),
                    "step_execution_id": replayed["id"],
                    "job_execution_id": replayed["job_execution_id"],
                    "expected_version": replayed["version"],
                    "owner_token": replay_owner[0],
                },
                prepare=True,
            )
            if cursor.rowcount != 1:
                raise RuntimeError("the replay's compare-and-swap matched no row")
        replay.commit()
        replayed.update(read=read, commits=commits, version=replayed["version"] + 1)

    def load(step: StepRun) -> None:
        step_started = time.perf_counter()
        backends["pybatch"] = cpu.snapshot(APPLICATION_NAME)
        backends["baseline"] = cpu.snapshot(BASELINE_APPLICATION)
        if replay is not None:
            backends["replay"] = cpu.snapshot(REPLAY_APPLICATION)
            replayed.update(_copy_step_for_replay(replay, int(step.execution.id)))
            replay_owner[:] = [None if step.run.owner is None else step.run.owner.value]

        def pybatch_chunk(batch: Sequence[Row], offset: int) -> None:
            with step.chunk() as chunk:
                if copy:
                    chunk.copy(copy_in["pybatch"], batch)
                else:
                    chunk.executemany(insert["pybatch"], batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})

        chunks = {
            "pybatch": pybatch_chunk,
            "baseline": baseline_chunk if meter is None else baseline_phases,
            "replay": replay_chunk,
        }
        last = len(batches) - 1
        offset = 0
        for index, batch in enumerate(batches):
            offset += len(batch)
            if replay is None:
                order: tuple[str, ...] = (
                    ("pybatch", "baseline") if index % 4 in (0, 3) else ("baseline", "pybatch")
                )
            else:
                order = THREE_SIDE_ORDERS[index % len(THREE_SIDE_ORDERS)]
            for side in order:
                if trace is not None and index == last:
                    _traced_chunk(side, chunks[side], batch, offset, trace, baseline, traced)
                else:
                    sides[side].timed(chunks[side], batch, offset)
        for side, before in backends.items():
            server[side] = cpu.since(before)
        fixed.append(time.perf_counter() - step_started)

    began = time.perf_counter()
    with Job(repository, "bench_chunks", {"variant": variant.name, "run": label}).launch() as run:
        run.step("load", load)
    # launch, step start, step end and job end: pybatch's fixed cost per run
    in_step = fixed[0]
    fixed_cost = time.perf_counter() - began - in_step
    pybatch = RunStats(
        sides["pybatch"].seconds, sides["pybatch"].client_cpu, server["pybatch"], fixed_cost
    )
    base = RunStats(sides["baseline"].seconds, sides["baseline"].client_cpu, server["baseline"])
    replayed_stats = (
        None
        if replay is None
        else RunStats(sides["replay"].seconds, sides["replay"].client_cpu, server["replay"])
    )
    return RunResult(pybatch, base, replayed_stats, traced[0] if traced else None)


#: Chunk-by-chunk orders of the three sides: each side goes first, second and third in turn.
THREE_SIDE_ORDERS = (
    ("pybatch", "baseline", "replay"),
    ("baseline", "replay", "pybatch"),
    ("replay", "pybatch", "baseline"),
    ("replay", "baseline", "pybatch"),
    ("baseline", "pybatch", "replay"),
    ("pybatch", "replay", "baseline"),
)


@dataclass(frozen=True)
class RunResult:
    """One interleaved run: each side's figures, and the baseline's traced chunk if traced."""

    pybatch: RunStats
    baseline: RunStats
    replay: RunStats | None
    baseline_traced: ProtocolCount | None


def _copy_step_for_replay(conn: psycopg.Connection[Any], step_id: int) -> dict[str, int]:
    """Untimed: copy the STARTED step's row for the replay; its key, version and counters."""
    conn.execute(REPLAY_STEP_SQL[0])
    conn.execute(REPLAY_STEP_SQL[1], (step_id,))
    row = conn.execute(REPLAY_STEP_SQL[2]).fetchone()
    conn.commit()
    if row is None:
        raise RuntimeError("the step's row was not copied for the replay")
    return {
        "id": step_id,
        "job_execution_id": int(row[0]),
        "version": int(row[1]),
        "read": int(row[2]),
        "commits": int(row[3]),
    }


def _traced_chunk(
    side: str,
    chunk: Callable[[Sequence[Row], int], None],
    batch: Sequence[Row],
    offset: int,
    tracer: ChunkTracer,
    baseline: psycopg.Connection[Any],
    traced: list[ProtocolCount],
) -> None:
    if side == "pybatch":
        tracer.arm()
        chunk(batch, offset)
        return
    with protocol_trace(baseline) as out:
        chunk(batch, offset)
    traced.append(ProtocolCount.parse(out[0]))


# ---------------------------------------------------------------------- orchestration


@dataclass
class Cell:
    """The measurements of one variant."""

    variant: Variant
    rows: int
    pybatch: list[RunStats] = field(default_factory=list)
    baseline: list[RunStats] = field(default_factory=list)
    replay: list[RunStats] = field(default_factory=list)
    pybatch_per_chunk: ProtocolCount = field(default_factory=ProtocolCount)
    baseline_per_chunk: ProtocolCount = field(default_factory=ProtocolCount)
    # (phase, wall us, client CPU us, server CPU us) per chunk, from the phase pass
    phases: list[tuple[str, float, float, float | None]] = field(default_factory=list)

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.variant.size)

    def summary(self) -> dict[str, float | None]:
        def rate(runs: list[RunStats]) -> list[float]:
            return [self.rows / run.seconds for run in runs]

        def per_chunk_us(values: list[float | None]) -> float | None:
            known = [value for value in values if value is not None]
            return median(known) / self.chunks * 1e6 if known else None

        pybatch, baseline = rate(self.pybatch), rate(self.baseline)
        pairs = [p / b for p, b in zip(pybatch, baseline, strict=True)]
        replay = rate(self.replay)
        return {
            "replay_items_per_s": median(replay) if replay else None,
            "replay_ratio": median(replay) / median(baseline) if replay else None,
            "pybatch_to_replay_ratio": median(pybatch) / median(replay) if replay else None,
            "pybatch_items_per_s": median(pybatch),
            "baseline_items_per_s": median(baseline),
            "ratio": median(pybatch) / median(baseline),
            "pair_ratio_min": min(pairs),
            "pair_ratio_max": max(pairs),
            "pybatch_end_to_end_items_per_s": median(
                [self.rows / (run.seconds + (run.fixed or 0.0)) for run in self.pybatch]
            ),
            "pybatch_fixed_ms_per_run": median([(run.fixed or 0.0) * 1e3 for run in self.pybatch]),
            "pybatch_wall_us_per_chunk": per_chunk_us([run.seconds for run in self.pybatch]),
            "baseline_wall_us_per_chunk": per_chunk_us([run.seconds for run in self.baseline]),
            "pybatch_client_cpu_us_per_chunk": per_chunk_us(
                [run.client_cpu for run in self.pybatch]
            ),
            "baseline_client_cpu_us_per_chunk": per_chunk_us(
                [run.client_cpu for run in self.baseline]
            ),
            "pybatch_server_cpu_us_per_chunk": per_chunk_us(
                [run.server_cpu for run in self.pybatch]
            ),
            "baseline_server_cpu_us_per_chunk": per_chunk_us(
                [run.server_cpu for run in self.baseline]
            ),
            "replay_wall_us_per_chunk": per_chunk_us([run.seconds for run in self.replay]),
            "replay_client_cpu_us_per_chunk": per_chunk_us([run.client_cpu for run in self.replay]),
            "replay_server_cpu_us_per_chunk": per_chunk_us([run.server_cpu for run in self.replay]),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant.name,
            "chunk_size": self.variant.size,
            "method": self.variant.method,
            "rows": self.rows,
            "chunks": self.chunks,
            "pybatch_runs": [asdict(run) for run in self.pybatch],
            "baseline_runs": [asdict(run) for run in self.baseline],
            "replay_runs": [asdict(run) for run in self.replay],
            "pybatch_per_chunk": asdict(self.pybatch_per_chunk),
            "baseline_per_chunk": asdict(self.baseline_per_chunk),
            "phases_us_per_chunk": [
                {"phase": phase, "wall": wall, "client_cpu": client, "server_cpu": server}
                for phase, wall, client, server in self.phases
            ],
            "summary": self.summary(),
        }


def reset(dsn: str) -> None:
    """Untimed: empty both targets, rewind the checkpoint row, flush dirty pages."""
    with admin_connect(dsn) as conn:
        conn.execute("TRUNCATE bench_item_pybatch, bench_item_baseline, bench_item_replay")
        conn.execute('UPDATE bench_checkpoint SET "offset" = 0 WHERE id = 1')
        conn.execute("VACUUM bench_checkpoint, pybatch.step_execution")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass  # --dsn with a role lacking pg_checkpoint: the runs just carry more noise


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect garbage before a timed run and not during it, so no side pays for the other."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def batches_of(rows: Sequence[Row], size: int) -> list[Sequence[Row]]:
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def make_rows(count: int) -> list[Row]:
    return [(i, f"item-{i:09d}", i * 7 % 100_003) for i in range(1, count + 1)]


def trace_pass(
    repository: JobRepository,
    baseline: psycopg.Connection[Any],
    dsn: str,
    cell: Cell,
    cpu: ServerCpu,
) -> None:
    """Untimed: count one steady-state chunk of each side (this also warms both up)."""
    sample = batches_of(make_rows(cell.variant.size * TRACE_CHUNKS), cell.variant.size)
    reset(dsn)
    with ChunkTracer(repository) as tracer:
        base = run_interleaved(
            repository, baseline, cell.variant, sample, "trace", cpu, trace=tracer
        ).baseline_traced
    if base is None or len(tracer.counts) != 1:
        raise RuntimeError("the tracing pass recorded no chunk")
    cell.pybatch_per_chunk = tracer.counts[0]
    cell.baseline_per_chunk = base


def phase_pass(
    repository: JobRepository,
    baseline: psycopg.Connection[Any],
    dsn: str,
    cell: Cell,
    data: Sequence[Row],
    cpu: ServerCpu,
) -> None:
    """Untimed: split the chunks of both sides into phases (where the time goes)."""
    batches = batches_of(data[:PHASE_ROWS], cell.variant.size)
    meter = PhaseMeter(local=cpu.local)
    reset(dsn)
    with gc_paused(), meter.pybatch_phases():
        run_interleaved(repository, baseline, cell.variant, batches, "phases", cpu, meter=meter)
    cell.phases = meter.rows(len(batches))


def measure(
    dsn: str,
    rows: int,
    repeat: int,
    cpu: ServerCpu,
    variants: Sequence[Variant] = VARIANTS,
    *,
    isolation: bool = False,
) -> list[Cell]:
    """Trace, run each of `variants` `repeat` times, then split into phases; return the cells.

    With `isolation`, pybatch's side runs as a family role of docs/dba.md with isolation
    enabled (row-level security on the job tables); the baseline and the replay do not.
    """
    with admin_connect(dsn) as conn:
        for statement in TABLES_SQL:
            conn.execute(statement)
    migrate(ConnectionConfig(dsn=dsn, tls_mode=TlsMode.PLAINTEXT))
    with admin_connect(dsn) as conn:
        for statement in REPLAY_TABLES_SQL:
            conn.execute(statement)
    pybatch_dsn = dsn
    if isolation:
        pybatch_dsn = isolate(dsn, ISOLATION_ROLE, ISOLATION_PREFIX)
        with admin_connect(dsn) as conn:
            conn.execute(f"GRANT SELECT, INSERT ON bench_item_pybatch TO {ISOLATION_ROLE}")
    data = make_rows(rows)
    cells = [Cell(variant, rows) for variant in variants]
    with (
        pybatch_repository(pybatch_dsn) as repository,
        psycopg.connect(dsn, application_name=BASELINE_APPLICATION) as baseline,
        psycopg.connect(dsn, application_name=REPLAY_APPLICATION) as replay,
    ):
        for cell in cells:
            trace_pass(repository, baseline, dsn, cell, cpu)
        for round_ in range(repeat):
            for cell in cells:
                batches = batches_of(data, cell.variant.size)
                reset(dsn)
                with gc_paused():
                    result = run_interleaved(
                        repository,
                        baseline,
                        cell.variant,
                        batches,
                        f"round-{round_}",
                        cpu,
                        replay=replay,
                    )
                cell.pybatch.append(result.pybatch)
                cell.baseline.append(result.baseline)
                if result.replay is not None:
                    cell.replay.append(result.replay)
                pybatch, base = result.pybatch, result.baseline
                _check_loaded(dsn, rows)
                print(
                    f"  round {round_ + 1}/{repeat} {cell.variant.name:>16}: pybatch "
                    f"{rows / pybatch.seconds:>9,.0f} items/s, baseline "
                    f"{rows / base.seconds:>9,.0f} items/s, ratio "
                    f"{base.seconds / pybatch.seconds:.2f}"
                    + (
                        ""
                        if result.replay is None
                        else f" (replay {base.seconds / result.replay.seconds:.2f})"
                    ),
                    flush=True,
                )
        for cell in cells:
            phase_pass(repository, baseline, dsn, cell, data, cpu)
    return cells


def _check_loaded(dsn: str, rows: int) -> None:
    with admin_connect(dsn) as conn:
        for table in ("bench_item_pybatch", "bench_item_baseline", "bench_item_replay"):
            loaded = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            if loaded is None or loaded[0] != rows:
                raise RuntimeError(f"expected {rows} rows in {table}, found {loaded}")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def tables(cells: Sequence[Cell]) -> str:
    """The printed tables (also pasted into docs/benchmarks.md)."""
    throughput = [
        "| variant | pybatch items/s | baseline items/s | ratio (target >= 0.9) "
        "| per-run ratios (min-max) | pybatch end-to-end items/s "
        "| replay / baseline | pybatch / replay |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    replay = [
        "| variant | replay wall us | replay client CPU us | replay server CPU us |",
        "|---|---:|---:|---:|",
    ]
    per_chunk = [
        "| variant | statements pybatch / baseline | round trips pybatch / baseline "
        "| wall us pybatch / baseline | client CPU us pybatch / baseline "
        "| server CPU us pybatch / baseline |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for cell in cells:
        s = cell.summary()
        ratio = s["ratio"] or 0.0
        verdict = "ok" if ratio >= TARGET_RATIO else "MISSED"
        throughput.append(
            f"| {cell.variant.name} | {s['pybatch_items_per_s']:,.0f} "
            f"| {s['baseline_items_per_s']:,.0f} | {ratio:.2f} {verdict} "
            f"| {s['pair_ratio_min']:.2f}-{s['pair_ratio_max']:.2f} "
            f"| {s['pybatch_end_to_end_items_per_s']:,.0f} "
            f"| {_ratio(s['replay_ratio'])} | {_ratio(s['pybatch_to_replay_ratio'])} |"
        )
        replay.append(
            f"| {cell.variant.name} | {_us(s['replay_wall_us_per_chunk'])} "
            f"| {_us(s['replay_client_cpu_us_per_chunk'])} "
            f"| {_us(s['replay_server_cpu_us_per_chunk'])} |"
        )
        p, b = cell.pybatch_per_chunk, cell.baseline_per_chunk
        per_chunk.append(
            f"| {cell.variant.name} | {p.statements} / {b.statements} "
            f"| {p.round_trips} / {b.round_trips} "
            f"| {_us(s['pybatch_wall_us_per_chunk'])} / {_us(s['baseline_wall_us_per_chunk'])} "
            f"| {_us(s['pybatch_client_cpu_us_per_chunk'])} "
            f"/ {_us(s['baseline_client_cpu_us_per_chunk'])} "
            f"| {_us(s['pybatch_server_cpu_us_per_chunk'])} "
            f"/ {_us(s['baseline_server_cpu_us_per_chunk'])} |"
        )
    phases = [
        "| phase: wall / client CPU / server CPU, us per chunk | "
        + " | ".join(cell.variant.name for cell in cells)
        + " |",
        "|---|" + "---:|" * len(cells),
    ]
    for index, (phase, *_) in enumerate(cells[0].phases):
        values = [
            f"{wall:,.0f} / {client:,.0f} / {_us(server)}"
            for _, wall, client, server in (cell.phases[index] for cell in cells)
        ]
        phases.append(f"| {phase} | " + " | ".join(values) + " |")
    return (
        "Throughput (medians of the timed chunk loops):\n\n"
        + "\n".join(throughput)
        + "\n\nPer chunk (statements and round trips from a protocol trace; times are medians):\n\n"
        + "\n".join(per_chunk)
        + "\n\nThe replay per chunk (pybatch's statements from plain psycopg; medians):\n\n"
        + "\n".join(replay)
        + "\n\nWhere the time goes (untimed phase pass, "
        + f"{PHASE_ROWS:,} rows per variant):\n\n"
        + "\n".join(phases)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chunks",
        description="Chunk throughput: pybatch against a hand-written psycopg loop.",
    )
    parser.add_argument(
        "--dsn", help="use this server (its role needs CREATEDB); default: an embedded one"
    )
    parser.add_argument("--rows", type=int, default=200_000, help="rows per run (200000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant and side (3)")
    parser.add_argument(
        "--variant",
        action="append",
        choices=[variant.name for variant in VARIANTS],
        help="run only this variant (repeatable; default: all four)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="embedded server on the last CPU, this process on the others (a diagnostic)",
    )
    parser.add_argument(
        "--isolation",
        action="store_true",
        help="pybatch's side runs as a job family role with isolation enabled (docs/dba.md);"
        " compare with a run without it",
    )
    parser.add_argument(
        "--pooler",
        action="store_true",
        help="pybatch's 100-row chunks directly and through PgBouncer in session and"
        " transaction mode, side by side (bench.pooler)",
    )
    args = parser.parse_args(argv)
    if args.pooler:
        from bench import pooler

        return pooler.main(["--dsn", args.dsn] if args.dsn else [], workload="chunks")
    if args.pin and args.dsn:
        parser.error("--pin applies to the embedded server only")
    variants = [v for v in VARIANTS if not args.variant or v.name in args.variant]
    if args.rows < 1000 or args.repeat < 1:
        parser.error("--rows must be at least 1000 and --repeat at least 1")
    with (
        postgres_server(args.dsn, pin=args.pin) as server,
        scratch_database(server, "chunks") as dsn,
    ):
        machine = machine_info(dsn)
        print_machine(machine)
        print(f"workload: {args.rows:,} rows per run, {args.repeat} runs per variant and side")
        print(
            "isolation: "
            + (
                f"on (pybatch runs as {ISOLATION_ROLE}, row-level security)"
                if args.isolation
                else "off"
            )
        )
        machine["isolation"] = args.isolation
        cpu = ServerCpu(dsn, local=args.dsn is None)
        cells = measure(dsn, args.rows, args.repeat, cpu, variants, isolation=args.isolation)
    machine["load_average_at_end"] = list(os.getloadavg())
    print()
    print(tables(cells))
    path = write_results(
        "chunks-isolation" if args.isolation else "chunks",
        {
            "benchmark": "chunks",
            "machine": machine,
            "rows": args.rows,
            "repeat": args.repeat,
            "target_ratio": TARGET_RATIO,
            "admin_application": ADMIN_APPLICATION,
            "cells": [cell.to_json() for cell in cells],
        },
    )
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
