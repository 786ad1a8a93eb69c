"""The unit of work: one leased connection, one READ COMMITTED transaction.

See docs/contract.md, Unit of work.

Each repository operation runs under its own savepoint, so a failed operation leaves
nothing staged and the unit of work stays usable. COMMIT outcomes follow docs/schema.md 5
through the transaction primitive (`pybatch/_transaction.py`): a transaction the server
already failed raises TransactionAborted, a lost acknowledgement raises
CommitOutcomeUnknown, and neither is ever reported as success.

Statements: transaction.sql get_transaction_settings; each operation's own (its docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType

import psycopg
from psycopg.pq import TransactionStatus

from pybatch import _sqlstate
from pybatch._statements import Connection, Statements
from pybatch._transaction import CommitErrors, Lease
from pybatch.capability_defaults import CapabilityDefaults
from pybatch.clock import Clock
from pybatch.codecs._primitives import DecodeError
from pybatch.errors import (
    CommitOutcomeUnknown,
    DefinitionUpgradeConflict,
    DomainError,
    DuplicatePartitionKey,
    PartitionPlanExists,
    PyBatchError,
    RepositoryDomainError,
    RetryableConflict,
    TransactionAborted,
    Unavailable,
    UnitOfWorkClosed,
)
from pybatch.repository import (
    definitions,
    executions,
    flow,
    holds,
    instances,
    operator_requests,
    ownership,
    partitions,
    recovery,
    retention,
    steps,
    stop_requests,
)
from pybatch.values.definitions import DefinitionIdentity, DefinitionUpgrade
from pybatch.values.flow import (
    FlowDecision,
    FlowDecisionRequest,
    FlowStepState,
    FlowTransitionKind,
    StartLimit,
)
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import (
    ActorRef,
    ExitCode,
    JobName,
    NodeId,
    OperationId,
    ReasonCode,
    StepName,
)
from pybatch.values.operator import (
    OperatorAction,
    OperatorRecord,
    OperatorRecordDraft,
    automatic_recovery_record,
)
from pybatch.values.ownership import ExecutionControl, ExecutionLease, LeaseState, OwnerToken
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.partitions import PartitionPlanEntry, PlanProgress, StepPartition
from pybatch.values.records import (
    JobExecution,
    JobInstance,
    JobInstanceSelection,
    StepExecution,
)
from pybatch.values.recovery import (
    RecoveryDecision,
    RecoveryRequest,
    RecoveryResult,
)
from pybatch.values.retention import (
    PurgePlan,
    PurgePlanRequest,
    PurgeSurvey,
    RetentionAction,
    RetentionHold,
    RetentionRecord,
    RetentionRecordDraft,
)
from pybatch.values.status import BatchStatus

__all__ = ["UnitOfWork", "UnitOfWorkBase"]

Overrides = Mapping[str, Callable[[], PyBatchError]]

#: How a unit of work reports a COMMIT that did not make its work durable.
_COMMIT_ERRORS = CommitErrors(
    aborted=TransactionAborted,
    refused=_sqlstate.translate,
    unknown=CommitOutcomeUnknown,
)


@contextmanager
def _rolled_back_on_error(conn: Connection) -> Iterator[None]:
    """Roll the whole (just opened) transaction back if the block raises."""
    try:
        yield
    except BaseException:
        if not conn.broken and not conn.closed:
            try:
                conn.rollback()
            except psycopg.Error:
                pass  # the error being raised already says the connection failed
        raise


class UnitOfWorkBase(CapabilityDefaults):
    """Transaction mechanics shared by every unit of work; operations live in the subclass.

    Optional operations default to UnsupportedCapability (pybatch/capability_defaults.py).
    """

    def __init__(self, lease: Lease, statements: Statements, clock: Clock) -> None:
        self._lease = lease
        self._poisoned: PyBatchError | None = None
        self.statements = statements
        self.clock = clock
        #: Parents whose partition plan was created or carried here: not yet published.
        self.unpublished_plans: set[int] = set()

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> UnitOfWorkBase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._lease.is_open:
            return
        try:
            self.rollback()
        except PyBatchError:
            if exc is None:
                raise

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """Whether statements can still run (not committed, rolled back or closed)."""
        return self._lease.is_open

    @property
    def connection(self) -> Connection:
        """The transaction's connection, for business statements that commit with it.

        Business statements run outside pybatch's savepoints: one that fails leaves the
        transaction failed, and `commit` then raises TransactionAborted.
        """
        return self._live_connection()

    def _live_connection(self) -> Connection:
        if self._poisoned is not None:
            raise self._poisoned
        conn = self._lease.connection
        if conn is None:
            raise UnitOfWorkClosed()
        return conn

    @contextmanager
    def operation(self, *, overrides: Overrides | None = None) -> Iterator[Connection]:
        """Run one repository operation under its own savepoint, mapping driver errors."""
        conn = self._live_connection()
        try:
            if conn.info.transaction_status == TransactionStatus.IDLE:
                # Nothing is staged yet: the operation's first statement opens the
                # transaction (no BEGIN round trip), and on failure rolling all of it back
                # is exactly what rolling back to a savepoint would do.
                with _rolled_back_on_error(conn):
                    yield conn
            else:
                with conn.transaction():
                    yield conn
        except DomainError as error:
            raise RepositoryDomainError(error=error) from error
        except PyBatchError as error:
            if isinstance(error, RetryableConflict | Unavailable) and conn.broken:
                self._poisoned = error
            raise
        except DecodeError:
            raise Unavailable() from None
        except psycopg.Error as error:
            mapped = _sqlstate.translate(error, overrides=overrides)
            if isinstance(mapped, RetryableConflict) or _sqlstate.is_connection_loss(error, conn):
                # After a conflict abort or a lost connection, only rollback is allowed.
                self._poisoned = mapped
            raise mapped from None

    def transaction_settings(self) -> dict[str, str]:
        """The isolation level, timeouts and time zone in force (diagnostics)."""
        with self.operation() as conn:
            row = self.statements.get_transaction_settings.one(conn)
        return {} if row is None else {str(key): str(value) for key, value in row.items()}

    # ------------------------------------------------------------------ outcome

    def commit(self) -> None:
        """COMMIT; raise rather than report success for anything but a durable commit."""
        if self._poisoned is not None:
            raise self._poisoned
        self._live_connection()
        self._lease.commit(_COMMIT_ERRORS)

    def rollback(self) -> None:
        """ROLLBACK everything staged; a second call is a no-op.

        Raises:
            Unavailable: the rollback failed and the connection was discarded.
        """
        self._poisoned = None
        if not self._lease.rollback():
            raise Unavailable()


class UnitOfWork(UnitOfWorkBase):
    """A unit of work with every repository operation; each is atomic.

    Each method runs its capability function (pybatch/repository/<capability>.py, which
    runs queries/<capability>.sql) under its own savepoint.
    """

    def __enter__(self) -> UnitOfWork:
        return self

    # ------------------------------------------------------------------ definitions

    def register_definition_upgrade(self, job_name: JobName, upgrade: DefinitionUpgrade) -> None:
        """Register a direct definition upgrade edge.

        See docs/contract.md, Definitions and upgrades.
        """
        conflict = {
            "definition_upgrade_target_key_unique": lambda: DefinitionUpgradeConflict(
                job_name=job_name.value
            )
        }
        with self.operation(overrides=conflict) as conn:
            definitions.register_definition_upgrade(
                self.statements, conn, self.clock, job_name, upgrade
            )

    # ------------------------------------------------------------------ instances

    def select_or_create_job_instance(self, key: JobInstanceKey) -> JobInstanceSelection:
        """The instance of `key`: Created, or Existing when it was already there."""
        with self.operation() as conn:
            return instances.select_or_create_job_instance(self.statements, conn, self.clock, key)

    def find_job_instance(self, key: JobInstanceKey) -> JobInstance | None:
        """The instance of `key`, or None (docs/contract.md, Job instances)."""
        with self.operation() as conn:
            return instances.find_job_instance(self.statements, conn, key)

    def get_job_instance(self, instance_id: int) -> JobInstance | None:
        """The instance with this id, or None (docs/contract.md, Job instances)."""
        with self.operation() as conn:
            return instances.get_job_instance(self.statements, conn, instance_id)

    # ------------------------------------------------------------------ job executions

    def create_job_execution(self, instance_id: int) -> JobExecution:
        """Launch or restart `instance_id` under the legacy definition."""
        return self.create_job_execution_with_definition(instance_id, DefinitionIdentity.legacy())

    def create_job_execution_with_definition(
        self, instance_id: int, definition: DefinitionIdentity
    ) -> JobExecution:
        """Launch or restart `instance_id` under `definition`."""
        with self.operation() as conn:
            return executions.create_job_execution(
                self.statements, conn, self.clock, instance_id, definition
            )

    def transition_job_execution(
        self, execution_id: int, expected_version: int, transition: LifecycleTransition
    ) -> JobExecution:
        """Apply a lifecycle transition with a version compare-and-swap."""
        with self.operation() as conn:
            return executions.transition_job_execution(
                self.statements, conn, execution_id, expected_version, transition
            )

    def enrich_job_exit_status(
        self, execution_id: int, expected_version: int, exit_status: ExitCode
    ) -> JobExecution:
        """Replace the exit status of a job execution."""
        with self.operation() as conn:
            return executions.enrich_job_exit_status(
                self.statements, conn, self.clock, execution_id, expected_version, exit_status
            )

    def get_job_execution(self, execution_id: int) -> JobExecution | None:
        """One job execution, or None (docs/contract.md, Reads)."""
        with self.operation() as conn:
            return executions.get_job_execution(self.statements, conn, execution_id)

    def job_executions(self, instance_id: int) -> list[JobExecution]:
        """Every attempt of an instance in attempt order (docs/contract.md, Reads)."""
        with self.operation() as conn:
            return executions.job_executions(self.statements, conn, instance_id)

    def recover_job_execution(self, execution_id: int, request: RecoveryRequest) -> RecoveryResult:
        """Mark an unresolved execution FAILED or ABANDONED with an audit decision."""
        with self.operation() as conn:
            return recovery.recover_job_execution(
                self.statements, conn, self.clock, execution_id, request
            )

    def recover_orphaned_execution(
        self, execution_id: int, *, audited: bool = True
    ) -> RecoveryResult:
        """Record FAILED (OWNER_LOST) for an execution whose owner is proved gone.

        The caller proves it first (an expired lease, or a free legacy liveness lock); the
        open steps fail with it. With `audited` it is also recorded like an operator's
        request (RECOVER by pybatch.etl), in the same savepoint. A damaged audit chain never
        blocks it: the decision and the request are then kept unlinked, an error line names
        them and `pybatch audit verify` reports the chain broken.
        """
        with self.operation() as conn:
            result = recovery.recover_orphaned_execution(
                self.statements, conn, self.clock, execution_id
            )
            if audited:
                operator_requests.append_operator_request(
                    self.statements,
                    conn,
                    automatic_recovery_record(result, self.clock.now()),
                    tolerate_chain_errors=True,
                )
            return result

    def recovery_decision(self, execution_id: int) -> RecoveryDecision | None:
        """The latest recovery decision of an execution, or None (docs/contract.md, Recovery)."""
        with self.operation() as conn:
            return recovery.recovery_decision(self.statements, conn, execution_id)

    # ------------------------------------------------------------------ operator requests

    def find_operator_request(
        self, action: OperatorAction, operation_id: OperationId
    ) -> OperatorRecord | None:
        """The recorded operator request of (action, operation id), or None."""
        with self.operation() as conn:
            return operator_requests.find_operator_request(
                self.statements, conn, action, operation_id
            )

    def append_operator_request(self, draft: OperatorRecordDraft) -> OperatorRecord:
        """Append an operator audit row; a recorded key is ConcurrentModification.

        Append it in the unit of work of the effect it audits, so both commit or neither.
        """
        with self.operation() as conn:
            return operator_requests.append_operator_request(self.statements, conn, draft)

    # ------------------------------------------------------------------ stop requests, ownership

    def request_execution_stop(
        self, execution_id: int, expected_version: int, actor: ActorRef, requested_at: datetime
    ) -> JobExecution:
        """Record a durable stop request; no transition, version unchanged."""
        with self.operation() as conn:
            return stop_requests.request_execution_stop(
                self.statements, conn, execution_id, expected_version, actor, requested_at
            )

    def claim_execution_owner(
        self,
        execution_id: int,
        expected_version: int,
        owner: OwnerToken,
        claimed_at: datetime,
        lease: ExecutionLease | None = None,
    ) -> JobExecution:
        """Record the owner token of a STARTING execution and start its lease."""
        with self.operation() as conn:
            return ownership.claim_execution_owner(
                self.statements,
                conn,
                execution_id,
                expected_version,
                owner,
                claimed_at,
                lease or ExecutionLease(),
            )

    def observe_execution_control(
        self, execution_id: int, owner: OwnerToken, observed_at: datetime
    ) -> ExecutionControl:
        """Ownership and stop flags; the owner's observation of a stop moves it to STOPPING."""
        with self.operation() as conn:
            return ownership.observe_execution_control(
                self.statements, conn, execution_id, owner, observed_at
            )

    def renew_execution_lease(
        self, execution_id: int, owner: OwnerToken, lease: ExecutionLease
    ) -> bool:
        """Extend the owner's lease; True when a stop is requested (ExecutionOwnershipLost)."""
        with self.operation() as conn:
            return ownership.renew_execution_lease(
                self.statements, conn, execution_id, owner, lease
            )

    def verify_execution_owner(self, execution_id: int, owner: OwnerToken) -> JobExecution:
        """Lock the execution and confirm `owner` still runs it (ExecutionOwnershipLost)."""
        with self.operation() as conn:
            return ownership.verify_execution_owner(self.statements, conn, execution_id, owner)

    def lock_execution_ownership(self, execution_id: int) -> tuple[JobExecution, LeaseState]:
        """Lock an execution and read its ownership evidence (token, lease, stop flag)."""
        with self.operation() as conn:
            return ownership.lock_execution_ownership(self.statements, conn, execution_id)

    # ------------------------------------------------------------------ holds and retention

    def job_instance_hold(self, instance_id: int) -> RetentionHold | None:
        """The instance's retention hold, or None (docs/contract.md, Holds)."""
        with self.operation() as conn:
            return holds.job_instance_hold(self.statements, conn, instance_id)

    def place_instance_hold(
        self, instance_id: int, actor: ActorRef, reason: ReasonCode, placed_at: datetime
    ) -> RetentionHold:
        """Place (or replace) the instance's hold (docs/contract.md, Holds)."""
        with self.operation() as conn:
            return holds.place_instance_hold(
                self.statements, conn, instance_id, actor, reason, placed_at
            )

    def release_instance_hold(self, instance_id: int) -> RetentionHold | None:
        """Clear the instance's hold; return the previous one (docs/contract.md, Holds)."""
        with self.operation() as conn:
            return holds.release_instance_hold(self.statements, conn, instance_id)

    def find_retention_action(
        self, action: RetentionAction, operation_id: OperationId
    ) -> RetentionRecord | None:
        """The recorded retention request of (action, operation id), or None."""
        with self.operation() as conn:
            return retention.find_retention_action(self.statements, conn, action, operation_id)

    def append_retention_action(self, draft: RetentionRecordDraft) -> RetentionRecord:
        """Append a retention audit row; a recorded key is ConcurrentModification."""
        with self.operation() as conn:
            return retention.append_retention_action(self.statements, conn, draft)

    def purge_survey(
        self, request: PurgePlanRequest, after: tuple[datetime, int] | None = None
    ) -> PurgeSurvey:
        """The next batch of whole instance histories to purge; read-only."""
        with self.operation() as conn:
            return retention.purge_survey(self.statements, conn, request, after)

    def apply_purge(self, plan: PurgePlan) -> retention.PurgeResult:
        """Delete exactly the plan's histories, or nothing (RetentionPlanStale)."""
        with self.operation() as conn:
            return retention.apply_purge(self.statements, conn, plan, self.clock.now())

    def mark_purged_audit_links(
        self, deleted: retention.PurgedAuditRecords, retention_action_id: int
    ) -> int:
        """Mark the audit-chain links whose records a purge deleted."""
        with self.operation() as conn:
            return retention.mark_purged_audit_links(
                self.statements, conn, deleted, retention_action_id
            )

    # ------------------------------------------------------------------ step executions

    def create_step_execution(self, job_execution_id: int, step_name: StepName) -> StepExecution:
        """Create a step, copying its source's state in a restart attempt."""
        duplicate = steps.duplicate_step_overrides(job_execution_id, step_name, step_name.value)
        with self.operation(overrides=duplicate) as conn:
            return steps.create_step_execution(
                self.statements, conn, self.clock, job_execution_id, step_name
            )

    def create_flow_step_execution(
        self,
        job_execution_id: int,
        step_name: StepName,
        node_id: NodeId,
        start_limit: StartLimit | None = None,
    ) -> StepExecution:
        """Start a flow node: start limit, then the node's newest state or a fresh step."""
        duplicate = steps.duplicate_step_overrides(job_execution_id, step_name, node_id.value)
        with self.operation(overrides=duplicate) as conn:
            return flow.create_flow_step_execution(
                self.statements,
                conn,
                self.clock,
                job_execution_id,
                step_name,
                node_id,
                start_limit or StartLimit.unrestricted(),
            )

    def latest_flow_step(self, instance_id: int, node_id: NodeId) -> FlowStepState | None:
        """The newest step of a node in an instance, with its stored context."""
        with self.operation() as conn:
            return flow.latest_flow_step(self.statements, conn, instance_id, node_id)

    def append_flow_decision(self, request: FlowDecisionRequest) -> FlowDecision:
        """Append a flow decision checked against the execution's manifest."""
        with self.operation() as conn:
            return flow.append_flow_decision(self.statements, conn, request)

    def find_reusable_flow_decision(
        self,
        instance_id: int,
        node_id: NodeId,
        plan_fingerprint: bytes,
        input_digest: bytes,
        kind: FlowTransitionKind,
    ) -> FlowDecision | None:
        """The latest decision a restart may reuse instead of deciding again."""
        with self.operation() as conn:
            return flow.find_reusable_flow_decision(
                self.statements, conn, instance_id, node_id, plan_fingerprint, input_digest, kind
            )

    def flow_decisions(self, job_execution_id: int) -> list[FlowDecision]:
        """The decisions of an execution in sequence order."""
        with self.operation() as conn:
            return flow.flow_decisions(self.statements, conn, job_execution_id)

    def transition_step_execution(
        self, step_id: int, expected_version: int, transition: LifecycleTransition
    ) -> StepExecution:
        """Apply a lifecycle transition to a step (docs/contract.md, Transitions and enrichment)."""
        with self.operation() as conn:
            return steps.transition_step_execution(
                self.statements, conn, step_id, expected_version, transition
            )

    def enrich_step_exit_status(
        self, step_id: int, expected_version: int, exit_status: ExitCode
    ) -> StepExecution:
        """Replace the exit status of a step (docs/contract.md, Transitions and enrichment)."""
        with self.operation() as conn:
            return steps.enrich_step_exit_status(
                self.statements, conn, self.clock, step_id, expected_version, exit_status
            )

    def get_step_execution(self, step_id: int) -> StepExecution | None:
        """One step execution, or None (docs/contract.md, Reads)."""
        with self.operation() as conn:
            return steps.get_step_execution(self.statements, conn, step_id)

    def step_executions(self, job_execution_id: int) -> list[StepExecution]:
        """The steps of a job execution in creation order (docs/contract.md, Reads)."""
        with self.operation() as conn:
            return steps.step_executions(self.statements, conn, job_execution_id)

    # ------------------------------------------------------------------ step partitions

    def _plan_overrides(self, parent_id: int) -> Overrides:
        return {
            "step_partition_key_unique": DuplicatePartitionKey,
            "step_partition_ordinal_unique": lambda: PartitionPlanExists(
                step_execution_id=parent_id
            ),
        }

    def create_step_partition_plan(
        self, parent_id: int, entries: Sequence[PartitionPlanEntry]
    ) -> list[StepPartition]:
        """Create a parent's partition plan, all or nothing; publish it by committing."""
        with self.operation(overrides=self._plan_overrides(parent_id)) as conn:
            return partitions.create_step_partition_plan(
                self.statements, conn, parent_id, entries, self.unpublished_plans
            )

    def step_partition_plan(self, parent_id: int) -> list[StepPartition]:
        """A parent's partitions in key byte order; empty without a plan."""
        with self.operation() as conn:
            return partitions.step_partition_plan(self.statements, conn, parent_id)

    def restart_step_partition_plan(
        self, source_parent_id: int, target_parent_id: int
    ) -> list[StepPartition]:
        """Carry a plan into a restart's parent; completed partitions are not rerun."""
        with self.operation(overrides=self._plan_overrides(target_parent_id)) as conn:
            return partitions.restart_step_partition_plan(
                self.statements, conn, source_parent_id, target_parent_id, self.unpublished_plans
            )

    def assign_step_partition(
        self, partition_id: int, expected_version: int, worker_id: int
    ) -> StepPartition:
        """Hand a partition to a worker step of the parent's execution."""
        with self.operation() as conn:
            return partitions.assign_step_partition(
                self.statements,
                conn,
                partition_id,
                expected_version,
                worker_id,
                self.unpublished_plans,
            )

    def complete_step_partition(
        self, partition_id: int, expected_version: int, worker_id: int
    ) -> StepPartition:
        """Publish the worker's terminal status, exit and counts onto its partition."""
        with self.operation() as conn:
            return partitions.complete_step_partition(
                self.statements, conn, partition_id, expected_version, worker_id
            )

    def aggregate_step_partitions(
        self, parent_id: int, expected_version: int, transitioned_at: datetime
    ) -> StepExecution:
        """End the parent with the aggregate of its partitions, atomically."""
        with self.operation() as conn:
            return partitions.aggregate_step_partitions(
                self.statements, conn, parent_id, expected_version, transitioned_at
            )

    def claim_step_partition(
        self,
        parent: StepExecution,
        owner: OwnerToken | None = None,
        lease: ExecutionLease | None = None,
    ) -> tuple[StepPartition, StepExecution] | None:
        """Claim the next partition of a STARTED parent with a new STARTED worker step, or None.

        N concurrent claimers never take the same partition (FOR UPDATE SKIP LOCKED). The
        partition records `owner` (a fresh token when None) and starts its `lease` (the
        default lease when None) on the database clock.
        """
        with self.operation() as conn:
            return partitions.claim_step_partition(
                self.statements,
                conn,
                self.clock.now(),
                parent,
                self.unpublished_plans,
                owner or OwnerToken.generate(),
                lease or ExecutionLease(),
            )

    def renew_partition_worker_lease(
        self, partition_id: int, worker_id: int, owner: OwnerToken, lease: ExecutionLease
    ) -> None:
        """Extend the lease of a partition this owner works on (PartitionOwnershipLost)."""
        with self.operation() as conn:
            partitions.renew_partition_worker_lease(
                self.statements, conn, partition_id, worker_id, owner, lease
            )

    def lock_partition_worker_lease(self, partition_id: int) -> partitions.WorkerLease | None:
        """Lock a partition after its parent and read its worker's lease; None unless STARTED."""
        with self.operation() as conn:
            return partitions.lock_partition_worker_lease(self.statements, conn, partition_id)

    def count_open_step_partitions(self, parent_id: int) -> int:
        """Partitions still to be claimed or being worked on."""
        with self.operation() as conn:
            return partitions.count_open_step_partitions(self.statements, conn, parent_id)

    def count_step_partitions_by_status(self, parent_id: int) -> dict[BatchStatus, int]:
        """How many partitions of a plan are in each status."""
        with self.operation() as conn:
            return partitions.count_step_partitions_by_status(self.statements, conn, parent_id)

    def partition_plan_progress(self, parent_id: int, slowest: int = 5) -> PlanProgress:
        """A plan's state: partitions per status and the `slowest` ones (read method)."""
        with self.operation() as conn:
            return partitions.plan_progress(
                self.statements, conn, parent_id, self.clock.now(), slowest
            )

    def started_step_partitions(self, parent_id: int) -> list[partitions.StartedPartition]:
        """The STARTED partitions of a plan with their workers (lost-worker checks)."""
        with self.operation() as conn:
            return partitions.started_step_partitions(self.statements, conn, parent_id)

    def end_partition_worker(
        self,
        partition_id: int,
        expected_version: int,
        worker_id: int,
        transition: LifecycleTransition,
        exit_status: ExitCode,
    ) -> StepPartition:
        """End a partition's worker step and complete the partition from it, atomically."""
        with self.operation() as conn:
            return partitions.end_partition_worker(
                self.statements,
                conn,
                partition_id,
                expected_version,
                worker_id,
                partitions.WorkerEnd(transition, exit_status),
            )
