"""Isolation between job families (docs/dba.md, "Isolating job families"), as real roles.

The SQL is read from docs/dba.md itself (the `sql isolation-family` and `sql
isolation-enable` blocks, after the runtime and retention grants), so the guide a DBA
follows and what these tests run cannot drift apart. Two families: `pybatch_orders` (the
guide's block as written: job names starting with `orders.`) and `pybatch_billing` (the
same block with its names replaced). Every forgery is attempted from a plain psycopg
connection of the orders role, the way a job's script could, against billing's rows.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import JobRepository
from pybatch._explorer import JobExplorer
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch._services.retention import RetentionService
from pybatch.errors import JobInstanceNotFound, PermissionDenied
from pybatch.etl import Job, PartitionRun, StepRun
from pybatch.values.names import ActorRef, JobName, OperationId, ReasonCode
from pybatch.values.retention import PurgePlanRequest, TerminalStatusSet
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.contract.test_etl_api import DAY, SHORT_LEASE, wait_for_lease_expiry
from tests.contract.test_least_privilege import grants

OPS = ActorRef("cli:ops")
ROLES = (
    "pybatch_orders",
    "pybatch_billing",
    "pybatch_operator",
    "pybatch_retention",
    "pybatch_runtime",
)
#: The tables the enabling script switches row level security on for.
ISOLATED_TABLES = (
    "job_definition",
    "definition_upgrade",
    "job_instance",
    "job_execution",
    "step_execution",
    "step_partition",
    "flow_decision",
    "recovery_decision",
    "operator_request",
    "step_skip",
)


def family_block(role: str, prefix: str) -> str:
    """The guide's per-family script for `role` and `prefix`."""
    return (
        grants("isolation-family")
        .replace("pybatch_orders", role)
        .replace("'orders.'", f"'{prefix}'")
    )


@attrs.frozen
class Roles:
    """DSNs of the roles the guide creates, in one test database."""

    orders: str
    billing: str
    operator: str
    retention: str


def _setup_roles(admin: psycopg.Connection[Any], *, isolation: bool) -> None:
    for role in ROLES:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
    admin.execute("CREATE ROLE pybatch_runtime LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    admin.execute("CREATE ROLE pybatch_retention LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    admin.execute(f'REVOKE CREATE ON DATABASE "{admin.info.dbname}" FROM PUBLIC')
    admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    admin.execute(grants("runtime-grants"))
    admin.execute(grants("retention-grants"))
    admin.execute(family_block("pybatch_orders", "orders."))
    admin.execute(family_block("pybatch_billing", "billing."))
    if isolation:
        admin.execute(grants("isolation-enable"))
    else:
        admin.execute("CREATE ROLE pybatch_operator LOGIN IN ROLE pybatch_runtime")
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY)")
    admin.execute("GRANT SELECT, INSERT ON public.orders TO pybatch_runtime")


def _roles(admin: psycopg.Connection[Any], db_dsn: str, *, isolation: bool) -> Iterator[Roles]:
    _setup_roles(admin, isolation=isolation)
    user = f"user={admin.info.user}"
    try:
        yield Roles(
            orders=db_dsn.replace(user, "user=pybatch_orders"),
            billing=db_dsn.replace(user, "user=pybatch_billing"),
            operator=db_dsn.replace(user, "user=pybatch_operator"),
            retention=db_dsn.replace(user, "user=pybatch_retention"),
        )
    finally:
        for role in ROLES:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


@pytest.fixture
def isolated(admin: psycopg.Connection[Any], db_dsn: str) -> Iterator[Roles]:
    """The guide's roles with isolation enabled."""
    yield from _roles(admin, db_dsn, isolation=True)


@pytest.fixture
def not_isolated(admin: psycopg.Connection[Any], db_dsn: str) -> Iterator[Roles]:
    """The same roles and family mappings, without the enabling script."""
    yield from _roles(admin, db_dsn, isolation=False)


def load_one(step: StepRun) -> None:
    with step.chunk() as chunk:
        chunk.execute("INSERT INTO public.orders VALUES (1)")
        chunk.commit(read=1, written=1, checkpoint={"offset": 1})


def work_partition(partition: PartitionRun) -> None:
    with partition.chunk() as chunk:
        chunk.commit(read=1, written=0, checkpoint={"done": partition.key})


@attrs.frozen
class Victim:
    """Billing's rows the forgeries aim at: a live run and a FAILED one."""

    live_execution: int
    live_step: int
    failed_execution: int


def billing_rows(billing_dsn: str, admin: psycopg.Connection[Any]) -> Iterator[Victim]:
    """Billing runs its own jobs as its own role: one FAILED, one live meanwhile."""
    config = plaintext_config(billing_dsn, pool_size=2)
    with JobRepository.connect(config) as repository:

        def fail(step: StepRun) -> None:
            raise RuntimeError("billing step fails")

        with pytest.raises(RuntimeError), Job(repository, "billing.fails", DAY).launch() as run:
            run.step("s", fail)
        with Job(repository, "billing.live", DAY).launch() as live:
            live.step("s", load_checkpoint)
            step = admin.execute(
                "SELECT id FROM pybatch.step_execution WHERE job_execution_id = %s",
                (live.execution.id,),
            ).fetchone()
            assert step is not None
            yield Victim(int(live.execution.id), int(step[0]), int(run.execution.id))


def load_checkpoint(step: StepRun) -> None:
    with step.chunk() as chunk:
        chunk.commit(read=1, written=0, checkpoint={"offset": 1})


def execution_row(admin: psycopg.Connection[Any], execution_id: int) -> tuple[Any, ...]:
    row = admin.execute(
        "SELECT status, owner_token, lease_expires_at, stop_requested_at, version"
        " FROM pybatch.job_execution WHERE id = %s",
        (execution_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


#: What a job's script with the runtime role could write into another job's rows.
FORGERIES = {
    "lease": "UPDATE pybatch.job_execution"
    " SET lease_expires_at = clock_timestamp() + interval '1 day' WHERE id = %(live)s",
    "stop request": "UPDATE pybatch.job_execution"
    " SET stop_requested_at = clock_timestamp(), stop_requested_by = 'cli:mallory'"
    " WHERE id = %(live)s",
    "owner token": "UPDATE pybatch.job_execution"
    " SET owner_token = '\\x00000000000000000000000000000000' WHERE id = %(live)s",
    "FAILED to COMPLETED": "UPDATE pybatch.job_execution"
    " SET status = 'COMPLETED', exit_code = 'COMPLETED', failure_category = NULL,"
    " failure_id = NULL WHERE id = %(failed)s",
    "checkpoint": "UPDATE pybatch.step_execution"
    " SET checkpoint_payload = '{\"offset\": 999}' WHERE id = %(step)s",
}
#: The lock modes that block a run's writes (or VACUUM): they need table-level UPDATE, DELETE
#: or TRUNCATE (or MAINTAIN, PostgreSQL 17+) on every major from 13 to 18; column-level
#: UPDATE never counts.
REFUSED_LOCK_MODES = (
    "ACCESS EXCLUSIVE",
    "EXCLUSIVE",
    "SHARE ROW EXCLUSIVE",
    "SHARE",
    "SHARE UPDATE EXCLUSIVE",
)
LOCKED_TABLES = ("job_execution", "step_execution", "step_partition", "job_instance")
LOCKS = tuple(
    f"LOCK TABLE pybatch.{table} IN {mode} MODE"
    for table in LOCKED_TABLES
    for mode in REFUSED_LOCK_MODES
)


def test_isolation_refuses_every_forged_write_on_another_family(
    isolated: Roles, admin: psycopg.Connection[Any]
) -> None:
    for victim in billing_rows(isolated.billing, admin):
        params = {
            "live": victim.live_execution,
            "failed": victim.failed_execution,
            "step": victim.live_step,
        }
        before = {
            "live": execution_row(admin, victim.live_execution),
            "failed": execution_row(admin, victim.failed_execution),
        }
        with psycopg.connect(isolated.orders, autocommit=True) as mallory:
            for name, statement in FORGERIES.items():
                with mallory.transaction():
                    cursor = mallory.execute(statement, params)
                    assert cursor.rowcount == 0, f"the forged {name} changed a billing row"
            for statement in LOCKS:
                with pytest.raises(psycopg.errors.InsufficientPrivilege), mallory.transaction():
                    mallory.execute(statement)
            # What stays: ROW EXCLUSIVE through table-level INSERT (every major), ROW SHARE
            # through INSERT from 16 on; neither conflicts with any read or write.
            for table in LOCKED_TABLES:
                with mallory.transaction():
                    mallory.execute(f"LOCK TABLE pybatch.{table} IN ROW EXCLUSIVE MODE")
                row_share = f"LOCK TABLE pybatch.{table} IN ROW SHARE MODE"
                if mallory.info.server_version >= 160000:
                    with mallory.transaction():
                        mallory.execute(row_share)
                else:
                    with (
                        pytest.raises(psycopg.errors.InsufficientPrivilege),
                        mallory.transaction(),
                    ):
                        mallory.execute(row_share)
            # Billing's rows cannot even be seen or row-locked.
            for table in ISOLATED_TABLES:
                seen = mallory.execute(f"SELECT count(*) FROM pybatch.{table}").fetchone()
                assert seen == (0,), f"orders sees {table} rows of billing"
            locked = mallory.execute(
                "SELECT id FROM pybatch.job_execution WHERE id = %(live)s FOR UPDATE", params
            ).fetchall()
            assert locked == []
            # Nor can it write rows into billing's history.
            for statement in (
                "INSERT INTO pybatch.flow_decision (job_execution_id, sequence, source_node_id,"
                " source_step_execution_id, observed_outcome, target_node_id, transition_kind,"
                " plan_fingerprint, input_digest, decided_at)"
                " VALUES (%(live)s, 1, 's', %(step)s, 'COMPLETED', 'x', 'NEXT',"
                " sha256('x'), sha256('x'), clock_timestamp())",
                "INSERT INTO pybatch.job_definition (job_name, definition_revision,"
                " manifest_format, manifest_digest, manifest, registered_at)"
                " VALUES ('billing.live', 'forged', 1, sha256('x'), '{}', clock_timestamp())",
            ):
                with (
                    pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"),
                    mallory.transaction(),
                ):
                    mallory.execute(statement, params)
            # Nor switch isolation off, widen its own family or read past the policies.
            for statement in (
                "ALTER TABLE pybatch.job_execution DISABLE ROW LEVEL SECURITY",
                "DROP POLICY job_execution_job_family ON pybatch.job_execution",
                "INSERT INTO pybatch.job_family_grant VALUES ('pybatch_orders', '')",
                "UPDATE pybatch.job_family_grant SET job_name_prefix = ''",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege), mallory.transaction():
                    mallory.execute(statement)
            with pytest.raises(psycopg.errors.InsufficientPrivilege), mallory.transaction():
                mallory.execute("SET LOCAL row_security = off")
                mallory.execute("SELECT id FROM pybatch.job_execution")
        # pybatch's operator commands, run as the orders role, do not reach billing's run.
        with JobRepository.connect(plaintext_config(isolated.orders, pool_size=2)) as repository:
            outcome = OperatorService(repository).stop(
                OperationId("stop-x"), OPS, victim.live_execution
            )
            assert outcome.rejection is not None
            assert outcome.rejection.code.value == "EXECUTION_NOT_FOUND"
            instance = admin.execute(
                "SELECT job_instance_id FROM pybatch.job_execution WHERE id = %s",
                (victim.live_execution,),
            ).fetchone()
            assert instance is not None
            with pytest.raises(JobInstanceNotFound):
                RetentionService(repository).hold(
                    OperationId("hold-x"), OPS, instance[0], ReasonCode("LEGAL")
                )
            holds = admin.execute(
                "SELECT hold_actor FROM pybatch.job_instance WHERE id = %s", (instance[0],)
            ).fetchone()
            assert holds == (None,)
        assert execution_row(admin, victim.live_execution) == before["live"]
        assert execution_row(admin, victim.failed_execution) == before["failed"]
        checkpoint = admin.execute(
            "SELECT checkpoint_payload FROM pybatch.step_execution WHERE id = %s",
            (victim.live_step,),
        ).fetchone()
        assert checkpoint == ({"offset": 1},)
    # pybatch itself, as the orders role, cannot launch a billing job either.
    with JobRepository.connect(plaintext_config(isolated.orders, pool_size=2)) as repository:
        with pytest.raises(PermissionDenied):
            Job(repository, "billing.live", DAY).launch()


def test_without_isolation_the_same_forgeries_go_through(
    not_isolated: Roles, admin: psycopg.Connection[Any]
) -> None:
    """The opt-in: the family mappings alone change nothing, as before migration 0008."""
    for victim in billing_rows(not_isolated.billing, admin):
        params = {
            "live": victim.live_execution,
            "failed": victim.failed_execution,
            "step": victim.live_step,
        }
        with psycopg.connect(not_isolated.orders) as mallory:
            for name, statement in FORGERIES.items():
                cursor = mallory.execute(statement, params)
                assert cursor.rowcount == 1, name
            mallory.execute(LOCKS[0])
            mallory.rollback()


def test_a_family_role_runs_its_own_jobs_with_isolation_on(
    isolated: Roles, admin: psycopg.Connection[Any]
) -> None:
    for victim in billing_rows(isolated.billing, admin):
        # Billing has a history of its own, audited records included (an operator's stop),
        # which orders must neither see nor disturb, and which its audit verify still reads.
        with JobRepository.connect(plaintext_config(isolated.operator, pool_size=2)) as ops:
            OperatorService(ops).stop(OperationId("stop-b"), OPS, victim.live_execution)
    config = plaintext_config(isolated.orders, pool_size=4)
    with JobRepository.connect(config) as repository:
        # Launch, chunks, a partitioned step worked on by two forked worker processes.
        with Job(repository, "orders.load", DAY).launch() as run:
            run.step("load", load_one)
            fanned = run.partitioned_step("fan", ["a", "b", "c"], work_partition, workers=2)
            assert fanned.step.status is BatchStatus.COMPLETED
        assert run.execution.id is not None
        # Stop, by the family role itself, of its own run.
        stopping = Job(repository, "orders.stop_me", DAY, lease=SHORT_LEASE).launch()
        stop = OperatorService(repository).stop(OperationId("stop-1"), OPS, stopping.execution.id)
        assert stop.outcome.value == "APPLIED"
        # Recovery of its own dead run.
        stopping._stop_renewing()
        wait_for_lease_expiry(admin, stopping.execution.id)
        with Job(repository, "orders.stop_me", DAY).launch() as second:
            assert second.attempt == 2
        # A retention hold on its own instance, and its release.
        retention = RetentionService(repository)
        held = retention.hold(OperationId("hold-1"), OPS, run.instance.id, ReasonCode("LEGAL"))
        assert held.outcome == "APPLIED"
        retention.release(OperationId("rel-1"), OPS, run.instance.id, ReasonCode("RELEASED"))
        # The explorer lists the family's jobs only.
        names = [item.job_name for item in JobExplorer(repository).job_names().items]
        assert [str(name) for name in names] == ["orders.load", "orders.stop_me"]
        assert verify_audit_chain(repository).intact
    statuses = admin.execute(
        "SELECT i.job_name, e.attempt, e.status FROM pybatch.job_execution AS e"
        " JOIN pybatch.job_instance AS i ON i.id = e.job_instance_id"
        " WHERE i.job_name LIKE 'orders.%' ORDER BY 1, 2"
    ).fetchall()
    assert statuses == [
        ("orders.load", 1, "COMPLETED"),
        ("orders.stop_me", 1, "FAILED"),
        ("orders.stop_me", 2, "COMPLETED"),
    ]
    partitions = admin.execute(
        "SELECT count(*) FROM pybatch.step_partition WHERE status = 'COMPLETED'"
    ).fetchone()
    assert partitions == (3,)


def test_operators_and_retention_act_on_every_family_with_isolation_on(
    isolated: Roles, admin: psycopg.Connection[Any]
) -> None:
    for victim in billing_rows(isolated.billing, admin):
        operator = plaintext_config(isolated.operator, pool_size=2)
        with JobRepository.connect(operator) as repository:
            outcome = OperatorService(repository).stop(
                OperationId("stop-b"), OPS, victim.live_execution
            )
            assert outcome.outcome.value == "APPLIED"
    admin.execute(
        "UPDATE pybatch.job_execution SET created_at = created_at - interval '2 days',"
        " started_at = started_at - interval '2 days', ended_at = ended_at - interval '2 days',"
        " updated_at = updated_at - interval '2 days'"
    )
    request = PurgePlanRequest(
        job_name=JobName("billing.fails"),
        statuses=TerminalStatusSet.of([BatchStatus.FAILED]),
        minimum_age=datetime.timedelta(hours=1),
    )
    with JobRepository.connect(plaintext_config(isolated.retention, pool_size=2)) as retention:
        service = RetentionService(retention)
        plan = service.plan(request)
        purged = service.apply(OperationId("p-1"), OPS, ReasonCode("RETENTION"), plan)
        assert purged.counts.job_executions == 1
        assert verify_audit_chain(retention).intact
