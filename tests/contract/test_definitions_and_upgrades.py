"""Definitions and upgrades (D1-D12)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch.errors import (
    DefinitionDrift,
    DefinitionJobMismatch,
    DefinitionUpgradeConflict,
    IncompatibleDefinition,
    InvalidDefinitionUpgrade,
    UnsupportedManifestVersion,
)
from pybatch.values.definitions import DefinitionIdentity, DefinitionUpgrade
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    DefinitionRevision,
    DefinitionUpgradeKey,
    JobName,
    StepName,
)
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution
from pybatch.values.status import FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.statements import create_step

JOB = "invoices"
FAILURE = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(5))
_runs = itertools.count(1)


def new_key(job: str = JOB) -> JobInstanceKey:
    return JobInstanceKey(JobName(job), JobParameters.of({"run": next(_runs)}))


def definition(
    revision: str, steps: list[str], *, job: str | None = None, manifest_format: int = 1
) -> DefinitionIdentity:
    return DefinitionIdentity.from_manifest(
        None if job is None else JobName(job),
        DefinitionRevision(revision),
        {"format": manifest_format, "steps": steps},
    )


A = definition("rev-a", ["extract", "load"])
B = definition("rev-b", ["extract_v2", "load"])
C = definition("rev-c", ["extract_v3", "load"])


def upgrade(
    key: str, source: DefinitionIdentity, target: DefinitionIdentity, mapping: dict[str, str]
) -> DefinitionUpgrade:
    return DefinitionUpgrade(
        DefinitionUpgradeKey(key),
        source,
        target,
        {StepName(s): StepName(t) for s, t in mapping.items()},
    )


IDENTITY = {"extract": "extract", "load": "load"}


def fail(uow: UnitOfWork, clock: ManualClock, execution: JobExecution) -> JobExecution:
    return uow.executions.transition(
        execution.id, execution.version, LifecycleTransition.failed(clock.advance(), FAILURE)
    )


def failed_first_attempt(
    repository: JobRepository,
    clock: ManualClock,
    first: DefinitionIdentity,
    *,
    steps: tuple[str, ...] = (),
) -> JobExecution:
    """A committed instance whose only attempt ran under `first` and FAILED."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        execution = uow.executions.create(instance.id, first)
        for name in steps:
            create_step(uow, execution.id, StepName(name))
        execution = fail(uow, clock, execution)
        uow.commit()
    return execution


def count(admin: psycopg.Connection[Any], sql: str, *params: object) -> int:
    row = admin.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def definition_row(admin: psycopg.Connection[Any], definition_id: int) -> tuple[Any, ...]:
    row = admin.execute(
        "SELECT job_name, definition_revision, manifest_digest FROM pybatch.job_definition "
        "WHERE id = %s",
        (definition_id,),
    ).fetchone()
    assert row is not None
    return (row[0], row[1], bytes(row[2]))


# --------------------------------------------------------------------------- D1 - D4


def test_restart_with_the_same_digest_keeps_the_definition_without_an_upgrade(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D1, D8."""
    first = failed_first_attempt(repository, clock, A)
    with repository.begin() as uow:
        second = uow.executions.create(first.job_instance_id, A)
        second = fail(uow, clock, second)
        # The same manifest under another revision name is the same definition (D8).
        renamed = definition("rev-a-renamed", ["extract", "load"])
        third = uow.executions.create(first.job_instance_id, renamed)
        uow.commit()
    assert second.definition_id == first.definition_id == third.definition_id
    assert second.upgrade_from_definition_id is None
    assert third.upgrade_from_definition_id is None
    assert third.attempt == 3
    assert definition_row(admin, first.definition_id) == (JOB, "rev-a", A.digest)


def test_restart_with_another_digest_and_no_upgrade_edge_is_incompatible(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D2."""
    first = failed_first_attempt(repository, clock, A)
    rows = count(admin, "SELECT count(*) FROM pybatch.job_definition")
    with repository.begin() as uow:
        with pytest.raises(IncompatibleDefinition) as incompatible:
            uow.executions.create(first.job_instance_id, B)
        assert incompatible.value.instance_id == first.job_instance_id
        # An edge B -> A points the other way and does not help either.
        uow.definitions.register_upgrade(JobName(JOB), upgrade("b-to-a", B, A, IDENTITY))
        with pytest.raises(IncompatibleDefinition):
            uow.executions.create(first.job_instance_id, B)
        # Nor does the legacy definition, whose digest differs from A's.
        with pytest.raises(IncompatibleDefinition):
            uow.executions.create(first.job_instance_id)
        uow.commit()
    with repository.begin() as uow:
        assert uow.executions.of_instance(first.job_instance_id) == [first]
    # Only the upgrade registration added rows (B), never the refused launches.
    assert count(admin, "SELECT count(*) FROM pybatch.job_definition") == rows + 1


def test_restart_over_a_registered_direct_edge_upgrades_the_definition(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D3."""
    first = failed_first_attempt(repository, clock, A)
    with repository.begin() as uow:
        uow.definitions.register_upgrade(JobName(JOB), upgrade("a-to-b", A, B, IDENTITY))
        uow.commit()
    with repository.begin() as uow:
        second = uow.executions.create(first.job_instance_id, B)
        uow.commit()
    assert second.attempt == 2 and second.restart_of_execution_id == first.id
    assert second.upgrade_from_definition_id == first.definition_id
    assert second.definition_id != first.definition_id
    assert definition_row(admin, second.definition_id)[2] == B.digest
    with repository.begin() as uow:
        assert uow.executions.of_instance(first.job_instance_id)[-1] == second


def test_upgrade_edges_are_not_transitive(repository: JobRepository, clock: ManualClock) -> None:
    """Scenario D4."""
    first = failed_first_attempt(repository, clock, A)
    with repository.begin() as uow:
        uow.definitions.register_upgrade(JobName(JOB), upgrade("a-to-b", A, B, IDENTITY))
        uow.definitions.register_upgrade(
            JobName(JOB), upgrade("b-to-c", B, C, {"extract_v2": "extract_v3", "load": "load"})
        )
        uow.commit()
    with repository.begin() as uow:
        with pytest.raises(IncompatibleDefinition) as incompatible:
            uow.executions.create(first.job_instance_id, C)
        assert incompatible.value.instance_id == first.job_instance_id
        # Step by step it works: A -> B, then B -> C.
        second = fail(uow, clock, uow.executions.create(first.job_instance_id, B))
        third = uow.executions.create(first.job_instance_id, C)
        uow.commit()
    assert third.upgrade_from_definition_id == second.definition_id


# --------------------------------------------------------------------------- D5, D11


def test_identical_edge_is_idempotent_and_a_different_one_conflicts(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D5."""
    edge = upgrade("a-to-b", A, B, IDENTITY)
    with repository.begin() as uow:
        uow.definitions.register_upgrade(JobName(JOB), edge)
        uow.definitions.register_upgrade(JobName(JOB), edge)
        uow.commit()
    with repository.begin() as uow:
        uow.definitions.register_upgrade(JobName(JOB), upgrade("a-to-b", A, B, dict(IDENTITY)))
        for different in (
            upgrade("a-to-b", A, B, {"extract": "extract_v2", "load": "load"}),
            upgrade("a-to-b", A, B, {"extract": "extract"}),
            upgrade("a-to-b-v2", A, B, IDENTITY),
        ):
            with pytest.raises(DefinitionUpgradeConflict) as conflict:
                uow.definitions.register_upgrade(JobName(JOB), different)
            assert conflict.value.job_name == JOB
        uow.commit()
    assert count(admin, "SELECT count(*) FROM pybatch.definition_upgrade") == 1
    row = admin.execute(
        "SELECT upgrade_key, step_mapping FROM pybatch.definition_upgrade"
    ).fetchone()
    assert row == ("a-to-b", IDENTITY)


def test_upgrade_key_reused_toward_the_same_target_conflicts(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D11."""
    with repository.begin() as uow:
        uow.definitions.register_upgrade(JobName(JOB), upgrade("k", A, C, IDENTITY))
        uow.commit()
    with repository.begin() as uow:
        with pytest.raises(DefinitionUpgradeConflict) as conflict:
            uow.definitions.register_upgrade(JobName(JOB), upgrade("k", B, C, IDENTITY))
        assert conflict.value.job_name == JOB
        # The unit of work stays usable, and the key is free toward another target.
        uow.definitions.register_upgrade(JobName(JOB), upgrade("k", A, B, IDENTITY))
        uow.commit()
    assert count(admin, "SELECT count(*) FROM pybatch.definition_upgrade") == 2


# --------------------------------------------------------------------------- D6, D12


def test_same_revision_with_another_digest_drifts(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D6."""
    drifted = definition("rev-a", ["extract", "load", "report"])
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        uow.executions.create(instance.id, A)
        uow.commit()
    with repository.begin() as uow:
        other = uow.instances.select_or_create(new_key()).instance
        with pytest.raises(DefinitionDrift) as drift:
            uow.executions.create(other.id, drifted)
        assert (drift.value.job_name, drift.value.revision) == (JOB, "rev-a")
        with pytest.raises(DefinitionDrift):
            uow.definitions.register_upgrade(JobName(JOB), upgrade("x", B, drifted, IDENTITY))
        with pytest.raises(DefinitionDrift):
            uow.definitions.register_upgrade(JobName(JOB), upgrade("y", drifted, B, IDENTITY))
        # Another job may use the revision name with any manifest.
        foreign = uow.instances.select_or_create(new_key("payroll")).instance
        uow.executions.create(foreign.id, drifted)
        uow.commit()
    # The refusals staged nothing: rev-a of this job still names A only, no edge exists, and
    # the instance refused its launch has no execution.
    revisions = admin.execute(
        "SELECT manifest_digest FROM pybatch.job_definition"
        " WHERE job_name = %s AND definition_revision = 'rev-a'",
        (JOB,),
    ).fetchall()
    assert [bytes(row[0]) for row in revisions] == [A.digest]
    assert count(admin, "SELECT count(*) FROM pybatch.definition_upgrade") == 0
    with repository.begin() as uow:
        assert uow.executions.of_instance(other.id) == []


def test_drift_is_not_hidden_by_the_digest_of_another_revision(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D12."""
    r1 = definition("r1", ["one"])
    r2 = definition("r2", ["two"])
    with repository.begin() as uow:
        for d in (r1, r2):
            uow.executions.create(uow.instances.select_or_create(new_key()).instance.id, d)
        uow.commit()
    r1_with_b = DefinitionIdentity(None, DefinitionRevision("r1"), 1, r2.canonical_manifest)
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        with pytest.raises(DefinitionDrift) as drift:
            uow.executions.create(instance.id, r1_with_b)
        assert (drift.value.job_name, drift.value.revision) == (JOB, "r1")
        uow.commit()
    assert count(admin, "SELECT count(*) FROM pybatch.job_execution") == 2


# --------------------------------------------------------------------------- D7 - D9


def test_a_definition_bound_to_another_job_is_refused(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D7."""
    bound = definition("rev-x", ["a"], job="x")
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key("y")).instance
        with pytest.raises(DefinitionJobMismatch) as mismatch:
            uow.executions.create(instance.id, bound)
        assert (mismatch.value.expected, mismatch.value.actual) == ("y", "x")
        with pytest.raises(DefinitionJobMismatch):
            uow.definitions.register_upgrade(
                JobName("y"), upgrade("k", bound, definition("rev-y", ["b"]), {"a": "a"})
            )
        # Bound to the right job, it is accepted.
        own = uow.instances.select_or_create(new_key("x")).instance
        uow.executions.create(own.id, bound)
        uow.commit()
    assert count(admin, "SELECT count(*) FROM pybatch.job_definition WHERE job_name = 'y'") == 0


def test_same_digest_under_a_new_revision_resolves_to_the_existing_row(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D8."""
    renamed = definition("rev-a-2", ["extract", "load"])
    assert renamed.digest == A.digest
    with repository.begin() as uow:
        first = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id, A)
        uow.commit()
    with repository.begin() as uow:
        second = uow.executions.create(
            uow.instances.select_or_create(new_key()).instance.id, renamed
        )
        uow.commit()
    assert second.definition_id == first.definition_id
    rows = admin.execute(
        "SELECT definition_revision FROM pybatch.job_definition WHERE manifest_digest = %s",
        (A.digest,),
    ).fetchall()
    assert rows == [("rev-a",)]


def test_an_unsupported_manifest_format_is_refused_on_every_path(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario D9."""
    missing = DefinitionIdentity.from_manifest(None, DefinitionRevision("rev-0"), {"steps": []})
    for manifest_format, bad in (
        (0, missing),  # a manifest without a format member is format 0
        (4, definition("rev-4", ["s"], manifest_format=4)),
        (65535, definition("rev-max", ["s"], manifest_format=65535)),
    ):
        assert bad.manifest_format == manifest_format
        check_refused_everywhere(repository, clock, admin, bad)


def check_refused_everywhere(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    bad: DefinitionIdentity,
) -> None:
    manifest_format = bad.manifest_format
    first = failed_first_attempt(repository, clock, A)
    rows = count(admin, "SELECT count(*) FROM pybatch.job_definition")
    with repository.begin() as uow:
        fresh = uow.instances.select_or_create(new_key()).instance
        refusals: list[Callable[[], object]] = [
            lambda: uow.executions.create(fresh.id, bad),  # launch
            lambda: uow.executions.create(first.job_instance_id, bad),  # restart
            lambda: uow.definitions.register_upgrade(JobName(JOB), upgrade("k1", bad, A, IDENTITY)),
            lambda: uow.definitions.register_upgrade(JobName(JOB), upgrade("k2", A, bad, IDENTITY)),
        ]
        for refuse in refusals:
            with pytest.raises(UnsupportedManifestVersion) as unsupported:
                refuse()
            assert unsupported.value.format == manifest_format
        uow.commit()
    assert count(admin, "SELECT count(*) FROM pybatch.job_definition") == rows
    assert count(admin, "SELECT count(*) FROM pybatch.definition_upgrade") == 0


# --------------------------------------------------------------------------- D10


def test_an_upgraded_restart_refuses_a_step_without_a_mapping(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario D10."""
    first = failed_first_attempt(repository, clock, A, steps=("extract", "load"))
    with repository.begin() as uow:
        uow.definitions.register_upgrade(
            JobName(JOB), upgrade("a-to-b", A, B, {"extract": "extract_v2"})
        )
        restart = uow.executions.create(first.job_instance_id, B)
        uow.commit()
    with repository.begin() as uow:
        for unmapped in ("load", "extract"):  # "extract" is a source name, not a target
            with pytest.raises(InvalidDefinitionUpgrade) as invalid:
                create_step(uow, restart.id, StepName(unmapped))
            assert invalid.value.execution_id == restart.id
        mapped = create_step(uow, restart.id, StepName("extract_v2"))
        uow.commit()
    assert mapped.step_name == StepName("extract_v2")
    with repository.begin() as uow:
        assert uow.steps.of_execution(restart.id) == [mapped]
