"""Errors that say what happened: lock timeouts, permission denied, ended idle backends."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import JobRepository
from pybatch._cli import exit_code_for
from pybatch.errors import (
    Infrastructure,
    LockTimeout,
    PermissionDenied,
    Rejected,
    StatementCancelled,
    Unavailable,
)
from pybatch.etl import Job, StepRun
from pybatch.values.names import JobName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from tests.support.race import terminate_backend

DAY = {"business_date": "2026-11-30"}


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")
    admin.execute("INSERT INTO public.orders VALUES (1, 'locked')")


def pybatch_backends(admin: psycopg.Connection[Any]) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'pybatch' "
        "AND datname = current_database()"
    ).fetchall()
    return [int(row[0]) for row in rows]


def test_a_lock_timeout_in_a_business_statement_is_its_own_error_and_keeps_the_connection(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    holder = psycopg.connect(admin.info.dsn, password=admin.info.password or None)
    holder.execute("SELECT * FROM public.orders WHERE id = 1 FOR UPDATE")  # holds the row
    seen: dict[str, Any] = {}

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            conn = chunk.connection
            seen["pid"] = conn.info.backend_pid
            chunk.execute("SET LOCAL lock_timeout = '50ms'")
            with pytest.raises(LockTimeout) as caught:
                chunk.execute("UPDATE public.orders SET note = 'mine' WHERE id = 1")
            seen["error"] = caught.value
            seen["broken"] = conn.broken or conn.closed
            chunk.rollback()  # the refused statement poisoned the chunk
        holder.rollback()  # the row is free again
        with step.chunk() as chunk:
            chunk.execute("UPDATE public.orders SET note = 'mine' WHERE id = 1")
            seen["next_pid"] = chunk.connection.info.backend_pid
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})

    try:
        with Job(repository, "lock_timeout", DAY).launch() as run:
            run.step("load", work)
    finally:
        holder.close()
    assert isinstance(seen["error"], LockTimeout)
    assert "55P03" in str(seen["error"])
    assert seen["broken"] is False  # not Infrastructure: the connection was kept ...
    assert seen["next_pid"] == seen["pid"]  # ... and served the next chunk
    row = admin.execute("SELECT note FROM public.orders WHERE id = 1").fetchone()
    assert row == ("mine",)


def test_permission_denied_in_a_repository_call_is_not_unavailable(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("REVOKE INSERT ON pybatch.job_instance FROM PUBLIC")
    admin.execute("CREATE ROLE limited_runtime LOGIN")
    admin.execute("GRANT USAGE ON SCHEMA pybatch TO limited_runtime")
    admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA pybatch TO limited_runtime")
    try:
        limited = repository.config
        dsn = limited.dsn.reveal() + " user=limited_runtime"
        with JobRepository.connect(attrs.evolve(limited, dsn=dsn)) as restricted:
            key = JobInstanceKey(JobName("forbidden"), JobParameters.from_pairs([]))
            with restricted.begin() as uow, pytest.raises(PermissionDenied) as caught:
                uow.instances.select_or_create(key)
        assert not isinstance(caught.value, Unavailable)
        assert caught.value.__context__ is None or caught.value.__suppress_context__
        assert caught.value.object_name == "table job_instance"  # what the role may not touch
        assert "object name table job_instance" in str(caught.value)
    finally:
        admin.execute("DROP OWNED BY limited_runtime")
        admin.execute("DROP ROLE limited_runtime")


def test_a_pooled_connection_whose_backend_ended_while_idle_is_replaced_at_checkout(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    job = Job(repository, "idle_terminated", DAY)
    progress: list[int] = []

    def work(step: StepRun) -> None:
        for offset in (1, 2):
            with step.chunk() as chunk:
                chunk.execute(f"INSERT INTO public.orders VALUES ({offset + 1}, 'row')")
                chunk.commit(read=1, written=1, checkpoint={"offset": offset})
            progress.append(offset)
            if offset == 1:
                # Every idle pooled connection loses its backend between two chunks.
                idle = pybatch_backends(admin)
                assert idle, "the first chunk's connection should be idle in the pool"
                for pid in idle:
                    terminate_backend(admin, pid)

    with job.launch() as run:
        outcome = run.step("load", work)
    assert progress == [1, 2]
    assert outcome.step.metadata.counts.committed == 2
    rows = admin.execute("SELECT count(*) FROM public.orders").fetchone()
    assert rows == (3,)


ROW_SECRET = "row-value-Kq7"


def test_a_business_statement_error_hides_the_driver_error_it_keeps(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    """docs/architecture.md, "Errors and secrets": business statements are raised `from None`.

    The driver's error stays the `__context__` (it describes the ETL's own statement and
    data, for its author's debugger) but is suppressed, so no printed traceback and no
    reporter honouring `__suppress_context__` shows it; it holds no connection.
    """
    seen: dict[str, BaseException] = {}

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            with pytest.raises(Rejected) as rejected:
                # 22P02: the server's message quotes the value it could not read
                chunk.execute("SELECT CAST(%s AS integer)", (ROW_SECRET,))
            seen["rejected"] = rejected.value
            chunk.rollback()  # the refused statement poisoned the chunk
        with step.chunk() as chunk:
            terminate_backend(admin, chunk.connection.info.backend_pid)
            with pytest.raises(Infrastructure) as lost:
                chunk.execute("INSERT INTO public.orders VALUES (3, %s)", (ROW_SECRET,))
            seen["infrastructure"] = lost.value

    with Job(repository, "business_errors", DAY).launch() as run:
        run.step("load", work)
    for error in seen.values():
        assert error.__cause__ is None
        assert error.__suppress_context__ is True
        driver = error.__context__
        assert isinstance(driver, psycopg.Error)
        assert driver.pgconn is None  # no connection (and so no password) behind it
        rendered = "".join(traceback.format_exception(error))
        assert "psycopg" not in rendered and "During handling" not in rendered
        assert ROW_SECRET not in rendered and ROW_SECRET not in str(error)
    assert "22P02" in str(seen["rejected"])
    assert ROW_SECRET in str(seen["rejected"].__context__)  # the author's diagnosis is there


@pytest.mark.parametrize(
    ("statement", "sqlstate", "constraint", "column"),
    [
        (
            "INSERT INTO public.checked VALUES (1, -5, 'x')",
            "23514",
            "checked_amount_positive",
            None,
        ),
        ("INSERT INTO public.checked VALUES (2, 5, NULL)", "23502", None, "note"),
        ("INSERT INTO public.checked VALUES (7, 5, 'x')", "23505", "checked_pkey", None),
    ],
)
def test_a_rejected_business_write_names_its_constraint_table_and_column(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    statement: str,
    sqlstate: str,
    constraint: str | None,
    column: str | None,
) -> None:
    admin.execute(
        "CREATE TABLE public.checked (id bigint PRIMARY KEY, amount int NOT NULL"
        " CONSTRAINT checked_amount_positive CHECK (amount > 0), note text NOT NULL)"
    )
    admin.execute("INSERT INTO public.checked VALUES (7, 1, 'taken')")
    seen: list[Rejected] = []

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            with pytest.raises(Rejected) as rejected:
                chunk.execute(statement)
            chunk.rollback()
        seen.append(rejected.value)

    with Job(repository, "rejected_names", {"sqlstate": sqlstate}).launch() as run:
        run.step("load", work)
    (error,) = seen
    assert (error.sqlstate, error.constraint, error.table, error.column) == (
        sqlstate,
        constraint,
        "checked",
        column,
    )
    assert "table checked" in str(error)
    assert "taken" not in str(error) and "-5" not in str(error)  # names only, never values


def test_a_cancelled_repository_statement_is_statement_cancelled_not_unavailable(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """57014 (statement timeout, pg_cancel_backend) gets its own error: retrying cannot help."""
    holder = psycopg.connect(admin.info.dsn, password=admin.info.password or None)
    holder.execute("LOCK TABLE pybatch.job_instance IN ACCESS EXCLUSIVE MODE")
    raised: list[BaseException] = []

    def launch() -> None:
        try:
            Job(repository, "cancelled", DAY).launch()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=launch, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (waiting := [pid for pid in pybatch_backends(admin) if _waits(admin, pid)]):
            assert time.monotonic() < deadline, "the launch never waited on the lock"
            time.sleep(0.005)
        admin.execute("SELECT pg_cancel_backend(%s)", (waiting[0],))
        thread.join(30)
    finally:
        holder.close()
    assert len(raised) == 1 and isinstance(raised[0], StatementCancelled), raised
    assert raised[0].sqlstate == "57014"
    assert not isinstance(raised[0], (Infrastructure, LockTimeout))
    assert exit_code_for(raised[0]) == 8


def _waits(admin: psycopg.Connection[Any], pid: int) -> bool:
    row = admin.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"
