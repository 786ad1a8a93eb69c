"""`pybatch hold`, `release` and `purge`: real processes against the test database."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg

from pybatch import JobRepository
from pybatch.etl import Job
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.status import BatchStatus
from tests.cli.test_operator_cli import pybatch

S = BatchStatus


def completed(repository: JobRepository, run: str, job: str = "nightly") -> int:
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(Job(repository, job, {"run": run}).key)
        execution = uow.executions.create(instance.instance.id)
        for status in (S.STARTED, S.COMPLETED):
            execution = uow.executions.transition(
                execution.id, execution.version, LifecycleTransition.new(status, uow.clock.now())
            )
        uow.commit()
    return instance.instance.id


def age_everything(admin: psycopg.Connection[Any]) -> None:
    """Make every history 100 days old (the CLI uses the system clock)."""
    admin.execute(
        "UPDATE pybatch.job_execution SET created_at = created_at - interval '100 days',"
        " started_at = started_at - interval '100 days', ended_at = ended_at - interval '100 days',"
        " updated_at = updated_at - interval '100 days'"
    )


def check_tombstones_are_marked(db_dsn: str, ids: list[int]) -> None:
    """`instances` marks a purged instance PURGED (with its final status); a held one stays."""
    listing = pybatch(db_dsn, "instances", "nightly")
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:6] == ["INSTANCE", "JOB", "PARAMETERS", "CREATED", "STATE", "PURGED"]
    state = {int(row.split()[0]): row for row in rows}
    assert set(state) == set(ids)
    assert "PURGED" not in state[ids[0]] and "LEGAL_HOLD" in state[ids[0]]
    for purged in ids[1:]:
        assert re.search(r"  PURGED \(COMPLETED\)  \d{4}-\d\d-\d\d ", state[purged])
    document = json.loads(pybatch(db_dsn, "instances", "nightly", "--json").stdout)
    tombstones = {item["id"]: item["tombstone"] for item in document["items"]}
    assert tombstones[ids[0]] is None
    assert tombstones[ids[1]]["final_status"] == "COMPLETED"
    assert tombstones[ids[1]]["last_attempt"] == 1 and tombstones[ids[1]]["purged_at"]


def test_hold_release_and_purge(
    pg_config: Any, db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    with JobRepository.connect(pg_config) as repository:
        ids = [completed(repository, str(run)) for run in range(5)]
    age_everything(admin)

    held = pybatch(db_dsn, "hold", str(ids[0]), "--reason", "LEGAL_HOLD", "--operation-id", "h1")
    assert held.returncode == 0, held.stderr
    assert held.stdout == "APPLIED HOLD operation h1\n"
    assert pybatch(
        db_dsn, "hold", str(ids[0]), "--reason", "LEGAL_HOLD", "--operation-id", "h1"
    ).stdout == ("REPLAYED HOLD operation h1\n")
    same = pybatch(db_dsn, "hold", str(ids[0]), "--reason", "LEGAL_HOLD", "--operation-id", "h2")
    assert same.returncode == 0, same.stderr
    assert re.fullmatch(
        r"NOOP HOLD operation h2: the hold already exists \(LEGAL_HOLD by cli:\S+ since "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)\n",
        same.stdout,
    ), same.stdout
    unheld = pybatch(db_dsn, "release", str(ids[1]), "--operation-id", "r0")
    assert unheld.stdout == "NOOP RELEASE_HOLD operation r0: the instance has no hold\n"

    dry = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d",
        "--dry-run",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("dry run: nothing is deleted")
    assert lines[1].startswith("COMPLETED ") and "job_executions 4" in lines[1]
    assert "job_instances 4" in lines[-1] and lines[-1].startswith("total")
    too_young = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "30m"
    )
    assert too_young.returncode == 2 and "AgeBoundTooSmall" in too_young.stderr
    too_long = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d",
        "--operation-id", "p" * 48,
    )  # fmt: skip
    assert too_long.returncode == 2 and too_long.stdout == ""
    assert too_long.stderr.splitlines() == [
        "pybatch: RequestFieldInvalid: operation id of a purge exceeds 47 bytes"
    ]

    purged = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d",
        "--batch", "3", "--operation-id", "nightly-purge",
    )  # fmt: skip
    assert purged.returncode == 0, purged.stderr
    progress = [line for line in purged.stderr.splitlines() if line.startswith("batch ")]
    assert [line.split(":")[0] for line in progress] == ["batch 1", "batch 2"]  # 3 + 1
    assert purged.stdout.splitlines()[-1].startswith("deleted    ")
    assert purged.stdout.startswith("APPLIED PURGE operation nightly-purge: purged in 2 batches, ")
    assert "job_executions 4" in purged.stdout
    replayed = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d",
        "--batch", "3", "--operation-id", "nightly-purge",
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith(
        "REPLAYED PURGE operation nightly-purge: 2 batches recorded before, nothing left to purge"
    )
    assert replayed.stdout.splitlines()[-1] == purged.stdout.splitlines()[-1]  # what they deleted
    remaining = admin.execute("SELECT count(*) FROM pybatch.job_execution").fetchone()
    assert remaining == (1,)  # the held one
    check_tombstones_are_marked(db_dsn, ids)

    released = pybatch(db_dsn, "release", str(ids[0]))
    assert released.returncode == 0 and released.stdout.startswith("APPLIED RELEASE_HOLD")
    again = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d"
    )
    assert again.returncode == 0 and "job_executions 1" in again.stdout
    nothing = pybatch(
        db_dsn, "purge", "--job", "nightly", "--status", "COMPLETED", "--older-than", "90d",
        "--operation-id", "nothing-left",
    )  # fmt: skip
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.startswith("NOOP PURGE operation nothing-left: nothing to purge")
    verified = pybatch(db_dsn, "audit", "verify")
    assert verified.returncode == 0, verified.stdout
