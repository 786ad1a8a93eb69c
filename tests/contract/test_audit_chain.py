"""The tamper-evident audit chain (`pybatch audit verify`).

What an auditor relies on: every operator request, recovery decision and retention action
is linked as it is written; an edit, deletion or reordering made directly in the database
is detected and the first broken link is named; concurrent appends keep one chain.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import OperatorService
from pybatch.etl import Job
from pybatch.values.names import ActorRef, OperationId
from tests.cli.test_demo import clean_env
from tests.support.race import race

OPS = ActorRef("cli:ops")


def audited(repository: JobRepository, n: int) -> OperatorService:
    """n launches, a stop on each: 2n operator requests, all linked."""
    service = OperatorService(repository)
    for index in range(n):
        key = Job(repository, "audited", {"n": index}).key
        launched = service.launch(OperationId(f"launch-{index}"), OPS, key)
        assert launched.execution is not None
        service.stop(OperationId(f"stop-{index}"), OPS, launched.execution.id)
    return service


def links(admin: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return admin.execute(
        "SELECT seq, record_kind, record_id FROM pybatch.audit_chain ORDER BY seq"
    ).fetchall()


def test_every_audit_record_is_linked_in_order(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    audited(repository, 3)
    assert links(admin) == [(seq, "OPERATOR_REQUEST", seq) for seq in range(1, 7)]
    result = verify_audit_chain(repository, page=4)  # more than one page
    assert result.intact and result.links == 6
    assert result.describe() == "audit chain intact: 6 links verified"


def test_an_automatic_recovery_is_linked(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    from tests.contract.test_etl_api import DAY, SHORT_LEASE, wait_for_lease_expiry

    job = Job(repository, "load_orders", DAY, lease=SHORT_LEASE)
    dead = job.launch()
    dead._stop_renewing()
    wait_for_lease_expiry(admin, dead.execution.id)
    with job.launch():
        pass
    assert [kind for _, kind, _ in links(admin)] == ["RECOVERY_DECISION", "OPERATOR_REQUEST"]
    assert verify_audit_chain(repository).intact


@pytest.mark.parametrize(
    ("tamper", "broken_at", "reason"),
    [
        (
            "UPDATE pybatch.operator_request SET actor_ref = 'cli:mallory' WHERE id = 3",
            3,
            "OPERATOR_REQUEST 3 was changed",
        ),
        (
            "DELETE FROM pybatch.operator_request WHERE id = 4",
            4,
            "OPERATOR_REQUEST 4 was deleted, and no purge recorded it",
        ),
        (
            "UPDATE pybatch.audit_chain SET seq = seq + 100 WHERE seq IN (2, 3);"
            " UPDATE pybatch.audit_chain SET seq = 105 - seq WHERE seq > 100",
            2,
            "it does not follow the previous link (reordered or rewritten)",
        ),
        (
            "UPDATE pybatch.audit_chain SET record_id = record_id + 1000 WHERE seq IN (2, 3);"
            " UPDATE pybatch.audit_chain SET record_id = 1005 - record_id WHERE record_id > 1000",
            2,
            "its digest does not match its fields",
        ),
        ("DELETE FROM pybatch.audit_chain WHERE seq = 5", 5, "the link is missing (deleted)"),
        (
            "DELETE FROM pybatch.audit_chain WHERE seq = 6",
            6,
            "the chain ends at link 5 but its head is link 6 (links removed or the head rewritten)",
        ),
        (
            "UPDATE pybatch.audit_chain_head SET seq = 1,"
            " link_digest = (SELECT link_digest FROM pybatch.audit_chain WHERE seq = 1)",
            2,
            "it lies past the head (link 1): written around the chain, or the head was rewound",
        ),
        (
            "INSERT INTO pybatch.audit_chain SELECT 7, 'OPERATOR_REQUEST', 999, content_digest,"
            " link_digest, link_digest FROM pybatch.audit_chain WHERE seq = 6",
            7,
            "it lies past the head (link 6): written around the chain, or the head was rewound",
        ),
    ],
    ids=[
        "edit",
        "delete-record",
        "reorder",
        "swap-records",
        "delete-link",
        "truncate",
        "rewind-head",
        "junk-past-head",
    ],
)
def test_tampering_is_detected_at_the_first_broken_link(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    tamper: str,
    broken_at: int,
    reason: str,
) -> None:
    audited(repository, 3)
    with admin.transaction():
        # The chain's triggers refuse every one of these; a superuser can switch them off.
        admin.execute("SET LOCAL session_replication_role = replica")
        for statement in tamper.split(";"):
            admin.execute(statement)
    result = verify_audit_chain(repository, page=2)
    assert not result.intact
    assert (result.broken_at, result.reason) == (broken_at, reason)


def test_a_record_written_around_the_chain_is_detected(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    audited(repository, 1)
    admin.execute(
        "INSERT INTO pybatch.operator_request (action, authorization_class, operation_id,"
        " actor_ref, request_digest, outcome_class, requested_at)"
        " VALUES ('STOP', 'LIFECYCLE', 'forged', 'cli:x', sha256('x'), 'APPLIED', now())"
    )
    result = verify_audit_chain(repository)
    assert not result.intact
    assert result.reason is not None and "has no link" in result.reason


@pytest.mark.race
def test_concurrent_appends_keep_one_chain(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    service = OperatorService(repository)

    def launch(index: int) -> None:
        for round_ in range(3):
            key = Job(repository, "race", {"n": index, "r": round_}).key
            service.launch(OperationId(f"l-{index}-{round_}"), OPS, key)

    outcomes = race(4, launch)
    assert all(outcome.ok for outcome in outcomes), [o.error for o in outcomes]
    seqs = [seq for seq, _, _ in links(admin)]
    assert seqs == list(range(1, 13))  # no gap, no fork (seq is the primary key)
    ids = sorted(record_id for _, _, record_id in links(admin))
    rows = admin.execute("SELECT id FROM pybatch.operator_request ORDER BY id").fetchall()
    assert ids == [row[0] for row in rows]
    assert verify_audit_chain(repository).intact


def test_audit_verify_command(
    repository: JobRepository, admin: psycopg.Connection[Any], db_dsn: str
) -> None:
    audited(repository, 2)

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pybatch", "audit", "verify", "--dsn", db_dsn, "--plaintext"],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
            check=False,
        )

    ok = verify()
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "audit chain intact: 4 links verified\n"
    admin.execute("UPDATE pybatch.operator_request SET reason_code = 'EDITED' WHERE id = 2")
    broken = verify()
    assert broken.returncode == 1
    assert broken.stdout == "audit chain broken at link 2: OPERATOR_REQUEST 2 was changed\n"
