"""A unit of work that is one statement commits in one round trip (`UnitOfWork.commit_statement`).

It travels alone, as its own READ COMMITTED transaction (behind a pooler BEGIN, statement and
COMMIT share one Sync: tests/topology/test_pgbouncer.py); a refused statement or COMMIT leaves
nothing committed and the pooled connection usable; a connection lost with the statement sent
is CommitOutcomeUnknown, never success and never a plain failure.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import pq

from pybatch import ConnectionConfig, JobRepository, UnitOfWork
from pybatch._codecs.instances import encode_job_instance_key
from pybatch.errors import CommitOutcomeUnknown, IntegrityViolation, Unavailable, UnitOfWorkClosed
from pybatch.etl import Job
from pybatch.values.names import JobName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from tests.support.clock import ManualClock
from tests.support.race import terminate_backend, wait_until_lock_wait
from tests.support.statements import support_statements

_runs = itertools.count(1)


def insert_instance(uow: UnitOfWork, key: JobInstanceKey, **changes: object) -> Any:
    """The instance of `key` inserted as the unit of work's one statement."""
    params = {**encode_job_instance_key(key), **changes, "now": uow.clock.now()}
    return uow.commit_statement(uow.statements.insert_job_instance_if_absent, params, lambda r: r)


def new_key() -> JobInstanceKey:
    return JobInstanceKey(JobName("alone"), JobParameters.of({"run": next(_runs)}))


def instances(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM pybatch.job_instance").fetchone()
    assert row is not None
    return int(row[0])


def traced(conn: psycopg.Connection[Any], run: Any) -> list[str]:
    """The protocol messages `run()` exchanges on `conn` (libpq's trace), one per line."""
    with tempfile.TemporaryFile(mode="w+") as handle:
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            run()
        finally:
            conn.pgconn.untrace()
        handle.seek(0)
        return handle.read().splitlines()


def test_a_one_statement_unit_of_work_is_one_round_trip_and_read_committed(
    pg_config: ConnectionConfig, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Alone in autocommit: the startup options make it READ COMMITTED whatever the default."""
    admin.execute(
        f"ALTER DATABASE \"{admin.info.dbname}\" SET default_transaction_isolation = 'serializable'"
    )
    key = new_key()
    with JobRepository.connect(pg_config, clock=clock) as repository:
        with repository.begin() as uow:
            conn = uow.connection
            rows: list[Any] = []
            trace = traced(conn, lambda: rows.append(insert_instance(uow, key)))
            assert not uow.is_open  # the statement was the whole unit of work
            uow.commit()  # already committed: nothing to do
        with repository.begin() as uow:
            settings = uow.commit_statement(
                support_statements().get_transaction_settings, {}, lambda row: row
            )
    sent = [line.split("\t")[2] for line in trace if line.startswith("F")]
    assert sent.count("Sync") == 1, trace
    assert [line for line in trace if "ReadyForQuery" in line] == ["B\t5\tReadyForQuery\t I"]
    parsed = [line.split()[-1] for line in trace if "\tParse\t" in line]
    assert parsed == ["insert_job_instance_if_absent"]
    assert rows[0]["job_name"] == "alone" and instances(admin) == 1
    assert settings is not None and settings["transaction_isolation"] == "read committed"
    assert conn.autocommit is False  # handed back to the pool as configured


def test_a_refused_statement_commits_nothing_and_leaves_the_connection_usable(
    pg_config: ConnectionConfig, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    one_connection = attrs.evolve(pg_config, pool_size=1)
    with JobRepository.connect(one_connection, clock=clock) as repository:
        with repository.begin() as uow:
            with pytest.raises(IntegrityViolation) as refused:
                insert_instance(uow, new_key(), instance_key=b"short")
            assert refused.value.constraint == "job_instance_instance_key_length"
            with pytest.raises(UnitOfWorkClosed):
                uow.connection  # noqa: B018 - the connection went back to the pool
        assert instances(admin) == 0
        row = repository.run_in_unit_of_work(lambda uow: insert_instance(uow, new_key()))
        assert row is not None and instances(admin) == 1


def test_a_conflict_refused_at_commit_commits_nothing_and_is_retried(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    admin.execute("CREATE SEQUENCE public.conflict_once")
    admin.execute(
        "CREATE FUNCTION public.conflict_once() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN IF nextval('public.conflict_once') = 1 THEN "
        "RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END IF; RETURN NULL; END $$"
    )
    admin.execute(
        "CREATE CONSTRAINT TRIGGER conflict_once AFTER INSERT ON pybatch.job_instance "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.conflict_once()"
    )
    key = new_key()
    calls = 0

    def work(uow: UnitOfWork) -> int:
        nonlocal calls
        calls += 1
        row = insert_instance(uow, key)
        assert row is not None
        return int(row["id"])

    instance_id = repository.run_in_unit_of_work(work)
    assert calls == 2 and instance_id == 2  # the first COMMIT was refused; id 1 is burned
    assert admin.execute("SELECT array_agg(id) FROM pybatch.job_instance").fetchone() == ([2],)


def test_a_connection_lost_with_the_commit_sent_is_outcome_unknown(
    repository: JobRepository, admin: psycopg.Connection[Any], db_dsn: str
) -> None:
    key = new_key()
    params = {**encode_job_instance_key(key), "now": repository.clock.now()}
    with psycopg.connect(db_dsn) as locker, repository.begin() as uow:
        # The same key, inserted and not committed: the statement waits for it.
        locker.execute(repository.statements.insert_job_instance_if_absent.query, params)
        pid = uow.connection.info.backend_pid

        def kill_while_it_waits() -> None:
            wait_until_lock_wait(admin, pid)
            terminate_backend(admin, pid)

        killer = threading.Thread(target=kill_while_it_waits)
        killer.start()
        with pytest.raises(CommitOutcomeUnknown):
            insert_instance(uow, key)
        killer.join()
        assert not uow.is_open
        locker.rollback()
    assert repository.run_in_unit_of_work(lambda uow: insert_instance(uow, new_key()))
    assert instances(admin) == 1


def test_only_the_first_statement_of_a_unit_of_work_may_commit_alone(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    with repository.begin() as uow:
        uow.instances.select_or_create(new_key())
        with pytest.raises(RuntimeError, match="only statement"):
            insert_instance(uow, new_key())
    assert instances(admin) == 0


def test_a_transition_refuses_to_run_under_another_isolation_level(
    pg_config: ConnectionConfig, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """A session setting a script changed on a pooled connection cannot weaken a launch."""
    one_connection = attrs.evolve(pg_config, pool_size=1)
    with JobRepository.connect(one_connection, clock=clock) as repository:
        with repository.begin() as uow:
            uow.connection.execute("SET default_transaction_isolation = 'repeatable read'")
            uow.commit()
        with pytest.raises(Unavailable) as refused:
            Job(repository, "isolation", run_id=1).launch()
    assert refused.value.sqlstate == "25000"
    assert instances(admin) == 0
