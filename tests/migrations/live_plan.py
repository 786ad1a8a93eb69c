"""A run or a partitioned step that an older package started, live across a migration.

Upgrade tests share three scenarios: a job of the older package whose step migrates between
two chunks (`run_across_upgrade`); the same beside a run of the older package that died after a
chunk, which the upgraded package then recovers and resumes (`recover_across_upgrade`); and a
plan that an older package started (one partition claimed, the rest not), the migration, then
the current package ending the claimed partition and working off the rest.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from functools import partial

import pytest

import pybatch._job_repository as repository_module
from pybatch import ConnectionConfig, JobRepository
from pybatch import _migrator as migrator
from pybatch import _partitioned as partitioned
from pybatch.etl import ETL_STATE_SCHEMA, Job, JobRun, StepRun
from pybatch.values.flow import StartLimit
from pybatch.values.names import NodeId, StepName
from pybatch.values.ownership import ExecutionLease
from pybatch.values.records import StepExecution
from pybatch.values.status import BatchStatus
from tests.migrations.older_package import older_package as older_package_of
from tests.migrations.test_lease_upgrade import install_up_to


def migration_named(name: str) -> int:
    """A shipped migration's number, looked up by name (its number follows the others')."""
    return next(m.version for m in migrator.shipped_migrations() if m.name == name)


def older_package(
    config: ConnectionConfig, schema_version: int, monkeypatch: pytest.MonkeyPatch
) -> JobRepository:
    """A repository of the package whose schema ended at `schema_version` (installed now)."""
    install_up_to(config.dsn.reveal(), schema_version)
    with monkeypatch.context() as old_package:
        old_package.setattr(repository_module, "supported_schema_version", lambda: schema_version)
        return JobRepository.connect(config)


def die_after_a_chunk(old: JobRepository, job_name: str) -> JobRun:
    """Launch `job_name` (1 s lease), commit one chunk of its step `load`, and die there.

    Nothing renews or ends the run afterwards: a relaunch recovers it once its lease ran out
    and resumes the step from that chunk's checkpoint ({"offset": 1}).
    """
    dead = Job(old, job_name, {}, lease=datetime.timedelta(seconds=1)).launch()
    skipped, step = old.run_in_unit_of_work(
        lambda uow: uow.flow.start_step(
            dead.execution.id,
            dead._owned(),
            StepName("load"),
            NodeId("load"),
            StartLimit.unrestricted(),
        )
    )
    assert not skipped
    dying = StepRun(dead, step)
    with dying.chunk() as chunk:
        chunk.commit(read=1, written=1, checkpoint={"offset": 1})
    dying.close()
    dead._stop_renewing()  # its process is gone: nothing renews or ends it
    return dead


@dataclass
class LivePlan:
    """A running job's plan with its first partition claimed by a worker of the older package."""

    run: JobRun
    parent: StepExecution
    lease: ExecutionLease
    claimed: partitioned.Claimed | None


def start_plan(old: JobRepository, day: str, keys: list[str]) -> LivePlan:
    """Launch a job of `day`, publish a plan of `keys` and claim its first partition."""
    run = Job(old, "fanout", {"day": day}).launch()
    entries = partitioned.plan_entries(keys, ETL_STATE_SCHEMA)
    _, parent = partitioned.start_partitioned_step(
        old, run.instance.id, run.execution.id, "load", entries, StartLimit.unrestricted()
    )
    lease = ExecutionLease()
    claimed = old.run_in_unit_of_work(
        lambda uow: partitioned._claim_in(uow, (parent, lease, False))
    )
    assert claimed is not None
    return LivePlan(run, parent, lease, claimed)


def work_off(config: ConnectionConfig, plan: LivePlan) -> tuple[list[str], BatchStatus, list[str]]:
    """End every partition in claim order with the current package.

    Returns the keys ended in order, the parent's aggregated status and the unfinished keys.
    """
    with JobRepository.connect(config) as repository:
        ended: list[str] = []
        claimed = plan.claimed
        while claimed is not None:
            partition, worker, *_ = claimed
            ended.append(partition.key.value)
            claimed = partitioned._end_worker(
                repository,
                partition,
                worker.id,
                BatchStatus.COMPLETED,
                (plan.parent, plan.lease, True),
            )
        aggregated, unfinished = partitioned.aggregate_plan(repository, plan.parent)
    with plan.run:
        pass
    return ended, aggregated.status, unfinished


def migrate_to(config: ConnectionConfig, version: int) -> None:
    """Run the migrator (with the older package's plan live); the first one applied is `version`."""
    assert migrator.migrate(config)[0].version == version


def run_across_upgrade(
    config: ConnectionConfig, version: int, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Run a job of the package before `version` whose step migrates between two chunks.

    Returns the versions the migrator applied while the run was live.
    """
    applied: list[int] = []
    with older_package(config, version - 1, monkeypatch) as old:
        with Job(old, "live", {}).launch() as live:
            live.step("load", partial(_migrate_between_two_chunks, config, applied))
    return applied


def _migrate_between_two_chunks(
    config: ConnectionConfig, applied: list[int], step: StepRun
) -> None:
    """A step that commits a chunk, migrates the schema (noting what applied), then another."""
    with step.chunk() as chunk:
        chunk.commit(read=1, written=1, checkpoint={"offset": 1})
    applied.extend(m.version for m in migrator.migrate(config))  # while the run is live
    with step.chunk() as chunk:
        chunk.commit(read=1, written=1, checkpoint={"offset": 2})


@dataclass
class RecoveredAcrossUpgrade:
    """`recover_across_upgrade`'s runs: the dead one, the live one, the dead one's relaunch."""

    dead: JobRun
    live: JobRun
    again: JobRun
    applied: list[int]
    resumed_from: list[object]


def recover_across_upgrade(
    config: ConnectionConfig, version: int, monkeypatch: pytest.MonkeyPatch
) -> RecoveredAcrossUpgrade:
    """Before `version` (installed up to it by the caller): job `dead` dies after a chunk of its
    step `load`, and job `live` migrates the schema between two chunks of its step and completes.
    The upgraded package then relaunches `dead`, recovering it, and reruns its step."""
    applied: list[int] = []
    with older_package_of(monkeypatch, version - 1), JobRepository.connect(config) as old:
        dead = die_after_a_chunk(old, "dead")
        with Job(old, "live", {}).launch() as live:
            live.step("load", partial(_migrate_between_two_chunks, config, applied))
    resumed_from: list[object] = []
    with JobRepository.connect(config) as repository:
        with Job(repository, "dead", {}, lease=datetime.timedelta(seconds=1)).launch() as again:
            again.step("load", lambda step: resumed_from.append(step.checkpoint))
    return RecoveredAcrossUpgrade(dead, live, again, applied, resumed_from)
