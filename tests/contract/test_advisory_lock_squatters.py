"""A role that can only connect holds advisory-lock keys: nothing pybatch does waits or fails.

Advisory-lock keys are open to every role with CONNECT on the database. pybatch therefore
never lets one decide anything: a run and a partition worker hold no advisory lock at all
(the lease on their row decides whether they are alive), and migrations serialize on a
lock of pybatch's own history (a first install takes none).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch.errors import ExecutionAlreadyActive
from pybatch.etl import Job
from tests.conftest import plaintext_config
from tests.contract.test_etl_api import DAY, SHORT_LEASE, advisory_locks, wait_for_lease_expiry

SQUATTER = "pybatch_squatter"


@pytest.fixture
def squatter_dsn(admin: psycopg.Connection[Any], db_dsn: str) -> Iterator[str]:
    """A login role with nothing but the CONNECT every role has by default."""
    admin.execute(f"DROP ROLE IF EXISTS {SQUATTER}")
    admin.execute(f"CREATE ROLE {SQUATTER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    try:
        yield db_dsn.replace(f"user={admin.info.user}", f"user={SQUATTER}")
    finally:
        admin.execute(f"DROP OWNED BY {SQUATTER}")
        admin.execute(f"DROP ROLE {SQUATTER}")


def next_execution_id(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END"
        " FROM pybatch.job_execution_id_seq"
    ).fetchone()
    assert row is not None
    return int(row[0])


def hold_id_keyed_liveness(squatter: psycopg.Connection[Any], first: int, count: int) -> None:
    squatter.execute(
        "SELECT count(pg_advisory_lock(hashtextextended('pybatch.job_execution.liveness', id)))"
        " FROM generate_series(%s::bigint, %s::bigint) AS id",
        (first, first + count - 1),
    )


def test_old_liveness_keys_held_by_a_stranger_block_no_launch_and_no_restart(
    repository: JobRepository, admin: psycopg.Connection[Any], squatter_dsn: str
) -> None:
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    with psycopg.connect(squatter_dsn, autocommit=True) as squatter:
        hold_id_keyed_liveness(squatter, next_execution_id(admin), 200)
        # New launches start at once.
        started = time.monotonic()
        with Job(repository, "fresh", DAY).launch() as fresh:
            assert fresh.attempt == 1
        dead = job.launch()
        assert time.monotonic() - started < 5
        # A dead run restarts once its lease ran out, whoever holds which key.
        dead._stop_renewing()
        wait_for_lease_expiry(admin, dead.execution.id)
        with job.launch() as second:
            assert second.attempt == 2
    [(status,)] = admin.execute(
        "SELECT status FROM pybatch.job_execution WHERE id = %s", (dead.execution.id,)
    ).fetchall()
    assert status == "FAILED"


def test_a_live_run_holds_no_lock_key_a_stranger_could_learn_or_take(
    repository: JobRepository, admin: psycopg.Connection[Any], squatter_dsn: str
) -> None:
    """Nothing in pg_locks names a run, so nothing a stranger takes there can block it.

    While the run lives a second launch is refused (its lease is fresh); once it died, its
    restart waits for nothing but the lease, whatever keys the stranger holds.
    """
    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    dead = job.launch()
    assert advisory_locks(admin) == 0
    with psycopg.connect(squatter_dsn, autocommit=True) as squatter:
        hold_id_keyed_liveness(squatter, dead.execution.id, 1)
        squatter.execute(
            "SELECT pg_advisory_lock(hashtextextended('pybatch.step_execution.liveness', id))"
            " FROM generate_series(1, 50) AS id"
        )
        with pytest.raises(ExecutionAlreadyActive):
            Job(repository, "load_orders", DAY).launch()
        dead._stop_renewing()
        wait_for_lease_expiry(admin, dead.execution.id)
        started = time.monotonic()
        with job.launch() as second:
            assert second.attempt == 2
            assert advisory_locks(admin) == 51  # the stranger's keys only
        assert time.monotonic() - started < 5


def test_a_stranger_holding_the_old_first_install_key_blocks_no_migration(
    blank_database: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute(f"DROP ROLE IF EXISTS {SQUATTER}")
    admin.execute(f"CREATE ROLE {SQUATTER} LOGIN")
    squatter_dsn = blank_database.replace(f"user={admin.info.user}", f"user={SQUATTER}")
    try:
        with psycopg.connect(squatter_dsn, autocommit=True) as squatter:
            squatter.execute(
                "SELECT pg_advisory_lock(hashtextextended('pybatch.schema.migrations', 0))"
            )
            started = time.monotonic()
            applied = migrator.migrate(plaintext_config(blank_database))
            assert time.monotonic() - started < 30
        assert [m.version for m in applied] == list(
            range(1, migrator.supported_schema_version() + 1)
        )
    finally:
        admin.execute(f"DROP OWNED BY {SQUATTER}")
        admin.execute(f"DROP ROLE {SQUATTER}")
    assert migrator.installed_schema_version(plaintext_config(blank_database)) == (
        migrator.supported_schema_version()
    )
