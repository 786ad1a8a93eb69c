"""Through PgBouncer: pybatch keeps its settings and its guarantees in session and transaction mode.

A pooler refuses the startup `options` that carry pybatch's timeouts, or (configured with
`ignore_startup_parameters = options`) drops them silently. Each pooler mode has its
`Pooler` setting: session mode sets them once per connection, transaction mode at the start
of every transaction, and prepares nothing on the server. The tests run the real PgBouncer in
front of the suite's server: jobs killed and resumed, concurrent launches, a stop, the
explorer and the audit chain, all through the pooler.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from pybatch import (
    ConnectionConfig,
    JobRepository,
    Pooler,
    UnitOfWork,
    installed_schema_version,
    migrate,
    supported_schema_version,
)
from pybatch.errors import (
    ExecutionAlreadyActive,
    LockTimeout,
    PoolerRefused,
    SettingsNotApplied,
)
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus
from tests.conftest import dsn_for, plaintext_config
from tests.contract.test_one_round_trip_transactions import traced
from tests.crash import worker as w
from tests.crash.test_etl_crash import Worker, check_consistent, durable_state
from tests.support.pgbouncer import Bouncer, pgbouncer
from tests.support.race import race
from tests.support.statements import support_statements

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
MODES = ("session", "transaction")
EXPECTED = {
    "transaction_isolation": "read committed",
    "statement_timeout": "30s",
    "lock_timeout": "200ms",
    "idle_in_transaction_session_timeout": "1min",
    "time_zone": "UTC",
}


@pytest.fixture(params=MODES)
def bouncer(request: pytest.FixtureRequest, postgresql_proc: Any) -> Iterator[Bouncer]:
    with pgbouncer(
        server_port=postgresql_proc.port, user=postgresql_proc.user, pool_mode=request.param
    ) as running:
        yield running


def pooled(bouncer: Bouncer, admin: psycopg.Connection[Any], **overrides: Any) -> ConnectionConfig:
    """The test database through `bouncer`, with the pooler setting of its mode."""
    info = admin.info
    return plaintext_config(
        bouncer.dsn(user=info.user, dbname=info.dbname),
        pooler=Pooler(bouncer.pool_mode),
        lock_timeout=datetime.timedelta(milliseconds=200),
        **overrides,
    )


def settings_in_force(conn: psycopg.Connection[Any], repository: JobRepository) -> dict[str, str]:
    row = support_statements().get_transaction_settings.one(conn)
    assert row is not None
    return {name: str(row[name]) for name in EXPECTED}


def settings_alone(uow: UnitOfWork, repository: JobRepository) -> tuple[Any, list[str]]:
    """The settings read as a unit of work of one statement, and its protocol trace."""
    rows: list[Any] = []
    statement = support_statements().get_transaction_settings
    conn = uow._lease.connection
    assert conn is not None
    trace = traced(conn, lambda: rows.append(uow.commit_statement(statement, {}, lambda r: r)))
    return rows[0], trace


def test_a_pooler_that_refuses_startup_options_is_named_with_its_fix(
    postgresql_proc: Any, admin: psycopg.Connection[Any]
) -> None:
    with pgbouncer(
        server_port=postgresql_proc.port, user=postgresql_proc.user, pool_mode="transaction"
    ) as running:
        config = plaintext_config(running.dsn(user=admin.info.user, dbname=admin.info.dbname))
        with pytest.raises(PoolerRefused) as refused:
            JobRepository.connect(config)
    assert "PYBATCH_POOLER" in str(refused.value)


def test_startup_options_a_pooler_dropped_are_refused_never_run_without(
    postgresql_proc: Any, admin: psycopg.Connection[Any]
) -> None:
    with pgbouncer(
        server_port=postgresql_proc.port,
        user=postgresql_proc.user,
        pool_mode="transaction",
        ignore_options=True,
    ) as running:
        config = plaintext_config(running.dsn(user=admin.info.user, dbname=admin.info.dbname))
        with pytest.raises(SettingsNotApplied) as refused:
            JobRepository.connect(config)
    assert refused.value.setting == "statement_timeout"
    assert refused.value.expected == "30000" and refused.value.found == "0"


def test_every_transaction_runs_with_pybatchs_settings_through_the_pooler(
    bouncer: Bouncer, admin: psycopg.Connection[Any]
) -> None:
    # A managed server's defaults differ from pybatch's; pooled server connections carry
    # them (and whatever other clients set): pybatch sets its own in each transaction.
    for setting, value in (
        ("default_transaction_isolation", "serializable"),
        ("statement_timeout", "777s"),
        ("lock_timeout", "0"),
        ("idle_in_transaction_session_timeout", "0"),
        ("TimeZone", "America/New_York"),
    ):
        admin.execute(f"ALTER DATABASE \"{admin.info.dbname}\" SET {setting} = '{value}'")
    with JobRepository.connect(pooled(bouncer, admin, pool_size=2)) as repository:
        for _ in range(6):
            with repository.read_transaction() as conn:
                assert settings_in_force(conn, repository) == EXPECTED
            with repository.begin() as uow:
                assert settings_in_force(uow.connection, repository) == EXPECTED
            with repository.begin() as uow:  # BEGIN, settings, statement, COMMIT: one Sync
                row, trace = settings_alone(uow, repository)
                assert [m for m in trace if m.startswith("F") and "\tSync" in m] == ["F\t4\tSync"]
                assert {name: str(row[name]) for name in EXPECTED} == EXPECTED
        job = Job(repository, "pooled_settings", {"day": bouncer.pool_mode})
        seen: list[dict[str, str]] = []

        def chunks(step: StepRun) -> None:
            for number in range(5):
                with step.chunk() as chunk:
                    seen.append(settings_in_force(chunk.connection, repository))
                    chunk.commit(read=1, written=1, checkpoint={"n": number})

        with job.launch() as run:
            run.step("load", chunks)
    assert seen == [EXPECTED] * 5


def test_partition_workers_end_and_claim_in_one_transaction_through_the_pooler(
    bouncer: Bouncer, admin: psycopg.Connection[Any]
) -> None:
    # Each worker ends its partition and claims the next in one pipelined transaction; in
    # transaction mode nothing is prepared, so the server connections stay interchangeable.
    ran: list[str] = []
    with JobRepository.connect(pooled(bouncer, admin, pool_size=2)) as repository:
        plan: dict[str, dict[str, int]] = {f"p{number}": {} for number in range(6)}
        with Job(repository, "pooled_plan", {"day": bouncer.pool_mode}).launch() as run:
            outcome = run.partitioned_step("load", plan, lambda p: ran.append(p.key), workers=0)
        with repository.begin() as uow:
            partitions = uow.partitions.plan(outcome.step.id)
    assert outcome.step.status is BatchStatus.COMPLETED and sorted(ran) == sorted(plan)
    assert [(p.status, p.version) for p in partitions] == [(BatchStatus.COMPLETED, 2)] * 6
    assert len({p.worker_step_execution_id for p in partitions}) == 6


def test_a_lock_wait_in_a_chunk_still_ends_at_the_lock_timeout_through_the_pooler(
    bouncer: Bouncer, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE TABLE public.locked (id bigint PRIMARY KEY)")
    info = admin.info
    holder = psycopg.connect(
        dsn_for(host=info.host, port=info.port, user=info.user, dbname=info.dbname)
    )
    try:
        holder.execute("LOCK TABLE public.locked IN ACCESS EXCLUSIVE MODE")
        with JobRepository.connect(pooled(bouncer, admin)) as repository:
            job = Job(repository, "pooled_lock", {"day": bouncer.pool_mode})
            waited: list[float] = []

            def blocked(step: StepRun) -> None:
                with step.chunk() as chunk:
                    started = time.monotonic()
                    with pytest.raises(LockTimeout):
                        chunk.execute("INSERT INTO public.locked VALUES (1)")
                    waited.append(time.monotonic() - started)
                    chunk.rollback()

            with job.launch() as run:
                run.step("load", blocked)
    finally:
        holder.close()
    assert waited and waited[0] < 5, waited


def test_eight_concurrent_jobs_complete_through_transaction_pooling_without_session_state(
    postgresql_proc: Any, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE TABLE public.pooled_rows (job int, n int, PRIMARY KEY (job, n))")
    with pgbouncer(
        server_port=postgresql_proc.port, user=postgresql_proc.user, pool_mode="transaction"
    ) as running:
        config = pooled(running, admin, pool_size=2)

        def one_job(number: int) -> BatchStatus:
            with JobRepository.connect(config) as repository:
                job = Job(repository, "pooled_many", {"job": str(number)})

                def load(step: StepRun) -> None:
                    for chunk_number in range(10):
                        rows = [(number, chunk_number * 10 + i) for i in range(10)]
                        with step.chunk() as chunk:
                            chunk.executemany(
                                "INSERT INTO public.pooled_rows VALUES (%s, %s)", rows
                            )
                            chunk.commit(read=10, written=10, checkpoint={"c": chunk_number})

                with job.launch() as run:
                    run.step("load", load)
                return run.execution.status if run.execution else BatchStatus.UNKNOWN

        outcomes = race(8, one_job, timeout=120)
    statuses = [outcome.value if outcome.ok else outcome.error for outcome in outcomes]
    assert statuses == [BatchStatus.COMPLETED] * 8, statuses
    counts = admin.execute(
        "SELECT job, count(*) FROM public.pooled_rows GROUP BY job ORDER BY job"
    ).fetchall()
    assert counts == [(n, 100) for n in range(8)]
    # Nothing of a client outlives its transaction on the shared server connections.
    assert admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    ).fetchone() == (0,)


def test_concurrent_launches_through_the_pooler_start_exactly_one_run(
    bouncer: Bouncer, admin: psycopg.Connection[Any]
) -> None:
    config = pooled(bouncer, admin, pool_size=2)
    refusals = threading.Semaphore(0)

    def launch(_: int) -> str:
        with JobRepository.connect(config) as repository:
            try:
                run = Job(repository, "pooled_race", {"day": "1"}).launch()
            except ExecutionAlreadyActive:
                refusals.release()
                return "refused"
            with run:  # live until every other launch was refused
                for _ in range(5):
                    assert refusals.acquire(timeout=60)
                run.step("noop", lambda step: None)
            return "launched"

    outcomes = [o.value if o.ok else repr(o.error) for o in race(6, launch, timeout=120)]
    assert sorted(map(str, outcomes)) == ["launched"] + ["refused"] * 5, outcomes


def wait_for_pooled_transactions_to_end(admin: psycopg.Connection[Any]) -> None:
    """A killed worker's transaction may still be ending; the pooler keeps its server sessions."""
    deadline = time.monotonic() + 30
    while True:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'pybatch' AND state <> 'idle'"
        ).fetchone()
        if row == (0,):
            return
        assert time.monotonic() < deadline, "a killed worker's transaction did not end"
        time.sleep(0.005)


def cli(
    bouncer: Bouncer, admin: psycopg.Connection[Any], *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYBATCH_")}
    env |= {
        "PYBATCH_DSN": bouncer.dsn(user=admin.info.user, dbname=admin.info.dbname),
        "PYBATCH_TLS": "plaintext",
        "PYBATCH_POOLER": bouncer.pool_mode,
    }
    return subprocess.run(
        [sys.executable, "-m", "pybatch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
        check=False,
    )


def test_stop_explorer_and_audit_work_through_the_pooler(
    bouncer: Bouncer, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
    config = pooled(bouncer, admin)
    launched = threading.Event()
    state: dict[str, Any] = {}

    def etl() -> None:
        with JobRepository.connect(config) as repository:
            job = Job(repository, "pooled_stop", {"day": "1"}, lease=datetime.timedelta(seconds=2))
            with job.launch() as run:
                state["run"] = run

                def endless(step: StepRun) -> None:
                    offset = 0
                    while True:
                        with step.chunk() as chunk:
                            chunk.execute("INSERT INTO public.orders VALUES (%s)", (offset,))
                            offset += 1
                            chunk.commit(read=1, written=1, checkpoint={"offset": offset})
                        launched.set()
                        time.sleep(0.05)

                run.step("load", endless)

    worker = threading.Thread(target=etl, daemon=True)
    worker.start()
    assert launched.wait(30)
    execution_id = state["run"].execution.id
    stopped = cli(bouncer, admin, "stop", str(execution_id), "--wait", "--operation-id", "s-1")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines()[-1] == f"execution {execution_id} ended STOPPED"
    worker.join(30)
    assert state["run"].stopped
    orders = admin.execute("SELECT count(*) FROM public.orders").fetchone()
    assert orders is not None
    shown = cli(bouncer, admin, "show", str(execution_id), "--json")
    assert shown.returncode == 0, shown.stderr
    shown_json = json.loads(shown.stdout)
    assert shown_json["execution"]["status"] == "STOPPED", shown_json
    steps = shown_json["steps"]
    assert [step["counts"]["written"] for step in steps] == [orders[0]], steps
    instances = cli(bouncer, admin, "instances", "pooled_stop", "--json")
    assert instances.returncode == 0, instances.stderr
    [instance] = json.loads(instances.stdout)["items"]
    listed = cli(bouncer, admin, "executions", str(instance["id"]), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["id"] for e in json.loads(listed.stdout)["items"]] == [execution_id]
    verified = cli(bouncer, admin, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


#: Where each of the three kills lands, in an order the seed shuffles.
POOLED_KILLS = ("after_write", "commit_race", "after_commit")


@pytest.mark.parametrize("mode", MODES)
def test_a_load_killed_three_times_through_the_pooler_resumes_exactly(
    mode: str, postgresql_proc: Any, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rng = random.Random(f"pooler-{mode}")
    run = f"pooled-{mode}"
    admin.execute(w.CREATE_TABLE)
    info = admin.info
    direct = plaintext_config(
        dsn_for(host=info.host, port=info.port, user=info.user, dbname=info.dbname)
    )
    with pgbouncer(
        server_port=postgresql_proc.port, user=postgresql_proc.user, pool_mode=mode
    ) as running:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CRASH_"))}
        env |= {
            "PYBATCH_DSN": running.dsn(user=admin.info.user, dbname=admin.info.dbname),
            "PYBATCH_TLS": "plaintext",
            "PYBATCH_POOLER": mode,
            "CRASH_RUN": run,
            "CRASH_PAUSE": "none",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        previous = 0
        # Each kill lands at a named point of a chosen chunk, never after a wall-clock sleep:
        # a load through the pooler can finish inside any sleep short enough to be useful.
        for number, pause in enumerate(rng.sample(POOLED_KILLS, k=len(POOLED_KILLS))):
            pause_chunk = rng.randint(1, 30)
            context = f"{mode}, kill {number + 1} ({pause}, chunk {pause_chunk})"
            worker = Worker(
                env | {"CRASH_PAUSE": pause, "CRASH_PAUSE_CHUNK": str(pause_chunk)},
                tmp_path / f"worker-{number}.log",
            )
            span: tuple[int, int] | None = None
            try:
                while span is None:
                    _, words = worker.next_line()
                    assert words is not None, Path(worker._log.name).read_text()[-3000:]
                    if words[0] == "begin":
                        assert int(words[1]) == previous, (context, words, previous)
                    elif words[0] == "ready":
                        assert words[1] == pause, (context, words)
                        span = (int(words[2]), int(words[3]))
                        if pause == "commit_race":
                            time.sleep(rng.uniform(0, 0.001))
            finally:
                worker.kill()
            assert worker.wait() == -signal.SIGKILL
            state = durable_state(direct, admin, run, settle=wait_for_pooled_transactions_to_end)
            check_consistent(state, context)
            before, after = span
            if pause == "after_write":  # written through the pooler, never committed
                assert state.offset == before, (context, state)
            elif pause == "after_commit":
                assert state.offset == after, (context, state)
            else:  # the kill raced the chunk's commit
                assert before <= state.offset < w.ROWS, (context, state)
            previous = state.offset
        final = Worker(env, tmp_path / "final.log")
        said = []
        while (words := final.next_line()[1]) is not None:
            said.append(words)
        assert final.wait() == 0, Path(final._log.name).read_text()[-3000:]
        assert ["begin", str(previous)] in said and said[-1] == ["done"], said
    state = durable_state(direct, admin, run, settle=wait_for_pooled_transactions_to_end)
    assert state.table_count == w.ROWS and state.table_sha256 == w.source_sha256(w.ROWS), state
    assert state.read == state.written == w.ROWS, state


@pytest.mark.parametrize("mode", MODES)
def test_migrate_installs_the_schema_through_the_pooler(
    mode: str, postgresql_proc: Any, blank_database: str
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(blank_database)["dbname"]
    with pgbouncer(
        server_port=postgresql_proc.port, user=postgresql_proc.user, pool_mode=mode
    ) as running:
        config = plaintext_config(
            running.dsn(user=postgresql_proc.user, dbname=str(dbname)), pooler=Pooler(mode)
        )
        applied = migrate(config)
        assert applied, "nothing was migrated"
        assert installed_schema_version(config) == supported_schema_version()
        with JobRepository.connect(config) as repository:
            with Job(repository, "after_pooled_migrate", {"day": mode}).launch() as run:
                run.step("noop", lambda step: None)
        assert run.execution is not None and run.execution.status is BatchStatus.COMPLETED
