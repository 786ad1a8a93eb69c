"""`pybatch demo`: load a CSV with the ETL API, SIGKILL the loader part-way, resume, verify.

The restart records an audited OWNER_LOST decision; exit 0 only if the table equals the CSV
and the counters equal the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import itertools
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import date, timedelta
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import attrs

from pybatch._cli import _connection as cli
from pybatch._config import ConnectionConfig, TlsMode
from pybatch._demo.embedded import EmbeddedPostgres, EmbeddedPostgresUnavailable
from pybatch._job_repository import JobRepository
from pybatch._migrator import migrate
from pybatch._statements import load_statements
from pybatch._unit_of_work import UnitOfWork
from pybatch.errors import Unavailable
from pybatch.etl import Job, StepRun
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import BatchStatus

JOB_NAME = "pybatch_demo_load"
STEP_NAME = "load"
COLUMNS = ("id", "customer", "amount", "order_day")
WORKER_COMMAND = "demo-worker"
#: The demo's lease: a killed worker's attempt is recovered at most this long after its death.
DEMO_LEASE = timedelta(seconds=2)
_CUSTOMERS = tuple(
    "Acme Tools|Blue Harbor|Cedar & Sons|Delta Foods|Evergreen Labs|Fjord Outfitters|"
    "Granite Works|Helios Energy|Indigo Print|Juniper Cafe".split("|")
)
_FIRST_DAY = date(2026, 1, 1)


def register(commands: cli.Commands) -> None:
    """Add `pybatch demo` and the worker it runs (hidden: added without help)."""
    demo = commands.add_parser(
        "demo",
        help="load a CSV, SIGKILL the loader part-way, resume and verify",
        description="Load a generated CSV through the ETL API in a child process, SIGKILL it "
        "part-way, restart it, and verify that the table equals the CSV.",
    )
    demo.add_argument("--rows", type=_positive, default=100_000, help="rows to load (100000)")
    demo.add_argument(
        "--chunk-size", type=_positive, default=1000, help="rows per chunk commit (1000)"
    )
    cli.add_connection_arguments(
        demo,
        dsn_help="run on this database instead of an embedded server; its pybatch_demo schema "
        "is dropped and created again (the DSN is never printed)",
    )
    demo.add_argument(
        "--kill-after-chunks",
        type=_non_negative,
        metavar="N",
        help="SIGKILL the loader once N chunks are committed (default: random; 0: never)",
    )
    demo.add_argument("--seed", type=int, default=42, help="seed of the data and the kill (42)")
    demo.set_defaults(handler=_demo)

    worker = cli.add_command(commands, WORKER_COMMAND, _worker, connects=False)
    worker.add_argument("--csv", required=True, type=Path)
    worker.add_argument("--chunk-size", required=True, type=_positive)
    worker.add_argument("--run", required=True)
    worker.add_argument("--kill-after-chunks", type=_non_negative, default=0)


def _non_negative(text: str, minimum: int = 0) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(
            "must be at least 1" if minimum else "must not be negative"
        )
    return value


_positive = partial(_non_negative, minimum=1)


def _job(repository: JobRepository, run: str) -> Job:
    """The demo job; the run id makes every demo run its own job instance."""
    return Job(repository, JOB_NAME, {"run": run}, lease=DEMO_LEASE)


def _worker(args: argparse.Namespace) -> int:
    """The child process: launch or restart the job and load the CSV from its checkpoint."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stopped run stays restartable
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with JobRepository.connect(ConnectionConfig.from_env()) as repository:
        # A restart waits for the killed attempt's lease (DEMO_LEASE), then recovers it.
        with _job(repository, args.run).launch() as run:
            run.step(STEP_NAME, partial(_load, args.csv, args.chunk_size, args.kill_after_chunks))
    return 0


def _load(csv_path: Path, chunk_size: int, kill_after: int, step: StepRun) -> None:
    """COPY the CSV from the committed offset on, one chunk (and checkpoint) at a time.

    With `kill_after` N (0: never) the process SIGKILLs itself in chunk N + 1, once its rows
    are copied and before they commit: none of them may survive.
    """
    copy_orders = load_statements("demo").copy_demo_orders.query
    offset = int(step.checkpoint.get("offset", 0))
    logging.getLogger("pybatch.demo").info(
        "attempt %s loads from offset %s", step.run.attempt, offset
    )
    with csv_path.open(newline="", encoding="utf-8") as source:
        rows = itertools.islice(csv.reader(source), offset + 1, None)  # past the header too
        while batch := list(itertools.islice(rows, chunk_size)):
            with step.chunk() as chunk:
                chunk.copy(copy_orders, batch)
                if kill_after and offset == kill_after * chunk_size:
                    os.kill(os.getpid(), signal.SIGKILL)
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})


class _Stop(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; unwinding stops the worker, the server and the temp files."""


@attrs.define
class _Signals:
    """Turns the first SIGINT/SIGTERM into `_Stop`; once shielded (cleanup) they are only noted."""

    received: int | None = None
    shielded: bool = False
    _previous: dict[int, Any] = attrs.Factory(dict)

    def __enter__(self) -> _Signals:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for signum in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(signum) is not signal.SIG_IGN:  # e.g. nohup, `&` in sh
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            return
        self.received = signum
        if not self.shielded:
            raise _Stop(signum)


@attrs.frozen
class _Source:
    path: Path
    rows: int
    size: int
    sha256: str


@attrs.frozen
class _Attempt:
    execution: JobExecution
    step: StepExecution | None
    decision: RecoveryDecision | None


def _stop_worker(process: subprocess.Popen[bytes]) -> None:
    """Stop a worker still running when the demo ends; it records its run as STOPPED."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _demo(args: argparse.Namespace) -> int:
    began = time.monotonic()
    print(
        f"pybatch demo: {args.rows:,} orders in chunks of {args.chunk_size:,}; the loader is "
        "killed part-way and resumes",
        flush=True,
    )
    code = 1
    with _Signals() as signals:
        try:
            with ExitStack() as stack:
                try:
                    code = _run_demo(args, stack)
                finally:
                    signals.shielded = True  # cleanup (the stack unwinding) must not be cut short
        except _Stop:
            pass
        except EmbeddedPostgresUnavailable as error:
            print(f"pybatch demo: no embedded PostgreSQL: {error}", file=sys.stderr)
            print("pybatch demo: or run it on a database of yours with --dsn", file=sys.stderr)
            return 3
    if signals.received is not None:
        name = signal.Signals(signals.received).name
        print(
            f"pybatch demo: stopped by {name}; worker, server and temporary files cleaned up",
            flush=True,
        )
        return 128 + signals.received
    verdict = "all checks passed" if code == 0 else "demo FAILED"
    print(f"{verdict} ({time.monotonic() - began:.1f} s in all, cleanup included)", flush=True)
    return code


def _run_demo(args: argparse.Namespace, stack: ExitStack) -> int:
    """Set everything up on `stack` (which undoes it), then load and verify."""
    chunks = math.ceil(args.rows / args.chunk_size)
    rng = random.Random(args.seed)
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pybatch-demo-")))
    if args.dsn is None:
        server = stack.enter_context(EmbeddedPostgres())
        config = ConnectionConfig(dsn=server.dsn, tls_mode=TlsMode.PLAINTEXT)
        where = f"embedded on 127.0.0.1:{server.port}, removed on exit"
    else:
        config = cli.config_from_args(args)
        where = "from --dsn"
    migrate(config)
    repository = stack.enter_context(JobRepository.connect(config))
    with repository.read_transaction() as conn:
        number = conn.info.server_version
    _line("server", f"PostgreSQL {number // 10000}.{number % 10000} ({where})")
    source = _write_source(directory / "orders.csv", args.rows, rng)
    _line("source", f"{_n(source.rows, 'row')}, {_size(source.size)} CSV, seed {args.seed}")
    repository.run_in_unit_of_work(_recreate_target)
    _line("target", "pybatch_demo.orders, created empty")
    kill_after: int | None = args.kill_after_chunks
    if kill_after is None:
        kill_after = rng.randint(max(1, chunks // 5), max(1, chunks * 3 // 5)) if chunks > 1 else 0
    run = uuid.uuid4().hex
    argv = ["--csv", str(source.path), "--chunk-size", str(args.chunk_size), "--run", run]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYBATCH_")}
    # The DSN goes through the environment, never the command line.
    env.update(PYBATCH_DSN=config.dsn.reveal(), PYBATCH_TLS=config.tls_mode.value)

    def start(attempt: int, *extra: str) -> subprocess.Popen[bytes]:
        with (directory / f"worker-{attempt}.log").open("wb") as log:  # the worker has a copy
            process = subprocess.Popen(
                [sys.executable, "-m", "pybatch", WORKER_COMMAND, *argv, *extra],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # terminal signals reach the parent, which stops it
            )
        stack.callback(_stop_worker, process)
        return process

    key = _job(repository, run).key
    return _load_and_verify(repository, key, start, source, chunks, kill_after)


def _load_and_verify(
    repository: JobRepository,
    key: JobInstanceKey,
    start: Callable[..., subprocess.Popen[bytes]],
    source: _Source,
    chunks: int,
    kill_after: int,
) -> int:
    load_began = time.monotonic()
    first = start(1, "--kill-after-chunks", str(kill_after))
    first.wait()
    killed_at = time.monotonic() - load_began
    killed = first.returncode == -signal.SIGKILL  # else it ended before the kill
    if not killed and first.returncode != 0:
        return _worker_failed(source.path.parent, 1, first.returncode)
    if killed:
        second = start(2)
        if second.wait() != 0:
            return _worker_failed(source.path.parent, 2, second.returncode)
    load_seconds = time.monotonic() - load_began

    attempts = _attempts(repository, key)
    if killed:
        _report_restart(attempts, chunks, killed_at, load_seconds - killed_at)
    else:
        reason = (
            "it finished before the kill could land"
            if kill_after > 0
            else "there was no kill to do"
            if chunks > 1
            else "one chunk leaves nothing to kill part-way"
        )
        _line("attempt 1", f"loaded every chunk: {reason}")
    _line(
        "load",
        f"{_n(chunks, 'chunk')} in {load_seconds:.2f} s = {source.rows / load_seconds:,.0f} rows/s "
        f"(wall clock, {'with' if killed else 'without'} the kill and restart)",
    )

    with repository.read_transaction() as conn:
        digest = load_statements("demo").demo_orders_digest.one(conn)
    if digest is None:  # an aggregate always returns its row
        raise Unavailable()
    final, rows, table_sha = attempts[-1], digest["row_count"], str(digest["sha256"])
    counts = final.step.metadata.counts if final.step is not None else None
    checks = [
        ("count", rows == source.rows, f"{rows:,} rows in the table, {source.rows:,} in the CSV"),
        (
            "sha256",
            table_sha == source.sha256,
            f"{table_sha[:16]}… table, {source.sha256[:16]}… CSV (rows in id order)",
        ),
        (
            "counters",
            counts is not None
            and counts.read == counts.written == source.rows
            and counts.committed == chunks,
            "no step"
            if counts is None
            else f"read {counts.read:,}, written {counts.written:,}, "
            f"in {_n(counts.committed, 'chunk commit')}",
        ),
        (
            "job",
            final.execution.status is BatchStatus.COMPLETED,
            f"attempt {final.execution.attempt} {final.execution.status.value}",
        ),
    ]
    print("verify", flush=True)
    for label, ok, text in checks:
        _line(label, f"{'ok  ' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def _report_restart(
    attempts: list[_Attempt], chunks: int, killed_at: float, resumed_for: float
) -> None:
    first, second = attempts[0], attempts[-1]
    done = first.step.metadata.counts.committed if first.step is not None else 0
    offset = first.step.checkpoint.payload.get("offset", 0) if first.step is not None else 0
    _line(
        "attempt 1",
        f"SIGKILLed {killed_at:.2f} s in, after {done:,} of {chunks:,} chunks were committed",
    )
    if (decision := first.decision) is not None:
        audit = (
            f"{decision.prior_status.value} → {decision.resulting_status.value}, "
            f"audited decision {decision.reason_code} by {decision.operator_reference}"
        )
    else:
        audit = f"{first.execution.status.value}, no recovery decision recorded"
    _line(f"attempt {second.execution.attempt}", f"found attempt 1 orphaned: {audit}")
    _line("", f"resumed at offset {offset:,} (chunk {done + 1:,}), done {resumed_for:.2f} s later")


def _attempts(repository: JobRepository, key: JobInstanceKey) -> list[_Attempt]:
    with repository.begin() as uow:
        instance = uow.instances.find(key)
        if instance is None:  # the demo's own launch created it
            raise Unavailable()
        found = []
        for execution in uow.executions.of_instance(instance.id):
            steps = uow.steps.of_execution(execution.id)
            decision = uow.recovery.decision(execution.id)
            found.append(_Attempt(execution, steps[-1] if steps else None, decision))
    return found


def _worker_failed(directory: Path, attempt: int, returncode: int) -> int:
    print(f"pybatch demo: worker attempt {attempt} failed (exit {returncode}):", file=sys.stderr)
    log = (directory / f"worker-{attempt}.log").read_text(errors="replace").strip().splitlines()
    for line in log[-20:]:
        print(f"  {line}", file=sys.stderr)
    return 1


def _recreate_target(uow: UnitOfWork) -> None:
    q = load_statements("demo")
    for statement in (q.drop_demo_schema, q.create_demo_schema, q.create_demo_orders):
        statement.affected(uow.connection)


def _write_source(path: Path, rows: int, rng: random.Random) -> _Source:
    """Write the deterministic CSV; its sha256 covers the rows as the table's digest does."""
    digest = hashlib.sha256()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row_id in range(1, rows + 1):
            cents = rng.randrange(100, 1_000_000)
            row = (
                str(row_id),
                f"{rng.choice(_CUSTOMERS)} #{rng.randrange(1, 1000):03d}",
                f"{cents // 100}.{cents % 100:02d}",
                (_FIRST_DAY + timedelta(days=rng.randrange(365))).isoformat(),
            )
            writer.writerow(row)
            digest.update((",".join(row) + "\n").encode())
    return _Source(path, rows, path.stat().st_size, digest.hexdigest())


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _line(label: str, text: str) -> None:
    print(f"  {label:<10}{text}", flush=True)
