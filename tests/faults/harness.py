"""Fault injection against a server of the test module's own.

Faults: `restart_immediate` (pg_ctl restart -m immediate: every session dies, nothing in
flight commits), `terminate` (pg_terminate_backend), and switches read by triggers:
`slow_commit` holds COMMIT in a deferred trigger so a fault can land while it is in
flight, `disk_full` raises SQLSTATE 53100, `read_only` raises a standby's 25006 on
pybatch's writes, `slow_progress` stalls pybatch's progress UPDATE. The loader is a plain
pybatch ETL step over a deterministic source; the tests compare the table with the source
by count and sha256, and the step's counters with the rows.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from pybatch import ConnectionConfig, JobRepository, TlsMode
from pybatch.etl import Job, StepRun
from tests.conftest import dsn_for, migrate_template

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "tools" / "pg_ctl_wrapper"

FAULT_SQL = """
CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL);
CREATE TABLE public.fault_switch (name text PRIMARY KEY);
CREATE FUNCTION public.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.fault_switch WHERE name = 'slow_commit') THEN
        PERFORM pg_sleep(20);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON public.orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.slow_commit();
CREATE FUNCTION public.injected_error() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.fault_switch WHERE name = TG_ARGV[0]) THEN
        RAISE EXCEPTION 'injected fault' USING ERRCODE = TG_ARGV[1];
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER disk_full BEFORE INSERT ON public.orders
    FOR EACH ROW EXECUTE FUNCTION public.injected_error('disk_full', '53100');
CREATE TRIGGER disk_full_progress BEFORE UPDATE ON pybatch.step_execution
    FOR EACH ROW EXECUTE FUNCTION public.injected_error('disk_full_progress', '53100');
CREATE TRIGGER read_only BEFORE INSERT OR UPDATE ON pybatch.job_instance
    FOR EACH ROW EXECUTE FUNCTION public.injected_error('read_only', '25006');
CREATE TRIGGER read_only BEFORE INSERT OR UPDATE ON pybatch.job_execution
    FOR EACH ROW EXECUTE FUNCTION public.injected_error('read_only', '25006');
CREATE FUNCTION public.slow_progress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.fault_switch WHERE name = 'slow_progress') THEN
        PERFORM pg_sleep(20);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slow_progress BEFORE UPDATE ON pybatch.step_execution
    FOR EACH ROW EXECUTE FUNCTION public.slow_progress();
"""


class FaultServer:
    """One server and one migrated database, with the fault switches installed (`faults`)."""

    def __init__(self, proc: Any, dbname: str, *, faults: bool = True) -> None:
        self.proc = proc
        self.fields = {
            "host": proc.host,
            "port": proc.port,
            "user": proc.user,
            "dbname": dbname,
            "password": proc.password or None,
        }
        with self.admin("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{dbname}"')
        migrate_template(**self.fields)
        if faults:
            with self.admin() as conn:
                conn.execute(FAULT_SQL)

    def admin(self, dbname: str | None = None) -> psycopg.Connection[Any]:
        fields = {**self.fields, "dbname": dbname or self.fields["dbname"]}
        return psycopg.connect(
            **{k: v for k, v in fields.items() if v is not None}, autocommit=True
        )

    def config(self, **overrides: Any) -> ConnectionConfig:
        return ConnectionConfig(
            dsn=dsn_for(**self.fields), tls_mode=TlsMode.PLAINTEXT, pool_size=4, **overrides
        )

    # ------------------------------------------------------------------ faults

    def restart_immediate(self) -> None:
        """Crash-restart the server: every session dies, nothing in flight commits."""
        # -l: the new postmaster must not inherit our pipes (subprocess would wait on them)
        subprocess.run(
            [str(WRAPPER), "restart", "-D", str(self.proc.datadir), "-m", "immediate", "-w",
             "-t", "60", "-l", str(self.proc.logfile)],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=os.environ.copy(),
            timeout=120,
        )  # fmt: skip
        self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.admin() as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def switch(self, name: str, *, on: bool) -> None:
        with self.admin() as conn:
            if on:
                conn.execute(
                    "INSERT INTO public.fault_switch VALUES (%s) ON CONFLICT DO NOTHING", (name,)
                )
            else:
                conn.execute("DELETE FROM public.fault_switch WHERE name = %s", (name,))

    def sleeping_commit_pid(self, timeout: float = 30.0) -> int:
        """The backend whose COMMIT is held in the slow_commit trigger."""
        deadline = time.monotonic() + timeout
        with self.admin() as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                    "AND application_name = 'pybatch'"
                ).fetchone()
                if row is not None:
                    return int(row[0])
                time.sleep(0.01)
        raise AssertionError("no COMMIT reached the slow_commit trigger")

    def terminate(self, pid: int) -> None:
        with self.admin() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            deadline = time.monotonic() + 30
            while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                assert time.monotonic() < deadline, f"backend {pid} survived"
                time.sleep(0.005)

    def reset(self) -> None:
        with self.admin() as conn:
            conn.execute("DELETE FROM public.fault_switch")
            conn.execute("TRUNCATE public.orders")

    # ------------------------------------------------------------------ the workload

    def table_digest(self) -> tuple[int, str]:
        with self.admin() as conn:
            rows = conn.execute("SELECT id, note FROM public.orders ORDER BY id").fetchall()
        return len(rows), digest(rows)


def source(total: int) -> list[tuple[int, str]]:
    return [(item, f"order-{item}-{item * 7919 % 1000:03d}") for item in range(1, total + 1)]


def digest(rows: list[tuple[int, str]] | list[Any]) -> str:
    h = hashlib.sha256()
    for item, note in rows:
        h.update(f"{item}|{note}\n".encode())
    return h.hexdigest()


Hook = Callable[[int, str, Any], None]


def loader(rows: list[tuple[int, str]], size: int, hook: Hook) -> Callable[[StepRun], None]:
    """Load `rows` from the step's checkpoint on; `hook(index, point, chunk)` injects faults.

    Points: "written" (rows inserted, before commit; `chunk` is the open chunk) and
    "committed" (`chunk` is None).
    """

    def work(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < len(rows):
            batch = rows[offset : offset + size]
            index = offset // size
            with step.chunk() as chunk:
                chunk.executemany("INSERT INTO public.orders (id, note) VALUES (%s, %s)", batch)
                hook(index, "written", chunk)
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})
            hook(index, "committed", None)

    return work


def run_once(
    config: ConnectionConfig,
    job_name: str,
    rows: list[tuple[int, str]],
    size: int,
    hook: Hook,
    *,
    steps_before: tuple[str, ...] = (),
) -> BaseException | None:
    """One attempt of the job; returns the error it ended with (None when it completed).

    `steps_before`: steps with nothing to write, run before the loader's step "load".
    """
    try:
        with JobRepository.connect(config) as repository:
            with Job(repository, job_name, {"run": "faults"}).launch() as run:
                for name in steps_before:
                    run.step(name, lambda step: None)
                run.step("load", loader(rows, size, hook))
    except Exception as error:  # the typed error the script sees
        return error
    return None


def step_counts(server: FaultServer, job_name: str) -> tuple[int, int, int]:
    with server.admin() as conn:
        row = conn.execute(
            """
            SELECT s.read_count, s.write_count, s.checkpoint_payload->>'offset'
            FROM pybatch.step_execution AS s
            JOIN pybatch.job_execution AS e ON e.id = s.job_execution_id
            JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id
            WHERE i.job_name = %s
            ORDER BY s.id DESC LIMIT 1
            """,
            (job_name,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2] or 0)
