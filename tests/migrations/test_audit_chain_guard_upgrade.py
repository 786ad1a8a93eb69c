"""Upgrading to the audit chain's guards (migration 0007) on a database with a live chain.

Links written by an older pybatch stay valid and verify; the chain goes on from its head
with the new append; a purge after the upgrade marks links written before it; and the
older package's way of appending (advance the head, then insert the link) is refused, which
is why the package is upgraded with the schema.
"""

from __future__ import annotations

import datetime

import psycopg
import pytest

from pybatch import JobRepository
from pybatch import _migrator as migrator
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch._services.retention import RetentionService
from pybatch.etl import Job
from pybatch.values.names import ActorRef, JobName, OperationId, ReasonCode
from pybatch.values.retention import PurgePlanRequest, TerminalStatusSet
from pybatch.values.status import BatchStatus
from tests.conftest import plaintext_config
from tests.migrations.older_package import older_package
from tests.migrations.test_lease_upgrade import install_up_to

#: The migration that adds the guards.
GUARDS = 7
OPS = ActorRef("cli:ops")

#: How pybatch appended a link before the guards: advance the head, link, set its digest.
OLD_ADVANCE = "UPDATE pybatch.audit_chain_head SET seq = seq + 1 RETURNING seq, link_digest"
OLD_LINK = """
INSERT INTO pybatch.audit_chain
    (seq, record_kind, record_id, content_digest, previous_digest, link_digest)
SELECT %(seq)s, c.record_kind, c.record_id, c.content_digest, %(previous)s,
    sha256(%(previous)s || int8send(%(seq)s::bigint) || convert_to(c.record_kind, 'UTF8')
        || int8send(c.record_id) || c.content_digest)
FROM pybatch.audit_record_content AS c
WHERE c.record_kind = 'OPERATOR_REQUEST' AND c.record_id = %(id)s
RETURNING link_digest
"""
OLD_SET_HEAD = "UPDATE pybatch.audit_chain_head SET link_digest = %s WHERE seq = %s"


def old_audited_stop(conn: psycopg.Connection, execution_id: int, operation: str) -> None:
    """An operator request and its link, as the package before the guards wrote them."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO pybatch.operator_request (job_execution_id, action,"
            " authorization_class, operation_id, actor_ref, request_digest, outcome_class,"
            " requested_at) VALUES (%s, 'STOP', 'LIFECYCLE', %s, 'cli:old', sha256('x'),"
            " 'APPLIED', now()) RETURNING id",
            (execution_id, operation),
        ).fetchone()
        assert row is not None
        head = conn.execute(OLD_ADVANCE).fetchone()
        assert head is not None
        seq, previous = head
        linked = conn.execute(OLD_LINK, {"seq": seq, "previous": previous, "id": row[0]})
        link = linked.fetchone()
        assert link is not None
        conn.execute(OLD_SET_HEAD, (link[0], seq))


def test_upgrade_keeps_the_chain_and_appends_after_it(
    blank_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plaintext_config(blank_database)
    install_up_to(blank_database, GUARDS - 1)
    # An older package's history: a finished run with two audited stop requests.
    with older_package(monkeypatch, GUARDS - 1):
        old_execution = _finished_execution(blank_database)
    with psycopg.connect(blank_database, autocommit=True) as conn:
        for operation in ("old-1", "old-2"):
            old_audited_stop(conn, old_execution, operation)
    applied = migrator.migrate(config)
    assert [m.version for m in applied] == list(
        range(GUARDS, migrator.supported_schema_version() + 1)
    )
    with JobRepository.connect(config) as repository:
        before = verify_audit_chain(repository)
        assert before.intact and before.links == 2
        # The chain goes on from the old head.
        service = OperatorService(repository)
        launched = service.launch(OperationId("new-1"), OPS, Job(repository, "new_job").key)
        assert launched.execution is not None
        after = verify_audit_chain(repository)
        assert after.intact and after.links == 3
        # A purge after the upgrade marks the links the older package wrote.
        retention = RetentionService(repository)
        plan = retention.plan(
            PurgePlanRequest(
                job_name=JobName("old_job"),
                statuses=TerminalStatusSet.of([BatchStatus.COMPLETED]),
                minimum_age=datetime.timedelta(hours=1),
            )
        )
        outcome = retention.apply(OperationId("purge-1"), OPS, ReasonCode("RETENTION"), plan)
        assert outcome.counts.operator_requests == 2
        purged = verify_audit_chain(repository)
        assert purged.intact and purged.links == 4
    # The older package's append is refused now: its first step moves the head alone.
    with (
        psycopg.connect(blank_database, autocommit=True) as conn,
        pytest.raises(psycopg.errors.CheckViolation) as refused,
    ):
        old_audited_stop(conn, launched.execution.id, "old-3")
    assert refused.value.diag.constraint_name == "audit_chain_head_advances_by_one_link"


def _finished_execution(dsn: str) -> int:
    """A COMPLETED run of job old_job, finished two days ago, written through pybatch."""
    with JobRepository.connect(plaintext_config(dsn)) as repository:
        with Job(repository, "old_job").launch() as run:
            pass
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pybatch.job_execution SET created_at = created_at - interval '2 days',"
            " started_at = started_at - interval '2 days',"
            " ended_at = ended_at - interval '2 days', updated_at = updated_at - interval '2 days'"
        )
    return run.execution.id
