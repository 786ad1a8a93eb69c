"""The audit chain defends itself against the roles of docs/dba.md (migration 0007).

What an auditor relies on: neither the runtime role nor the retention role can rewind the
chain's head, append a link that does not follow it, rewrite or delete links, or excuse the
deletion of a record that no purge removed; `pybatch audit verify` reads every link, past
the head too, and checks every purge mark against a real purge; and a damaged chain never
stops a dead run from being recovered.

Each attack runs as the documented role, with the wider grants of the previous guide
(UPDATE on the head, INSERT on the links) on top, so that the database's own rules are what
refuse it, not a missing privilege.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch._services.retention import RetentionService
from pybatch.errors import IntegrityViolation
from pybatch.etl import Job
from pybatch.values.names import ActorRef, JobName, OperationId, ReasonCode
from pybatch.values.retention import PurgePlanRequest, TerminalStatusSet
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.contract.test_audit_chain import audited
from tests.contract.test_etl_api import DAY, SHORT_LEASE, wait_for_lease_expiry
from tests.contract.test_least_privilege import runtime_dsn

__all__ = ["runtime_dsn"]  # the fixture, used by name below

OPS = ActorRef("cli:ops")
#: What the previous guide granted on the chain: enough to try every attack in SQL.
PREVIOUS_GRANTS = (
    "GRANT UPDATE ON pybatch.audit_chain_head TO pybatch_runtime;"
    " GRANT INSERT ON pybatch.audit_chain TO pybatch_runtime"
)


def constraint_of(error: BaseException) -> str | None:
    assert isinstance(error, psycopg.Error)
    return error.diag.constraint_name


def refused(conn: psycopg.Connection[Any], statement: str, *params: Any) -> str | None:
    """Run `statement` in its own transaction; it must fail a check. Returns the rule named."""
    with pytest.raises(psycopg.errors.CheckViolation) as failure, conn.transaction():
        conn.execute(statement, params or None)
    return constraint_of(failure.value)


def head(admin: psycopg.Connection[Any]) -> tuple[int, bytes]:
    row = admin.execute("SELECT seq, link_digest FROM pybatch.audit_chain_head").fetchone()
    assert row is not None
    return int(row[0]), bytes(row[1])


def retention_dsn(runtime: str) -> str:
    return runtime.replace("user=pybatch_runtime", "user=pybatch_retention")


def test_the_runtime_role_cannot_rewind_the_head(
    repository: JobRepository, admin: psycopg.Connection[Any], runtime_dsn: str
) -> None:
    audited(repository, 3)  # six links
    admin.execute(PREVIOUS_GRANTS)
    before = head(admin)
    with psycopg.connect(runtime_dsn, autocommit=True) as runtime:
        rewind = (
            "UPDATE pybatch.audit_chain_head SET seq = 1,"
            " link_digest = (SELECT link_digest FROM pybatch.audit_chain WHERE seq = 1)"
        )
        assert refused(runtime, rewind) == "audit_chain_head_advances_by_one_link"
        assert refused(runtime, "UPDATE pybatch.audit_chain_head SET seq = seq + 1") == (
            "audit_chain_head_advances_by_one_link"
        )
    # Not even the owner may delete the head, rewrite links or truncate the chain.
    for statement in (
        "UPDATE pybatch.audit_chain SET record_id = 1",
        "DELETE FROM pybatch.audit_chain WHERE seq = 6",
    ):
        assert refused(admin, statement) == "audit_chain_insert_only"
    assert refused(admin, "DELETE FROM pybatch.audit_chain_head") == (
        "audit_chain_head_advances_by_one_link"
    )
    assert refused(admin, "TRUNCATE pybatch.audit_chain_purge, pybatch.audit_chain") in (
        "audit_chain_insert_only",
        "audit_chain_purge_insert_only",
    )
    assert head(admin) == before
    # Every audited write still works, and the chain verifies whole.
    with JobRepository.connect(plaintext_config(runtime_dsn, pool_size=2)) as as_runtime:
        key = Job(as_runtime, "after", DAY).key
        launched = OperatorService(as_runtime).launch(OperationId("after-1"), OPS, key)
        assert launched.execution is not None
        result = verify_audit_chain(as_runtime)
    assert result.intact and result.links == 7
    assert result.describe() == "audit chain intact: 7 links verified"


def test_the_runtime_role_cannot_write_a_link_around_the_chain(
    repository: JobRepository, admin: psycopg.Connection[Any], runtime_dsn: str
) -> None:
    audited(repository, 1)  # two links
    admin.execute(PREVIOUS_GRANTS)
    row = admin.execute(
        "SELECT content_digest, link_digest FROM pybatch.audit_chain WHERE seq = 2"
    ).fetchone()
    assert row is not None
    content, last = row
    insert = (
        "INSERT INTO pybatch.audit_chain"
        " (seq, record_kind, record_id, content_digest, previous_digest, link_digest)"
        " VALUES (%s, 'OPERATOR_REQUEST', %s, %s, %s,"
        " sha256(%s || int8send(%s) || convert_to('OPERATOR_REQUEST', 'UTF8')"
        " || int8send(%s) || %s))"
    )
    with psycopg.connect(runtime_dsn, autocommit=True) as runtime:
        # Junk far past the head, with a digest that even matches its fields.
        assert refused(runtime, insert, 9, 99, content, last, last, 9, 99, content) == (
            "audit_chain_link_follows_head"
        )
        # The next link, but with a forged digest.
        assert refused(
            runtime,
            "INSERT INTO pybatch.audit_chain VALUES (3, 'OPERATOR_REQUEST', 99, %s, %s, %s)",
            content,
            last,
            last,
        ) == ("audit_chain_link_digest_matches")
        # The next link, well formed, for a record that does not exist.
        assert refused(runtime, insert, 3, 99, content, last, last, 3, 99, content) == (
            "audit_chain_link_content_matches"
        )
    assert head(admin)[0] == 2
    assert admin.execute("SELECT max(seq) FROM pybatch.audit_chain").fetchone() == (2,)
    assert verify_audit_chain(repository).intact


def test_verify_reads_links_past_the_head(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """A link written around the chain with the triggers off is found, not skipped."""
    audited(repository, 3)
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute(
            "UPDATE pybatch.audit_chain_head SET seq = 1,"
            " link_digest = (SELECT link_digest FROM pybatch.audit_chain WHERE seq = 1)"
        )
    result = verify_audit_chain(repository, page=2)
    assert (result.links, result.broken_at) == (1, 2)
    assert result.describe() == (
        "audit chain broken at link 2: it lies past the head (link 1): written around the "
        "chain, or the head was rewound"
    )


def purged_history(config: ConnectionConfig, admin: psycopg.Connection[Any]) -> int:
    """A finished run with one stop request, purged; returns the purge's retention action.

    Runs on the database clock (a purge judges age by it), through its own repository.
    """
    with JobRepository.connect(config) as owner:
        return _purge_one_history(owner, admin)


def _purge_one_history(owner: JobRepository, admin: psycopg.Connection[Any]) -> int:
    service = OperatorService(owner)
    key = Job(owner, "purged", DAY).key
    launched = service.launch(OperationId("purged-launch"), OPS, key)
    assert launched.execution is not None
    service.stop(OperationId("purged-stop"), OPS, launched.execution.id)
    admin.execute(
        "UPDATE pybatch.job_execution SET status = 'STOPPED', ended_at = now(),"
        " created_at = created_at - interval '2 days', started_at = now() - interval '2 days',"
        " updated_at = now() - interval '2 days'"
        " WHERE id = %s",
        (launched.execution.id,),
    )
    retention = RetentionService(owner)
    plan = retention.plan(
        PurgePlanRequest(
            job_name=JobName("purged"),
            statuses=TerminalStatusSet.of([BatchStatus.STOPPED]),
            minimum_age=datetime.timedelta(hours=1),
        )
    )
    outcome = retention.apply(OperationId("purge-1"), OPS, ReasonCode("RETENTION"), plan)
    assert outcome.counts.operator_requests == 2
    row = admin.execute(
        "SELECT id FROM pybatch.retention_action WHERE action = 'APPLY_PURGE'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_retention_role_cannot_excuse_a_deletion_without_a_purge(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    runtime_dsn: str,
    pg_config: ConnectionConfig,
) -> None:
    purge_id = purged_history(pg_config, admin)
    assert verify_audit_chain(repository).intact  # the real purge's marks check out
    audited(repository, 1)
    [(hold_instance,)] = admin.execute(
        "SELECT id FROM pybatch.job_instance WHERE job_name = 'audited'"
    ).fetchall()
    RetentionService(repository).hold(
        OperationId("hold-1"), OPS, hold_instance, ReasonCode("LEGAL")
    )
    [(hold_id,)] = admin.execute(
        "SELECT id FROM pybatch.retention_action WHERE action = 'HOLD'"
    ).fetchall()
    [(victim, victim_seq)] = admin.execute(
        "SELECT c.record_id, c.seq FROM pybatch.audit_chain AS c"
        " JOIN pybatch.operator_request AS o ON o.id = c.record_id"
        " WHERE c.record_kind = 'OPERATOR_REQUEST' AND o.operation_id = 'stop-0'"
    ).fetchall()
    mark = "INSERT INTO pybatch.audit_chain_purge (seq, retention_action_id) VALUES (%s, %s)"
    with psycopg.connect(retention_dsn(runtime_dsn), autocommit=True) as retention:
        for action, rule in (
            (hold_id, "audit_chain_purge_names_a_purge"),  # a hold is no purge
            (purge_id, "audit_chain_purge_within_purge_counts"),  # its deletions are marked
        ):
            with pytest.raises(psycopg.errors.CheckViolation) as failure, retention.transaction():
                retention.execute("DELETE FROM pybatch.operator_request WHERE id = %s", (victim,))
                retention.execute(mark, (victim_seq, action))
            assert constraint_of(failure.value) == rule
        # A mark for a record that still exists excuses nothing either.
        assert refused(retention, mark, victim_seq, purge_id) == "audit_chain_purge_record_gone"
        for statement in (
            "DELETE FROM pybatch.audit_chain_purge",
            "UPDATE pybatch.audit_chain_purge SET retention_action_id = retention_action_id",
        ):
            with pytest.raises(psycopg.Error) as changed, retention.transaction():
                retention.execute(statement)
            assert isinstance(
                changed.value, psycopg.errors.CheckViolation | psycopg.errors.InsufficientPrivilege
            )
        # The deletion alone is possible for this role, and verify names it.
        retention.execute("DELETE FROM pybatch.operator_request WHERE id = %s", (victim,))
    result = verify_audit_chain(repository)
    assert (result.broken_at, result.reason) == (
        victim_seq,
        f"OPERATOR_REQUEST {victim} was deleted, and no purge recorded it",
    )


@pytest.mark.parametrize(
    ("names", "reason"),
    [
        ("hold", "its purge mark names RETENTION_ACTION {hold}, no purge"),
        ("purge", "its purge mark names RETENTION_ACTION {purge}, which was not recorded after it"),
    ],
)
def test_verify_checks_each_purge_mark_against_a_real_purge(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    pg_config: ConnectionConfig,
    names: str,
    reason: str,
) -> None:
    """Marks forged with the triggers off (a superuser) are still caught by verify."""
    purge_id = purged_history(pg_config, admin)
    audited(repository, 1)
    [(instance,)] = admin.execute(
        "SELECT id FROM pybatch.job_instance WHERE job_name = 'audited'"
    ).fetchall()
    RetentionService(repository).hold(OperationId("hold-1"), OPS, instance, ReasonCode("LEGAL"))
    [(hold_id,)] = admin.execute(
        "SELECT id FROM pybatch.retention_action WHERE action = 'HOLD'"
    ).fetchall()
    [(victim, victim_seq)] = admin.execute(
        "SELECT c.record_id, c.seq FROM pybatch.audit_chain AS c"
        " JOIN pybatch.operator_request AS o ON o.id = c.record_id"
        " WHERE c.record_kind = 'OPERATOR_REQUEST' AND o.operation_id = 'stop-0'"
    ).fetchall()
    named = hold_id if names == "hold" else purge_id
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("DELETE FROM pybatch.operator_request WHERE id = %s", (victim,))
        admin.execute(
            "INSERT INTO pybatch.audit_chain_purge (seq, retention_action_id) VALUES (%s, %s)",
            (victim_seq, named),
        )
    result = verify_audit_chain(repository)
    assert result.broken_at == victim_seq
    assert result.reason == f"OPERATOR_REQUEST {victim} was deleted, and " + reason.format(
        hold=hold_id, purge=purge_id
    )


def test_verify_catches_more_purge_marks_than_the_purge_deleted(
    repository: JobRepository, admin: psycopg.Connection[Any], pg_config: ConnectionConfig
) -> None:
    """A purge mark moved onto a record linked before the purge: counts no longer add up."""
    audited(repository, 1)
    [(victim, victim_seq)] = admin.execute(
        "SELECT record_id, seq FROM pybatch.audit_chain WHERE seq = 1"
    ).fetchall()
    purge_id = purged_history(pg_config, admin)
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("DELETE FROM pybatch.operator_request WHERE id = %s", (victim,))
        admin.execute(
            "INSERT INTO pybatch.audit_chain_purge (seq, retention_action_id) VALUES (%s, %s)",
            (victim_seq, purge_id),
        )
    result = verify_audit_chain(repository)
    assert not result.intact
    assert result.reason == (
        f"RETENTION_ACTION {purge_id} marks 3 OPERATOR_REQUEST links purged but its purge "
        "deleted 2 (purge marks forged)"
    )


def test_a_damaged_chain_never_blocks_the_recovery_of_a_dead_run(
    admin: psycopg.Connection[Any],
    runtime_dsn: str,
    pg_config: ConnectionConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The head rewound before the guards existed: links collide, recovery goes on."""
    with JobRepository.connect(pg_config) as owner:
        audited(owner, 3)
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute(
            "UPDATE pybatch.audit_chain_head SET seq = 1,"
            " link_digest = (SELECT link_digest FROM pybatch.audit_chain WHERE seq = 1)"
        )
    config = plaintext_config(runtime_dsn, pool_size=4)
    with JobRepository.connect(config) as repository:
        # An operator's audited write is refused: it would extend a broken chain.
        with pytest.raises(IntegrityViolation):
            OperatorService(repository).launch(
                OperationId("refused"), OPS, Job(repository, "other", DAY).key
            )
        job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
        dead = job.launch()
        dead._stop_renewing()
        wait_for_lease_expiry(admin, dead.execution.id)
        with caplog.at_level(logging.ERROR, logger="pybatch.audit"):
            with job.launch() as second:
                assert second.attempt == 2
        verification = verify_audit_chain(repository)
    [(status, failure)] = admin.execute(
        "SELECT status, failure_category FROM pybatch.job_execution WHERE id = %s",
        (dead.execution.id,),
    ).fetchall()
    assert (status, failure) == ("FAILED", "STALE_RECOVERED")
    # The decision and its operator request are recorded, unlinked, and flagged.
    [(decision, reason)] = admin.execute(
        "SELECT id, reason_code FROM pybatch.recovery_decision WHERE job_execution_id = %s",
        (dead.execution.id,),
    ).fetchall()
    assert reason == "OWNER_LOST"
    [(request,)] = admin.execute(
        "SELECT id FROM pybatch.operator_request WHERE action = 'RECOVER'"
    ).fetchall()
    assert admin.execute(
        "SELECT count(*) FROM pybatch.audit_chain WHERE (record_kind, record_id) IN"
        " (('RECOVERY_DECISION', %s), ('OPERATOR_REQUEST', %s))",
        (decision, request),
    ).fetchone() == (0,)
    logged = [r.getMessage() for r in caplog.records if r.name == "pybatch.audit"]
    assert any(f"RECOVERY_DECISION {decision}" in line for line in logged), logged
    assert any(f"OPERATOR_REQUEST {request}" in line for line in logged), logged
    assert not verification.intact
    assert verification.broken_at == 2


def test_purges_keep_marking_their_deletions_as_the_retention_role(
    admin: psycopg.Connection[Any], runtime_dsn: str, pg_config: ConnectionConfig
) -> None:
    with JobRepository.connect(pg_config) as owner:
        audited(owner, 2)
    admin.execute(
        "UPDATE pybatch.job_execution SET status = 'STOPPED', ended_at = now(),"
        " created_at = created_at - interval '2 days', started_at = now() - interval '2 days',"
        " updated_at = now() - interval '2 days'"
    )
    config = attrs.evolve(
        plaintext_config(runtime_dsn, pool_size=2), dsn=retention_dsn(runtime_dsn)
    )
    with JobRepository.connect(config) as repository:
        retention = RetentionService(repository)
        plan = retention.plan(
            PurgePlanRequest(
                job_name=JobName("audited"),
                statuses=TerminalStatusSet.of([BatchStatus.STOPPED]),
                minimum_age=datetime.timedelta(hours=1),
            )
        )
        outcome = retention.apply(OperationId("p-1"), OPS, ReasonCode("RETENTION"), plan)
        assert outcome.counts.operator_requests == 4
        result = verify_audit_chain(repository)
    assert result.intact and result.links == 5
    assert admin.execute("SELECT count(*) FROM pybatch.audit_chain_purge").fetchone() == (4,)


def test_a_stuck_lock_on_the_head_never_blocks_the_recovery_of_a_dead_run(
    admin: psycopg.Connection[Any],
    runtime_dsn: str,
    db_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transaction of the owner sits on the head's row lock; the dead run is recovered."""
    config = plaintext_config(
        runtime_dsn, pool_size=4, lock_timeout=datetime.timedelta(milliseconds=300)
    )
    with JobRepository.connect(config) as repository:
        job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
        dead = job.launch()
        dead._stop_renewing()
        wait_for_lease_expiry(admin, dead.execution.id)
        with psycopg.connect(db_dsn) as stuck:
            stuck.execute("SELECT seq FROM pybatch.audit_chain_head FOR UPDATE")
            with caplog.at_level(logging.ERROR, logger="pybatch.audit"):
                with job.launch() as second:
                    assert second.attempt == 2
            stuck.rollback()
        verification = verify_audit_chain(repository)
    [(status,)] = admin.execute(
        "SELECT status FROM pybatch.job_execution WHERE id = %s", (dead.execution.id,)
    ).fetchall()
    assert status == "FAILED"
    logged = [r.getMessage() for r in caplog.records if r.name == "pybatch.audit"]
    assert len(logged) == 2 and all("Unavailable" in line for line in logged), logged
    # The chain itself is whole; the two records are reported as unlinked.
    assert verification.broken_at is None
    assert verification.reason is not None and "has no link" in verification.reason
