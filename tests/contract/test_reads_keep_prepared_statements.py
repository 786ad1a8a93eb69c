"""A read ends with COMMIT, not ROLLBACK, so its connection keeps its prepared statements.

psycopg answers a ROLLBACK by forgetting every statement it prepared on the connection and
sending DEALLOCATE ALL, which also pins a connection behind RDS Proxy; each statement is then
parsed and planned again. A READ ONLY transaction changed nothing, so pybatch ends it with
COMMIT: a read-only unit of work (`begin(read_only=True)`), `read_transaction()`, and the
partition supervisor's and workers' polls.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch.errors import Unavailable
from pybatch.etl import Job, StepRun
from pybatch.values.names import JobName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from tests.contract.test_one_round_trip_transactions import traced

_runs = itertools.count(1)


def nothing(step: StepRun) -> None:
    """A step with nothing to write."""


def prepared(conn: psycopg.Connection[Any]) -> set[str]:
    """The statements prepared on the server session of `conn`."""
    return {str(row[0]) for row in conn.execute("SELECT name FROM pg_prepared_statements")}


@pytest.fixture
def repository(pg_config: ConnectionConfig) -> Any:
    """A repository of one pooled connection, on which one-step jobs prepared their statements.

    psycopg prepares a statement at its sixth use on a connection.
    """
    with JobRepository.connect(attrs.evolve(pg_config, pool_size=1)) as repository:
        for _ in range(6):
            with Job(repository, "reads_keep", {"run": next(_runs)}).launch() as run:
                run.step("s", nothing)
        yield repository


def test_a_read_only_unit_of_work_keeps_the_connections_prepared_statements(
    repository: JobRepository,
) -> None:
    with repository.begin(read_only=True) as uow:
        before = prepared(uow.connection)
    assert before, "the job's statements are prepared on the one pooled connection"
    with repository.begin(read_only=True) as uow:
        conn = uow.connection
        key = JobInstanceKey(JobName("reads_keep"), JobParameters.of({"run": 0}))

        def read_and_leave() -> None:
            uow.instances.find(key)
            uow.rollback()  # a read-only unit of work ends with COMMIT all the same

        trace = traced(conn, read_and_leave)
    assert not [line for line in trace if "ROLLBACK" in line or "DEALLOCATE" in line]
    with repository.begin(read_only=True) as uow:
        assert prepared(uow.connection) >= before


def test_a_read_transaction_keeps_the_connections_prepared_statements(
    repository: JobRepository,
) -> None:
    with repository.read_transaction() as conn:
        before = prepared(conn)
    assert before
    with repository.read_transaction() as conn:
        assert prepared(conn) >= before


def test_a_failed_read_rolls_back_and_the_connection_stays_usable(
    repository: JobRepository,
) -> None:
    with pytest.raises(Unavailable) as failed:
        with repository.read_transaction() as conn:
            conn.execute("SELECT 1 / 0")
    assert failed.value.sqlstate == "22012"
    with repository.read_transaction() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_read_only_unit_of_work_refuses_a_write_and_writes_nothing(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    key = JobInstanceKey(JobName("reads_keep_write"), JobParameters.of({"run": 1}))
    with repository.begin(read_only=True) as uow, pytest.raises(Unavailable) as refused:
        uow.instances.select_or_create(key)
    assert refused.value.sqlstate == "25006"  # read_only_sql_transaction
    row = admin.execute(
        "SELECT count(*) FROM pybatch.job_instance WHERE job_name = 'reads_keep_write'"
    ).fetchone()
    assert row == (0,)
    with repository.begin(read_only=True) as uow, pytest.raises(RuntimeError):
        uow.commit_statement(uow.statements.read_schema_version, {}, lambda row: row)


def test_a_partitioned_step_ends_no_transaction_with_rollback(repository: JobRepository) -> None:
    """Its polls of the plan are reads: the run keeps every statement it prepared."""
    with repository.begin(read_only=True) as uow:
        conn = uow.connection  # the one pooled connection: every transaction of the run is on it

    def run() -> None:
        with Job(repository, "reads_keep_plan", {"run": next(_runs)}).launch() as job_run:
            job_run.partitioned_step("load", ["a", "b", "c"], nothing, workers=0)

    trace = traced(conn, run)
    assert [line for line in trace if "COMMIT" in line], "the trace saw the run"
    assert not [line for line in trace if "ROLLBACK" in line or "DEALLOCATE" in line]
