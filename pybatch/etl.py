"""The ETL-facing API: launch or restart a job, run steps, commit chunks with checkpoints.

Written for script authors rather than mirroring the repository's ports::

    job = Job(repository, "load_orders", {"business_date": "2026-11-30"})
    with job.launch() as run:
        run.step("load", load_orders)          # load_orders(step: StepRun) -> None

    def load_orders(step: StepRun) -> None:
        offset = step.checkpoint.get("offset", 0)
        for rows in read_batches(start=offset):
            with step.chunk() as chunk:
                chunk.copy("COPY orders (id, amount) FROM STDIN", rows)
                offset += len(rows)
                chunk.commit(read=len(rows), written=len(rows), checkpoint={"offset": offset})

A step that raises marks the step and the job FAILED; running the script again restarts
the instance: completed steps are skipped and the failed step resumes from its last
committed checkpoint. A run owns its execution through a lease that a background thread
renews (pybatch/lease_keeper.py); a later launch that finds an unresolved execution whose
lease ran out (its process died) records an audited recovery decision (FAILED, reason
OWNER_LOST) and restarts. A stop request ends the run STOPPED at its next chunk boundary
(docs/etl-guide.md). Composition only: every statement is run by the repository, chunk and
recovery modules.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import attrs
import psycopg

from pybatch.chunks import (
    ChunkContext,
    ChunkCounts,
    ChunkTransaction,
    ChunkTransactionManager,
    CommittedStepState,
    FaultProgress,
)
from pybatch.codecs._primitives import canonical_json, sha256
from pybatch.errors import (
    ExecutionAlreadyActive,
    ExecutionOwnershipLost,
    NotCommitted,
    PyBatchError,
    StopRequested,
)
from pybatch.lease_keeper import LeaseKeeper
from pybatch.repository import JobRepository
from pybatch.repository.ownership import legacy_liveness_lock_is_free
from pybatch.unit_of_work import UnitOfWork
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import StartLimit
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    ActorRef,
    ExitCode,
    JobName,
    NodeId,
    OperationId,
    ReasonCode,
    StateSchemaId,
    StepName,
)
from pybatch.values.operator import (
    OperatorAction,
    OperatorOutcomeClass,
    OperatorRecordDraft,
    RecoveryArguments,
    RequestDigest,
    RequestTarget,
)
from pybatch.values.ownership import ExecutionLease, LeaseState, OwnerToken
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import JobExecution, JobInstance, StepExecution
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.state import Checkpoint, ExecutionContext, StateLimits
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

__all__ = ["Chunk", "Job", "JobRun", "StepRun"]

logger = logging.getLogger("pybatch.etl")

#: The schema id of checkpoints and contexts written through this API.
ETL_STATE_SCHEMA = StateSchemaId("pybatch.etl.v1")
_RECOVERY_REFERENCE = "pybatch.etl"
_RECOVERY_REASON = "OWNER_LOST"


def _state(cls: type[Checkpoint] | type[ExecutionContext], payload: Mapping[str, Any]) -> Any:
    return cls(ETL_STATE_SCHEMA, 1, dict(payload), limits=StateLimits.STEP)


class Chunk:
    """One chunk of a step: your statements and the step's progress commit together."""

    def __init__(self, step: StepRun, transaction: ChunkTransaction) -> None:
        self._step = step
        self._transaction = transaction
        self._committed = False

    def __enter__(self) -> Chunk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._transaction.rollback()

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The chunk's psycopg connection, for statements of your own."""
        return self._transaction.connection

    def execute(self, query: Any, params: Sequence[Any] | Mapping[str, Any] | None = None) -> int:
        """Run one statement in the chunk; return its row count."""
        return self._transaction.execute(query, params)

    def executemany(
        self, query: Any, rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]]
    ) -> int:
        """Run one statement per row, pipelined."""
        return self._transaction.executemany(query, rows)

    def copy(self, statement: Any, rows: Iterable[Sequence[Any]]) -> int:
        """COPY rows in through `statement` (`COPY t (a, b) FROM STDIN`)."""
        return self._transaction.copy(statement, iter(rows))

    def commit(
        self,
        *,
        read: int,
        written: int,
        checkpoint: Mapping[str, Any],
        processed: int | None = None,
        filtered: int = 0,
        context: Mapping[str, Any] | None = None,
        skips: FaultProgress | None = None,
    ) -> None:
        """COMMIT the chunk with the step's new checkpoint; the step's counters advance.

        Raises:
            NotCommitted: nothing of the chunk is durable (a statement failed, or the step
                was changed by someone else); the step then fails.
            ChunkCommitOutcomeUnknown: the acknowledgement was lost; the step fails and a
                restart resumes from whatever is durable.
        """
        counts = ChunkCounts(
            read=read,
            processed=read if processed is None else processed,
            written=written,
            filtered=filtered,
        )
        try:
            state = self._transaction.commit(
                counts,
                skips,
                checkpoint=_state(Checkpoint, checkpoint),
                context=None if context is None else _state(ExecutionContext, context),
            )
        except NotCommitted:
            self._step.run._raise_if_ownership_lost()
            raise
        self._step._committed(state)
        self._committed = True


class StepRun:
    """A running step: its committed checkpoint and a way to open chunks."""

    def __init__(self, run: JobRun, step: StepExecution) -> None:
        self.run = run
        self.execution = step
        self.state: CommittedStepState | None = None
        self._manager = ChunkTransactionManager(run.repository)
        self._context = ChunkContext(step.id, step.job_execution_id)

    @property
    def name(self) -> str:
        """The step name."""
        return self.execution.step_name.value

    @property
    def checkpoint(self) -> dict[str, Any]:
        """The last committed checkpoint payload ({} on a fresh step); resume from here."""
        source = self.state.checkpoint if self.state else self.execution.checkpoint
        return dict(source.payload)

    @property
    def context(self) -> dict[str, Any]:
        """The last committed execution context payload."""
        source = self.state.context if self.state else self.execution.context
        return dict(source.payload)

    @property
    def read_count(self) -> int:
        """Items read so far, across restarts (counters carry over)."""
        return self.state.counts.read if self.state else self.execution.metadata.counts.read

    @property
    def written_count(self) -> int:
        """Items written so far, across restarts."""
        counts = self.state.counts if self.state else self.execution.metadata.counts
        return counts.written

    @property
    def commit_count(self) -> int:
        """Chunks committed so far, across restarts."""
        counts = self.state.counts if self.state else self.execution.metadata.counts
        return counts.committed

    @property
    def stop_requested(self) -> bool:
        """Whether an operator asked the run to stop (polled every lease renewal).

        A long chunk may check it to end early; `chunk()` raises StopRequested anyway.
        """
        return self.run._keeper is not None and self.run._keeper.stop_requested

    def chunk(self) -> Chunk:
        """Open a chunk transaction on the step (use it in a `with` block).

        Raises:
            StopRequested: a stop was requested; the step and the job end STOPPED, and
                the run's `with` block ends quietly (`JobRun.stopped`).
            ExecutionOwnershipLost: this process no longer owns the execution.
        """
        self.run._at_chunk_boundary()
        if self.state is None:
            return Chunk(self, self._manager.begin_for(self._context))
        return Chunk(self, self._manager.begin_after(self.state))

    def _committed(self, state: CommittedStepState) -> None:
        self.state = state


@attrs.frozen
class StepOutcome:
    """What `JobRun.step` did: ran the step, or skipped one completed earlier."""

    name: str
    skipped: bool
    step: StepExecution


class JobRun:
    """One launched attempt of a job; a context manager that records how it ended."""

    def __init__(
        self,
        repository: JobRepository,
        instance: JobInstance,
        execution: JobExecution,
        owner: OwnerToken,
        lease: ExecutionLease,
    ) -> None:
        self.repository = repository
        self.instance = instance
        self.execution = execution
        self.owner = owner
        self.stopped = False
        self._keeper: LeaseKeeper | None = LeaseKeeper(repository, execution.id, owner, lease)
        self._keeper.start()

    def __repr__(self) -> str:
        return (
            f"JobRun(job={self.instance.job_name.value!r}, instance={self.instance.id}, "
            f"execution={self.execution.id}, attempt={self.execution.attempt})"
        )

    @property
    def attempt(self) -> int:
        """1 for the first launch, 2 and up for restarts."""
        return self.execution.attempt

    @property
    def restarted(self) -> bool:
        """Whether this attempt restarts an earlier one."""
        return self.execution.restart_of_execution_id is not None

    def __enter__(self) -> JobRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        lost = self._keeper is not None and self._keeper.lost
        self._halt_keeper()
        if lost or isinstance(exc, ExecutionOwnershipLost):
            # Another process recovered this execution: record nothing, touch nothing.
            logger.error(
                "pybatch: job execution %s was recovered by another process; this run "
                "stops without recording how it ended",
                self.execution.id,
            )
            if exc is None:
                raise ExecutionOwnershipLost(id=self.execution.id)
            return False
        if isinstance(exc, StopRequested):
            self._finish(BatchStatus.STOPPED, ExitCode.STOPPED)
            self.stopped = True
            logger.info("pybatch: job execution %s stopped on request", self.execution.id)
            return True
        try:
            if exc is None:
                self._finish(BatchStatus.COMPLETED, ExitCode.COMPLETED)
            elif isinstance(exc, Exception):
                self._finish(BatchStatus.FAILED, ExitCode.FAILED)
            else:  # KeyboardInterrupt, SystemExit: stopped, and restartable
                self._finish(BatchStatus.STOPPED, ExitCode.STOPPED)
        except PyBatchError:
            if exc is None:
                raise
            logger.exception(
                "pybatch: could not record how job execution %s ended", self.execution.id
            )
        return False

    def _finish(self, status: BatchStatus, exit_code: ExitCode) -> None:
        def work(uow: UnitOfWork) -> JobExecution:
            current = uow.verify_execution_owner(self.execution.id, self.owner)
            if current.status is BatchStatus.STOPPING and status is BatchStatus.COMPLETED:
                ended_as = BatchStatus.STOPPED  # a stop was observed: STOPPING ends STOPPED
            else:
                ended_as = status
            at = max(uow.clock.now(), current.updated_at)
            if ended_as is BatchStatus.FAILED:
                transition = LifecycleTransition.failed(
                    at, FailureSummary(FailureCategory.USER_COMPONENT, FailureId(self.execution.id))
                )
            else:
                transition = LifecycleTransition.new(ended_as, at)
            ended = uow.transition_job_execution(current.id, current.version, transition)
            code = ExitCode.STOPPED if ended_as is BatchStatus.STOPPED else exit_code
            return uow.enrich_job_exit_status(ended.id, ended.version, code)

        self.execution = self.repository.run_in_unit_of_work(work)

    def _halt_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.halt()

    def _release_liveness(self) -> None:
        """Stop renewing the lease, as a process that died would (tests simulate crashes)."""
        self._halt_keeper()

    def _raise_if_ownership_lost(self) -> None:
        """After a refused commit: if the cause is a lost ownership, say so."""
        keeper = self._keeper
        if keeper is None:
            return
        try:
            keeper.renew_now()
        except ExecutionOwnershipLost:
            raise
        except PyBatchError:
            return

    def _at_chunk_boundary(self) -> None:
        """Raise ExecutionOwnershipLost or StopRequested before another chunk begins."""
        keeper = self._keeper
        if keeper is None:
            return
        if keeper.lost:
            raise ExecutionOwnershipLost(id=self.execution.id)
        if keeper.stop_requested:
            raise StopRequested(id=self.execution.id)

    def step(
        self,
        name: str,
        work: Callable[[StepRun], None],
        *,
        start_limit: int | None = None,
    ) -> StepOutcome:
        """Run `work` as step `name`, unless an earlier attempt completed it.

        The step is created with its durable state copied from the newest earlier attempt
        of the same step (counters, checkpoint, context), marked STARTED, and ended
        COMPLETED, or FAILED if `work` raises (the exception propagates).
        """
        step_name, node = StepName(name), NodeId(name)
        limit = StartLimit.unrestricted() if start_limit is None else StartLimit(start_limit)

        def start(uow: UnitOfWork) -> tuple[bool, StepExecution]:
            """(True, the completed step) to skip, or (False, the new STARTED step)."""
            uow.verify_execution_owner(self.execution.id, self.owner)
            latest = uow.latest_flow_step(self.instance.id, node)
            if latest is not None and latest.status is BatchStatus.COMPLETED:
                return True, latest
            step = uow.create_flow_step_execution(self.execution.id, step_name, node, limit)
            at = max(uow.clock.now(), step.created_at)
            return False, uow.transition_step_execution(
                step.id, step.version, LifecycleTransition.new(BatchStatus.STARTED, at)
            )

        self._at_chunk_boundary()
        skipped, started = self.repository.run_in_unit_of_work(start)
        if skipped:
            logger.info("pybatch: step %s completed in an earlier attempt; skipped", name)
            return StepOutcome(name=name, skipped=True, step=started)
        step_run = StepRun(self, started)
        try:
            work(step_run)
        except ExecutionOwnershipLost:
            raise  # the step belongs to the recovered execution now: leave it alone
        except BaseException as error:
            stopped = isinstance(error, StopRequested) or not isinstance(error, Exception)
            self._end_step(started.id, BatchStatus.STOPPED if stopped else BatchStatus.FAILED)
            raise
        return StepOutcome(
            name=name, skipped=False, step=self._end_step(started.id, BatchStatus.COMPLETED)
        )

    def _end_step(self, step_id: int, status: BatchStatus) -> StepExecution:
        exit_code = {
            BatchStatus.COMPLETED: ExitCode.COMPLETED,
            BatchStatus.FAILED: ExitCode.FAILED,
            BatchStatus.STOPPED: ExitCode.STOPPED,
        }[status]

        def end(uow: UnitOfWork) -> StepExecution:
            uow.verify_execution_owner(self.execution.id, self.owner)
            current = uow.get_step_execution(step_id)
            if current is None:
                raise ExecutionOwnershipLost(id=self.execution.id)
            at = max(uow.clock.now(), current.updated_at)
            if status is BatchStatus.FAILED:
                transition = LifecycleTransition.failed(
                    at, FailureSummary(FailureCategory.USER_COMPONENT, FailureId(step_id))
                )
            else:
                transition = LifecycleTransition.new(status, at)
            ended = uow.transition_step_execution(step_id, current.version, transition)
            return uow.enrich_step_exit_status(step_id, ended.version, exit_code)

        return self.repository.run_in_unit_of_work(end)


class Job:
    """A job by name and identifying parameters: what `launch` starts or restarts.

    `lease` (1 s to 1 h, default 30 s) bounds how long a crashed run blocks its restart:
    a run renews its lease every third of it, and a launch recovers an unresolved attempt
    only once that attempt's lease has run out on the database clock.
    """

    def __init__(
        self,
        repository: JobRepository,
        name: str,
        parameters: Mapping[str, str | int | bool] | JobParameters | None = None,
        *,
        definition: DefinitionIdentity | None = None,
        recover_orphans: bool = True,
        lease: _dt.timedelta | ExecutionLease | None = None,
    ) -> None:
        self.repository = repository
        params = (
            parameters
            if isinstance(parameters, JobParameters)
            else JobParameters.of(dict(parameters or {}))
        )
        self.key = JobInstanceKey(JobName(name), params)
        self.definition = definition or DefinitionIdentity.legacy()
        self.recover_orphans = recover_orphans
        if lease is None:
            self.lease = ExecutionLease()
        elif isinstance(lease, ExecutionLease):
            self.lease = lease
        else:
            self.lease = ExecutionLease(lease)

    def launch(self) -> JobRun:
        """Start the first attempt, or restart after FAILED or STOPPED, and mark it STARTED.

        Raises:
            CompletedInstance, AbandonedInstance: the instance never runs again.
            ExecutionAlreadyActive: another live process runs this instance (its lease is
                fresh), or the unresolved attempt is UNKNOWN and needs explicit recovery
                with reason UNKNOWN_EFFECT (`pybatch recover`).
        """
        owner = OwnerToken.generate()
        execution_instance = self.repository.run_in_unit_of_work(
            lambda uow: self._launch(uow, owner)
        )
        instance, started = execution_instance
        logger.info(
            "pybatch: job %s instance %s attempt %s started (execution %s)",
            instance.job_name.value,
            instance.id,
            started.attempt,
            started.id,
        )
        return JobRun(self.repository, instance, started, owner, self.lease)

    def _launch(self, uow: UnitOfWork, owner: OwnerToken) -> tuple[JobInstance, JobExecution]:
        instance = uow.select_or_create_job_instance(self.key).instance
        try:
            execution = uow.create_job_execution_with_definition(instance.id, self.definition)
        except ExecutionAlreadyActive as active:
            if not self.recover_orphans:
                raise
            orphan, lease = uow.lock_execution_ownership(active.execution_id)
            if not self._is_orphaned(orphan, lease):
                raise
            _recover_orphan(uow, orphan, lease)
            execution = uow.create_job_execution_with_definition(instance.id, self.definition)
        at = max(uow.clock.now(), execution.created_at)
        claimed = uow.claim_execution_owner(execution.id, execution.version, owner, at, self.lease)
        started = uow.transition_job_execution(
            claimed.id, claimed.version, LifecycleTransition.new(BatchStatus.STARTED, at)
        )
        return instance, started

    def _is_orphaned(self, execution: JobExecution, lease: LeaseState) -> bool:
        """True when the unresolved attempt's owner is gone and it may be recovered here.

        UNKNOWN never is (its commit may have happened: only an explicit recovery with
        reason UNKNOWN_EFFECT resolves it). A leased attempt is orphaned once its lease
        ran out on the database clock. An attempt without a lease was started before
        leases existed; its runner holds the session advisory lock, which is probed.
        """
        if not execution.status.is_active:
            return False
        if lease.has_lease:
            return lease.lease_expired
        return _legacy_lock_is_free(self.repository, execution.id)


def _legacy_lock_is_free(repository: JobRepository, execution_id: int) -> bool:
    """Probe the advisory lock of a run started before leases (schema version 1)."""
    conn = repository.dedicated_connection()
    try:
        return legacy_liveness_lock_is_free(repository.statements, conn, execution_id)
    except psycopg.Error:
        return False
    finally:
        conn.close()


def _recover_orphan(uow: UnitOfWork, orphan: JobExecution, lease: LeaseState) -> None:
    """Record an audited FAILED decision for an orphaned execution and fail its open steps.

    Audited twice, like an operator's recovery: the recovery decision, and an operator
    request (action RECOVER, actor pybatch.etl) whose operation id names the execution
    and the version recovered, so the same recovery is never recorded twice.
    """
    observation = "LEASE_EXPIRED" if lease.has_lease else "OWNER_LOST"
    evidence = sha256(
        canonical_json(
            {
                "execution_id": orphan.id,
                "lease_expires_at": None
                if lease.lease_expires_at is None
                else lease.lease_expires_at.isoformat(),
                "observation": observation,
                "status": orphan.status.value,
                "updated_at": orphan.updated_at.isoformat(),
                "version": orphan.version,
            }
        )
    )
    failure = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(orphan.id))
    for step in uow.step_executions(orphan.id):
        if step.status.is_active:
            at = max(uow.clock.now(), step.updated_at)
            uow.transition_step_execution(
                step.id,
                step.version,
                LifecycleTransition.failed(
                    at, FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(step.id))
                ),
            )
    request = RecoveryRequest.mark_failed(
        orphan.version, _RECOVERY_REASON, _RECOVERY_REFERENCE, evidence, failure
    )
    result = uow.recover_job_execution(orphan.id, request)
    operation = OperationId(f"pybatch.etl:recover:{orphan.id}:{orphan.version}")
    reason = ReasonCode(_RECOVERY_REASON)
    uow.append_operator_request(
        OperatorRecordDraft(
            action=OperatorAction.RECOVER,
            operation_id=operation,
            actor=ActorRef(_RECOVERY_REFERENCE),
            reason=reason,
            digest=RequestDigest.compute(
                OperatorAction.RECOVER,
                RequestTarget.execution(orphan.id),
                expected_version=orphan.version,
                reason=reason,
                arguments=RecoveryArguments(request=request, unknown_commit=False),
            ),
            job_instance_id=orphan.job_instance_id,
            job_execution_id=orphan.id,
            observed_version=orphan.version,
            prior_status=orphan.status,
            result_status=result.execution.status,
            outcome=OperatorOutcomeClass.APPLIED,
            rejection=None,
            requested_at=uow.clock.now(),
        )
    )
    logger.warning(
        "pybatch: job execution %s had no live owner (%s); recorded FAILED (OWNER_LOST)",
        orphan.id,
        observation.lower().replace("_", " "),
    )
