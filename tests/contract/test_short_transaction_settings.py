"""The hot paths' short transactions plan generically and skip the flush wait, for themselves alone.

A step's start and end, and a partition worker's end of a partition with its claim of the next,
send short_transaction_settings first: COMMIT returns before the WAL flush, and their prepared
statements run their generic plans from the first execution (docs/dba.md). What a script author
relies on: neither setting outlives that transaction, so the statements of their own chunks,
on the same pooled connection, run under their server's settings.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pybatch import JobRepository
from pybatch.etl import Job, PartitionRun
from tests.conftest import plaintext_config

PARTITIONS = 8


def noop(partition: PartitionRun) -> None:
    """A partition with nothing to do."""


def test_a_worker_s_end_and_claim_plan_generically_and_leave_the_session_settings_alone(
    db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    plan: dict[str, dict[str, int]] = {f"p{i}": {} for i in range(PARTITIONS)}
    # One connection: the worker's every end and claim, then the reads below, share it.
    with JobRepository.connect(plaintext_config(db_dsn, pool_size=1)) as repository:
        with Job(repository, "short_transactions", {"run": 1}).launch() as run:
            run.partitioned_step("load", plan, noop, workers=0)
        with repository.read_transaction() as conn:
            session = conn.execute(
                "SELECT current_setting('synchronous_commit'), current_setting('plan_cache_mode')"
            ).fetchone()
            server = conn.info.server_version
            plans = (
                conn.execute(
                    "SELECT substring(statement FROM '^-- pybatch [a-z_.]+ ([a-z_]+)'),"
                    " generic_plans, custom_plans FROM pg_prepared_statements"
                    " WHERE statement ~ '^-- pybatch partitions.sql (end|claim)'"
                    " ORDER BY 1, 2"
                ).fetchall()
                if server >= 140000  # the plan counters came with PostgreSQL 14
                else []
            )
    assert session == ("on", "auto")
    count = admin.execute(
        "SELECT count(*) FROM pybatch.step_partition WHERE status = 'COMPLETED'"
    ).fetchone()
    assert count == (PARTITIONS,)
    if server >= 140000:
        # Each end ran generically from its first execution, and so did the claim sent after it
        # (the last end found no partition left); only the worker's first claim, sent alone
        # before any end, was planned for its parameters, once.
        assert plans == [
            ("claim_fresh_step_partition", 0, 1),
            ("claim_fresh_step_partition", PARTITIONS, 0),
            ("end_step_partition", PARTITIONS, 0),
        ]
