"""Partitioned steps: one step fanned out over worker processes on any number of hosts.

PostgreSQL is the only coordinator (docs/architecture.md, Partitioned steps): the parent
publishes the plan before any worker starts; each worker claims a partition in one guarded
statement, runs it as a step of its own, and ends it with the claim of the next. A dead
worker's partition is recovered FAILED (STALE_RECOVERED) and claimable again; the next worker
resumes from its checkpoint, so every row is written exactly once.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal

from pybatch import _telemetry
from pybatch._job_repository import JobRepository
from pybatch._lease_keeper import PartitionLeaseKeeper
from pybatch._transaction import TransactionSource
from pybatch.errors import (
    ConcurrentModification,
    PartitionOwnershipLost,
    PartitionStateCorrupt,
    PartitionUpdateNotAllowed,
    PartitionWorkerStale,
    StaleVersion,
)
from pybatch.values.chunks import CommittedStepState
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.flow import StartLimit
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ExitCode, NodeId, StateSchemaId, StepName
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.partitions import MAX_PARTITION_WORKERS, PartitionPlanEntry, StepPartition
from pybatch.values.records import JobExecution, JobInstance, StepExecution
from pybatch.values.state import ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

if TYPE_CHECKING:
    from pybatch._repository.partitions import Ending
    from pybatch._unit_of_work import UnitOfWork

logger = logging.getLogger("pybatch.partitioned")

#: Runs one claimed partition with its worker step, the keeper of its lease (the ETL API's
#: PartitionRun wraps them; the keeper tells it when the ownership is lost) and the worker's
#: committed state when the claim knows it (None: the first chunk reads it).
Runner = Callable[
    [StepExecution, StepPartition, PartitionLeaseKeeper, CommittedStepState | None], None
]
#: Builds a process's Runner from that process's own repository.
RunnerFactory = Callable[[JobRepository], Runner]
Partitions = Mapping[str, Mapping[str, Any]] | Iterable[str]

#: How long an idle worker or the waiting parent sleeps between polls of the plan.
POLL_SECONDS = 0.1


def recover_lost_workers(repository: JobRepository, parent_id: int) -> int:
    """Record FAILED (STALE_RECOVERED) for every worker of the plan whose lease is gone.

    The lease alone decides, whoever holds any lock. Each recovery is one guarded statement
    that confirms the loss under the partition's lock, ends the worker step FAILED and its
    partition from it, which makes the partition claimable again; one that loses a race to
    another recoverer or to the worker itself changes nothing. Returns how many it recovered.
    """
    with repository.begin(read_only=True) as uow:
        started = uow.ownership.started_partitions(parent_id)
    recovered = 0
    for partition in started:
        worker_id = partition.worker_step_execution_id
        lost = partition.id, partition.version, worker_id
        if not partition.worker_gone or not repository.run_in_unit_of_work(
            lambda uow: uow.partitions.recover_lost(*lost)  # noqa: B023 - called at once
        ):
            continue
        logger.warning(
            "pybatch: worker step %s of partition %s had no live process (%s); recorded FAILED",
            worker_id,
            partition.key,
            "lease expired" if partition.leased else "no lease",
        )
        _telemetry.recovered("STALE_RECOVERED")
        recovered += 1
    return recovered


#: A claimed partition, its worker step, the claim's owner token, and the worker's committed
#: state when the claim created it fresh (its first chunk then reads nothing).
Claimed = tuple[StepPartition, StepExecution, OwnerToken, CommittedStepState | None]
#: A worker's parent, its lease, and whether it claims with `Partitions.claim(fresh=True)`.
ClaimFrom = tuple[StepExecution, ExecutionLease, bool]


def fresh_worker_state(worker: StepExecution) -> CommittedStepState:
    """A worker's state as claim_fresh_step_partition wrote it: its row, the empty fault state."""
    return CommittedStepState(
        step_execution_id=worker.id,
        job_execution_id=worker.job_execution_id,
        status=worker.metadata.status,
        version=worker.version,
        counts=worker.metadata.counts,
        checkpoint=worker.checkpoint,
        context=worker.context,
        fault_state=FaultStateEnvelope.EMPTY,
    )


def _claim_in(uow: UnitOfWork, plan: ClaimFrom, ending: Ending | None = None) -> Claimed | None:
    """Claim the next partition of `plan` for a new owner token (after ending `ending`)."""
    parent, lease, fresh = plan
    owner = OwnerToken.generate()
    claimed = uow.partitions.claim(parent, owner, lease, fresh=fresh, ending=ending)
    if claimed is None:
        return None
    partition, worker = claimed
    return partition, worker, owner, fresh_worker_state(worker) if fresh else None


def _end_worker(
    repository: JobRepository,
    partition: StepPartition,
    worker_id: int,
    status: BatchStatus,
    claim_from: ClaimFrom | None = None,
) -> Claimed | None:
    """End the worker step and publish its result onto the partition.

    With `claim_from`, the next claim shares the end's transaction and round trip (one COMMIT).
    """

    def end(uow: UnitOfWork) -> Claimed | None:
        at = uow.clock.now()
        if status is BatchStatus.FAILED:
            failure = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(worker_id))
            transition = LifecycleTransition.failed(at, failure)
        else:
            transition = LifecycleTransition.new(status, at)
        end = (transition, ExitCode(status.value))
        if claim_from is None:
            uow.partitions.end_worker(partition.id, partition.version, worker_id, *end)
            return None
        return _claim_in(uow, claim_from, (partition.id, partition.version, worker_id, end))

    return repository.run_in_unit_of_work(end)


def work_on_plan(
    repository: JobRepository,
    parent: StepExecution,
    runner: Runner,
    *,
    poll_seconds: float = POLL_SECONDS,
    lease: ExecutionLease | None = None,
    between_partitions: Callable[[], None] = lambda: None,
) -> int:
    """Work on a published plan until no partition is left open; return how many it ran.

    `between_partitions` raises to stop claiming. A partition whose runner raises ends FAILED
    (a restart reruns it); KeyboardInterrupt or SystemExit end it STOPPED and propagate.
    """
    worker_lease = lease or ExecutionLease()
    claim_from: ClaimFrom = (parent, worker_lease, True)
    ran = 0
    while True:
        between_partitions()
        claim = repository.run_in_unit_of_work(partial(_claim_in, plan=claim_from))
        while claim is not None:  # each end claims the next partition in its transaction
            key = claim[0].key.value
            try:
                claim = _run_partition(repository, runner, claim, between_partitions, claim_from)
            except PartitionOwnershipLost as lost:
                logger.error("pybatch: %s (partition key %s)", lost, key)
                claim = None
            ran += 1
        fresh_ran_out = claim_from[2]
        if fresh_ran_out:  # no first attempt's partition is left: claim any other from now on
            claim_from = (parent, worker_lease, False)
        with repository.begin(read_only=True) as uow:
            current = uow.steps.get(parent.id)
            still_open = uow.partitions.count_open(parent.id)
        if current is None or current.status is not BatchStatus.STARTED or not still_open:
            return ran  # (a plan worked off by fresh claims needs no full claim to learn it)
        if not fresh_ran_out and not recover_lost_workers(repository, parent.id):
            time.sleep(poll_seconds)


def _run_partition(
    repository: JobRepository,
    runner: Runner,
    claimed: Claimed,
    between_partitions: Callable[[], None],
    claim_from: ClaimFrom,
) -> Claimed | None:
    """Run a claimed partition, renewing its lease; end it and claim the next in one transaction.

    The end is alone if `between_partitions` raises; PartitionOwnershipLost touches nothing.
    """
    partition, worker, owner, state = claimed
    keeper = PartitionLeaseKeeper(repository, partition.id, worker.id, owner, claim_from[1])
    keeper.start()
    try:
        try:
            runner(worker, partition, keeper, state)
        except PartitionOwnershipLost:
            raise
        except Exception:
            if keeper.lost:
                raise keeper.lost_ownership() from None
            logger.exception(
                "pybatch: partition %s failed in worker step %s", partition.key.value, worker.id
            )
            status = BatchStatus.FAILED
        except BaseException:
            try:
                _end_owned(repository, partition, worker.id, BatchStatus.STOPPED, keeper)
            except PartitionOwnershipLost:
                pass  # the partition is another worker's now; the interruption still propagates
            raise
        else:
            status = BatchStatus.COMPLETED
        try:
            between_partitions()
        except BaseException:
            _end_owned(repository, partition, worker.id, status, keeper)
            raise
        return _end_owned(repository, partition, worker.id, status, keeper, claim_from)
    finally:
        keeper.halt()


def _end_owned(
    repository: JobRepository,
    partition: StepPartition,
    worker_id: int,
    status: BatchStatus,
    keeper: PartitionLeaseKeeper,
    claim_from: ClaimFrom | None = None,
) -> Claimed | None:
    """Stop renewing, then end the worker (and claim from `claim_from` in the same transaction).

    A refused end whose renewal also fails means another process recovered the partition
    after the lease lapsed: PartitionOwnershipLost.
    """
    keeper.halt()
    if keeper.lost:
        raise keeper.lost_ownership()
    try:
        return _end_worker(repository, partition, worker_id, status, claim_from)
    except (StaleVersion, PartitionWorkerStale, PartitionUpdateNotAllowed, ConcurrentModification):
        keeper.renew_now()  # PartitionOwnershipLost when the partition is no longer ours
        raise


PLAN_FINISHED: Final = "finished"
"""`find_running_parent`'s answer when the step already completed: nothing is left to join."""


def find_running_parent(
    repository: JobRepository, key: JobInstanceKey, step_name: StepName
) -> tuple[JobInstance, JobExecution, StepExecution] | Literal["finished"] | None:
    """The running attempt of `key` and its STARTED step `step_name` with a plan, or None.

    `PLAN_FINISHED` when the latest attempt completed the step or altogether.
    """
    with repository.begin(read_only=True) as uow:
        instance = uow.instances.find(key)
        if instance is None:
            return None
        executions = uow.executions.of_instance(instance.id)
        if not executions:
            return None
        execution = executions[-1]
        if execution.status is BatchStatus.COMPLETED:
            return PLAN_FINISHED
        for step in uow.steps.of_execution(execution.id):
            if step.step_name != step_name:
                continue
            if step.status is BatchStatus.COMPLETED:
                return PLAN_FINISHED
            if (
                execution.status is BatchStatus.STARTED
                and step.status is BatchStatus.STARTED
                and uow.partitions.plan(step.id)
            ):
                return instance, execution, step
        return None


def plan_entries(partitions: Partitions, schema: StateSchemaId) -> list[PartitionPlanEntry]:
    """Plan entries from keys, or from keys mapped to their context payloads."""
    items: Iterable[tuple[str, Mapping[str, Any]]] = (
        partitions.items() if isinstance(partitions, Mapping) else [(key, {}) for key in partitions]
    )
    return [
        PartitionPlanEntry(
            key, ExecutionContext(schema, 1, dict(ctx), limits=StateLimits.PARTITION)
        )
        for key, ctx in items
    ]


def start_partitioned_step(
    repository: JobRepository,
    instance_id: int,
    execution_id: int,
    name: str,
    entries: list[PartitionPlanEntry],
    start_limit: StartLimit,
) -> tuple[bool, StepExecution]:
    """Start the parent and publish its plan (carried on a restart) in one unit of work.

    (True, the step) when an earlier attempt completed it, else (False, the STARTED parent).
    """
    node = NodeId(name)

    def start(uow: UnitOfWork) -> tuple[bool, StepExecution]:
        latest = uow.flow.latest_step(instance_id, node)
        if latest is not None and latest.step_execution.status is BatchStatus.COMPLETED:
            return True, latest.step_execution
        parent = uow.flow.create_step(execution_id, StepName(name), node, start_limit)
        at = max(uow.clock.now(), parent.created_at)
        parent = uow.steps.transition(
            parent.id, parent.version, LifecycleTransition.new(BatchStatus.STARTED, at)
        )
        source = latest.step_execution if latest is not None else None
        if source is not None and uow.partitions.plan(source.id):
            uow.partitions.restart_plan(source.id, parent.id)
        else:
            uow.partitions.create_plan(parent.id, entries, decoded=False)
        return False, parent

    return repository.run_in_unit_of_work(start)


def _local_worker(
    repository: JobRepository,
    parent: StepExecution,
    runners: RunnerFactory,
    lease: ExecutionLease | None = None,
) -> None:
    """A forked worker: its own repository, then a hard exit sparing the parent's connections.

    The parent already probed the server and verified the schema: the fork opens its pool only,
    each new connection checked for clock skew as the parent's are.
    """
    code = 1
    try:
        config, checked = repository.config, repository.transactions._check
        source = TransactionSource(config, check=checked, probe=False)
        with JobRepository(config, source, repository.clock, repository.schema_version) as own:
            work_on_plan(own, parent, runners(own), lease=lease)
        code = 0
    except BaseException:
        logger.exception("pybatch: partition worker process failed")
    finally:
        os._exit(code)


def supervise(
    repository: JobRepository,
    parent: StepExecution,
    runners: RunnerFactory,
    workers: int,
    *,
    poll_seconds: float = POLL_SECONDS,
    lease: ExecutionLease | None = None,
    between_polls: Callable[[], None] = lambda: None,
) -> None:
    """Keep `workers` forked processes, replaced when they die, working while partitions are open.

    With 0 workers the calling process works alone. When `between_polls` raises (StopRequested,
    ExecutionOwnershipLost) the workers are terminated at once: a run that lost its execution
    must not keep respawning them, and a terminated worker's uncommitted chunk rolls back.
    """
    if not 0 <= workers <= MAX_PARTITION_WORKERS:
        raise ValueError(f"workers is 0..{MAX_PARTITION_WORKERS}")
    if workers == 0:
        work_on_plan(
            repository,
            parent,
            runners(repository),
            poll_seconds=poll_seconds,
            lease=lease,
            between_partitions=between_polls,
        )
        return
    context = multiprocessing.get_context("fork")
    processes: list[Any] = []

    def spawn() -> None:
        process = context.Process(
            target=_local_worker, args=(repository, parent, runners, lease), daemon=True
        )
        process.start()
        processes.append(process)

    try:
        for _ in range(workers):
            spawn()
        while True:
            try:
                between_polls()
            except BaseException:
                for process in processes:
                    process.terminate()
                raise
            with repository.begin(read_only=True) as uow:
                still_open = uow.partitions.count_open(parent.id)
            if not still_open:  # a worker still alive is idle, polling: stop it now
                for process in processes:
                    process.terminate()
                break
            for process in [p for p in processes if not p.is_alive()]:
                process.join()
                processes.remove(process)
            if len(processes) < workers:
                recover_lost_workers(repository, parent.id)
                for _ in range(workers - len(processes)):
                    spawn()
            # Wake as soon as a worker exits (the plan may be done), else poll.
            multiprocessing.connection.wait([p.sentinel for p in processes], timeout=poll_seconds)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()


def aggregate_plan(
    repository: JobRepository,
    parent: StepExecution,
    verify_owner: Callable[[UnitOfWork], object] = lambda uow: None,
) -> tuple[StepExecution, list[str]]:
    """Aggregate the partitions onto the parent; return it and the keys not COMPLETED.

    `verify_owner` runs first, so a recovered launcher learns ExecutionOwnershipLost, not a
    refused aggregation.
    """

    def aggregate(uow: UnitOfWork) -> tuple[StepExecution, list[str]]:
        verify_owner(uow)
        current = uow.steps.get(parent.id)
        if current is None:  # the parent of a published plan is never deleted mid-run
            raise PartitionStateCorrupt()
        at = max(uow.clock.now(), current.updated_at)
        ended = uow.partitions.aggregate(parent.id, current.version, at)
        if ended.status is BatchStatus.COMPLETED:  # the most severe status: all completed
            return ended, []
        plan = uow.partitions.plan(parent.id)
        return ended, [p.key.value for p in plan if p.status is not BatchStatus.COMPLETED]

    return repository.run_in_unit_of_work(aggregate)
