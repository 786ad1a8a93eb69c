"""Upgrading to execution leases under live jobs, and a migrator nobody else can block.

Before schema version 4 a run had no lease. pybatch decides liveness by the lease alone,
so after the upgrade an unresolved run without one has no live owner: its next launch
records it FAILED (OWNER_LOST) and resumes from its checkpoint, whatever advisory lock a
process of an older package still holds; a failed run resumes from its checkpoint.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pybatch import ConnectionConfig, JobRepository
from pybatch import _migrator as migrator
from pybatch._services.audit import verify_audit_chain
from pybatch.etl import ETL_STATE_SCHEMA, Job, StepRun
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import NodeId, StepName
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.older_package import older_package

S = BatchStatus
LEASE_VERSION = 4  # the migration that adds lease_expires_at


def install_up_to(dsn: str, version: int) -> None:
    """Apply the shipped migrations 1..version by hand, as an older pybatch did."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS pybatch")
        for migration in migrator.shipped_migrations()[:version]:
            migrator._apply(conn, migration)


def legacy_chunk(config: ConnectionConfig, step_id: int, offset: int) -> None:
    """The progress UPDATE of one chunk as a schema-1 pybatch committed it (no ownership fence)."""
    with psycopg.connect(config.dsn.reveal()) as conn:
        conn.execute(
            "UPDATE pybatch.step_execution SET read_count = %s, processed_count = %s,"
            " write_count = %s, commit_count = commit_count + 1, checkpoint_schema = %s,"
            " checkpoint_schema_version = 1, checkpoint_payload = %s, version = version + 1"
            " WHERE id = %s AND status = 'STARTED'",
            (offset, offset, offset, ETL_STATE_SCHEMA.value, Jsonb({"offset": offset}), step_id),
        )


def legacy_run(repository: JobRepository, run: str, *, status: S, offset: int) -> int:
    """A job launched by schema-1 pybatch: STARTED (or ended), one step with a checkpoint."""
    key = Job(repository, "legacy_load", {"run": run}).key
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id, execution.version, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        step = uow.flow.create_step(execution.id, StepName("load"), NodeId("load"))
        step = uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(S.STARTED, uow.clock.now())
        )
        uow.commit()
    legacy_chunk(repository.config, step.id, offset)
    if status is S.FAILED:  # as schema-1 pybatch failed a run: the step, then the execution
        with psycopg.connect(repository.config.dsn.reveal()) as conn:
            for table, row_id in (("step_execution", step.id), ("job_execution", execution.id)):
                conn.execute(
                    f"UPDATE pybatch.{table} SET status = 'FAILED', ended_at = now(),"
                    " updated_at = greatest(updated_at, now()), failure_category ="
                    " 'USER_COMPONENT', failure_id = %s, version = version + 1 WHERE id = %s",
                    (row_id, row_id),
                )
    return execution.id


def resumed_from(repository: JobRepository, run: str) -> list[int]:
    seen: list[int] = []

    def load(step: StepRun) -> None:
        seen.append(int(step.checkpoint["offset"]))
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"offset": seen[0] + 1})

    with Job(repository, "legacy_load", {"run": run}).launch() as launched:
        assert launched.attempt == 2
        launched.step("load", load)
    return seen


def test_after_the_lease_upgrade_runs_without_a_lease_are_recovered_and_resumed(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, LEASE_VERSION - 1)
    with older_package(monkeypatch, LEASE_VERSION - 1):
        with JobRepository.connect(config) as old:
            alive = legacy_run(old, "alive", status=S.STARTED, offset=3)
            dead = legacy_run(old, "dead", status=S.STARTED, offset=4)
            failed = legacy_run(old, "failed", status=S.FAILED, offset=5)
        # Audit rows written by the older package, before the chain existed.
        with psycopg.connect(blank_database, autocommit=True) as conn:
            for operation in ("old-1", "old-2"):
                conn.execute(
                    "INSERT INTO pybatch.operator_request (job_execution_id, action,"
                    " authorization_class, operation_id, actor_ref, request_digest,"
                    " outcome_class, requested_at) VALUES (%s, 'STOP', 'LIFECYCLE', %s,"
                    " 'cli:old', sha256('x'), 'APPLIED', now())",
                    (alive, operation),
                )
    # A process of the older package still holds the advisory lock it judged runs by.
    with psycopg.connect(blank_database, autocommit=True) as legacy_runner:
        legacy_runner.execute(
            "SELECT pg_advisory_lock(hashtextextended('pybatch.job_execution.liveness', %s))",
            (alive,),
        )
        assert [m.version for m in migrator.migrate(config)] == list(
            range(LEASE_VERSION, migrator.supported_schema_version() + 1)
        )
        with JobRepository.connect(config) as repository:
            linked = verify_audit_chain(repository)  # the upgrade linked the old audit rows
            assert linked.intact and linked.links == 2
            assert resumed_from(repository, "failed") == [5]
            assert resumed_from(repository, "dead") == [4]
            # No lease, so no live owner: the lock decides nothing.
            assert resumed_from(repository, "alive") == [3]
            with repository.begin() as uow:
                for execution_id in (alive, dead, failed):
                    execution = uow.executions.get(execution_id)
                    assert execution is not None and execution.status is S.FAILED
    with psycopg.connect(blank_database) as conn:
        reasons = conn.execute(
            "SELECT job_execution_id, reason_code FROM pybatch.recovery_decision ORDER BY id"
        ).fetchall()
    assert reasons == [(dead, "OWNER_LOST"), (alive, "OWNER_LOST")]
    with JobRepository.connect(config) as repository:
        chained = verify_audit_chain(repository)
    assert chained.intact and chained.links == 2 + 2 * 2  # each recovery: decision + request


def test_a_role_without_grants_cannot_block_migrations(
    blank_database: str, admin: psycopg.Connection[Any]
) -> None:
    install_up_to(blank_database, LEASE_VERSION - 1)
    admin.execute("DROP ROLE IF EXISTS pybatch_intruder")
    admin.execute("CREATE ROLE pybatch_intruder LOGIN")
    intruder_dsn = blank_database.replace(f"user={admin.info.user}", "user=pybatch_intruder")
    try:
        with psycopg.connect(intruder_dsn, autocommit=True) as intruder:
            # The old migration lock key: anyone may take it, and it no longer matters.
            intruder.execute(
                "SELECT pg_advisory_lock(hashtextextended('pybatch.schema.migrations', 0))"
            )
            with pytest.raises(psycopg.errors.InsufficientPrivilege), intruder.transaction():
                intruder.execute("LOCK TABLE pybatch.schema_migration IN ACCESS SHARE MODE")
            applied = migrator.migrate(plaintext_config(blank_database))
            assert next(m.version for m in applied) == LEASE_VERSION
    finally:
        admin.execute("DROP OWNED BY pybatch_intruder")
        admin.execute("DROP ROLE pybatch_intruder")
    assert migrator.installed_schema_version(plaintext_config(blank_database)) == (
        migrator.supported_schema_version()
    )
