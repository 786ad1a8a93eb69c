"""The runtime role of docs/dba.md: everything an ETL run and an operator need, nothing more.

The grants are read from docs/dba.md itself (the `sql runtime-grants` and `sql
retention-grants` blocks), so the guide and this test cannot drift apart.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch._services.retention import RetentionService
from pybatch.errors import PermissionDenied
from pybatch.etl import Job, StepRun
from pybatch.values.names import ActorRef, JobName, OperationId, ReasonCode
from pybatch.values.retention import PurgeBatchBound, PurgePlanRequest, TerminalStatusSet
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.contract.test_etl_api import DAY, SHORT_LEASE, wait_for_lease_expiry

DBA_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "dba.md"
OPS = ActorRef("cli:ops")


def grants(block: str) -> str:
    match = re.search(rf"```sql {block}\n(.*?)```", DBA_GUIDE.read_text(), re.S)
    assert match is not None, f"docs/dba.md has no {block} block"
    return match.group(1)


@pytest.fixture
def runtime_dsn(admin: psycopg.Connection[Any], db_dsn: str) -> Iterator[str]:
    for role in ("pybatch_retention", "pybatch_runtime"):
        admin.execute(f"DROP ROLE IF EXISTS {role}")
    admin.execute("CREATE ROLE pybatch_runtime LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    admin.execute("CREATE ROLE pybatch_retention LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    admin.execute(f'REVOKE CREATE ON DATABASE "{admin.info.dbname}" FROM PUBLIC')
    admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    admin.execute(grants("runtime-grants"))
    admin.execute(grants("retention-grants"))
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
    admin.execute("GRANT SELECT, INSERT ON public.orders TO pybatch_runtime")
    try:
        yield db_dsn.replace(f"user={admin.info.user}", "user=pybatch_runtime")
    finally:
        for role in ("pybatch_retention", "pybatch_runtime"):
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_the_runtime_role_runs_everything_and_rewrites_nothing(
    runtime_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    config = plaintext_config(runtime_dsn, pool_size=4)
    with JobRepository.connect(config) as repository:
        service = OperatorService(repository)
        # Launch and chunks.
        with Job(repository, "load_orders", DAY).launch() as run:

            def load(step: StepRun) -> None:
                with step.chunk() as chunk:
                    chunk.execute("INSERT INTO public.orders VALUES (1)")
                    chunk.commit(read=1, written=1, checkpoint={"offset": 1})

            run.step("load", load)
            # A partitioned step: claims with a lease, renewals, lost-worker checks.
            fanned = run.partitioned_step("fan", ["a", "b"], lambda partition: None, workers=0)
            assert fanned.step.status is BatchStatus.COMPLETED
        # Stop.
        stopping = Job(repository, "stop_me", DAY, lease=SHORT_LEASE).launch()
        stop = service.stop(OperationId("stop-1"), OPS, stopping.execution.id)
        assert stop.outcome.value == "APPLIED"
        # Automatic recovery of a dead run, and the operator's recover.
        stopping._stop_renewing()
        wait_for_lease_expiry(admin, stopping.execution.id)
        with Job(repository, "stop_me", DAY).launch() as second:
            assert second.attempt == 2
        # Hold and release.
        retention = RetentionService(repository)
        held = retention.hold(OperationId("hold-1"), OPS, run.instance.id, ReasonCode("LEGAL"))
        assert held.outcome == "APPLIED"
        retention.release(OperationId("rel-1"), OPS, run.instance.id, ReasonCode("RELEASED"))
        assert verify_audit_chain(repository).intact
        # The purge needs the retention role.
        request = PurgePlanRequest(
            job_name=JobName("load_orders"),
            statuses=TerminalStatusSet.of([BatchStatus.COMPLETED]),
            minimum_age=datetime.timedelta(hours=1),
            batch=PurgeBatchBound(10),
        )
        assert retention.plan(request).is_empty()  # a survey is only a read

    with psycopg.connect(runtime_dsn, autocommit=True) as runtime:
        for statement in (
            "CREATE TABLE pybatch.intruder (id int)",
            "ALTER TABLE pybatch.job_execution ADD COLUMN intruder int",
            "DROP TABLE pybatch.flow_decision",
            "UPDATE pybatch.operator_request SET actor_ref = 'cli:mallory'",
            "DELETE FROM pybatch.operator_request",
            "UPDATE pybatch.recovery_decision SET reason_code = 'X'",
            "DELETE FROM pybatch.recovery_decision",
            "UPDATE pybatch.retention_action SET reason_code = 'X'",
            "UPDATE pybatch.audit_chain SET record_id = 1",
            "DELETE FROM pybatch.audit_chain",
            # Appends go through pybatch.append_audit_link: the head is not the role's to
            # move, nor to lock against every other audited write.
            "UPDATE pybatch.audit_chain_head SET seq = 1",
            "SELECT seq FROM pybatch.audit_chain_head FOR UPDATE",
            "INSERT INTO pybatch.audit_chain SELECT * FROM pybatch.audit_chain WHERE false",
            "DELETE FROM pybatch.job_execution",
            "LOCK TABLE pybatch.schema_migration IN EXCLUSIVE MODE",
            "SELECT * FROM pybatch.schema_migration",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), runtime.transaction():
                runtime.execute(statement)


def test_the_retention_role_purges(
    runtime_dsn: str, admin: psycopg.Connection[Any], pg_config: ConnectionConfig
) -> None:
    with JobRepository.connect(pg_config) as owner:
        with Job(owner, "old_load", DAY).launch():
            pass
    admin.execute(
        "UPDATE pybatch.job_execution SET created_at = created_at - interval '2 days',"
        " started_at = started_at - interval '2 days', ended_at = ended_at - interval '2 days',"
        " updated_at = updated_at - interval '2 days'"
    )
    request = PurgePlanRequest(
        job_name=JobName("old_load"),
        statuses=TerminalStatusSet.of([BatchStatus.COMPLETED]),
        minimum_age=datetime.timedelta(hours=1),
    )
    runtime_config = plaintext_config(runtime_dsn, pool_size=2)
    with JobRepository.connect(runtime_config) as runtime:
        plan = RetentionService(runtime).plan(request)
        with pytest.raises(PermissionDenied) as refused:
            RetentionService(runtime).apply(OperationId("p-1"), OPS, ReasonCode("RETENTION"), plan)
        assert refused.value.sqlstate == "42501"
    retention_config = attrs.evolve(
        runtime_config,
        dsn=runtime_dsn.replace("user=pybatch_runtime", "user=pybatch_retention"),
    )
    with JobRepository.connect(retention_config) as retention_repository:
        service = RetentionService(retention_repository)
        outcome = service.apply(OperationId("p-1"), OPS, ReasonCode("RETENTION"), plan)
        assert outcome.counts.job_executions == 1
        assert verify_audit_chain(retention_repository).intact
