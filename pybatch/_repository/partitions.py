"""Step partitions over queries/partitions.sql, each operation in its documented check order.

See docs/contract.md, Partitions. Lock order everywhere: parent step, then partitions, then
worker steps. No worker may be assigned to a plan created or carried in the current unit of
work (`unpublished_plans`): it is not durably published yet.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

import attrs

from pybatch._codecs._primitives import (
    DecodeError,
    decode_enum,
    decode_int64,
    int64_at,
    returned,
    text_at,
)
from pybatch._codecs.chunks import EMPTY_FAULT_STATE_PARAMETERS
from pybatch._codecs.lifecycle import decode_failure, encode_execution_metadata
from pybatch._codecs.partitions import (
    decode_claimed_partition,
    decode_step_partition,
    encode_plan_entries,
)
from pybatch._codecs.steps import COUNT_COLUMNS, decode_counts, decode_step_execution, encode_counts
from pybatch._repository import _lifecycle, steps
from pybatch._repository._capability import Capability, Overrides
from pybatch._repository._lifecycle import check_expected_version
from pybatch._statements import Connection, Row, Statements
from pybatch.errors import (
    ConcurrentModification,
    CountExhausted,
    DuplicatePartitionKey,
    EmptyPartitionPlan,
    IllegalTransition,
    PartitionAggregationIncomplete,
    PartitionParentNotActive,
    PartitionPlanExists,
    PartitionPlanNotCommitted,
    PartitionPlanTooLarge,
    PartitionStateCorrupt,
    PartitionUpdateNotAllowed,
    PartitionWorkerMismatch,
    PartitionWorkerStale,
    PyBatchError,
    StaleVersion,
    StateSchemaVersionNotStorable,
    StepExecutionNotFound,
    StepPartitionNotFound,
)
from pybatch.values.counts import ExecutionCounts
from pybatch.values.ids import INT64_MAX, FailureId, IdentifierKind, check_identifier
from pybatch.values.lifecycle import LifecycleTransition, apply_transition, is_legal_transition
from pybatch.values.names import ExitCode
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.partitions import (
    MAX_PARTITIONS,
    RESULT_STATUSES,
    PartitionPlanEntry,
    StepPartition,
)
from pybatch.values.records import StepExecution
from pybatch.values.state import MAX_STORABLE_SCHEMA_VERSION
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

#: No partition is claimed again in an attempt from this version on: 5 lost workers, 2 each.
_MAX_VERSION = 2 * 5
_ACTIVE_PARENT = frozenset({BatchStatus.STARTING, BatchStatus.STARTED})
_COMPLETING_PARENT = frozenset({BatchStatus.STARTED, BatchStatus.STOPPING})
_RESTARTABLE_SOURCE = frozenset({BatchStatus.FAILED, BatchStatus.STOPPED})


@contextmanager
def corrupt_on(errors: tuple[type[Exception], ...] = (DecodeError,)) -> Iterator[None]:
    """An unreadable stored value means the partition state is corrupt."""
    try:
        yield
    except errors:
        raise PartitionStateCorrupt() from None


def partition_status(value: object) -> BatchStatus:
    """A status column of a partition or step row (PartitionStateCorrupt when unreadable)."""
    with corrupt_on():
        return decode_enum(BatchStatus, value, column="status")


def _require_parent(parent_id: int, status: BatchStatus, allowed: Collection[BatchStatus]) -> None:
    if status not in allowed:
        raise PartitionParentNotActive(step_execution_id=parent_id, status=status.value)


def _lock_step(q: Statements, conn: Connection, step_id: int) -> tuple[int, BatchStatus]:
    """Lock a step; its job execution id and status (StepExecutionNotFound without one)."""
    row = q.lock_partition_step.one(conn, step_execution_id=step_id)
    if row is None:
        raise StepExecutionNotFound(id=step_id)
    with corrupt_on():
        execution_id = int64_at(row, "job_execution_id")
    return execution_id, partition_status(row["status"])


def _decoded(rows: Sequence[Row]) -> list[StepPartition]:
    return [decode_step_partition(row) for row in rows]


def _end_columns(
    partition_id: int,
    expected_version: int,
    worker_id: int,
    end: tuple[LifecycleTransition, ExitCode | None],
) -> dict[str, object]:
    """The parameters of a partition's end (end_step_partition, claim_step_partition)."""
    check_expected_version(expected_version)
    check_identifier(IdentifierKind.STEP_PARTITION, partition_id)
    check_identifier(IdentifierKind.STEP_EXECUTION, worker_id)
    transition, exit_status = end
    failure = transition.failure
    return {
        "step_partition_id": partition_id,
        "expected_version": expected_version,
        "worker_step_execution_id": worker_id,
        "status": transition.target.value,
        "exit_code": None if exit_status is None else exit_status.value,
        "failure_category": None if failure is None else failure.category.value,
        "failure_id": None if failure is None else failure.failure_id,
        "now": transition.at,
    }


#: A partition's end: its id, expected version, worker and (transition, exit).
Ending = tuple[int, int, int, tuple[LifecycleTransition, ExitCode | None]]
#: claim_step_partition's parameters of the end it follows, with no partition to end.
_NO_END = dict.fromkeys("step_partition_id expected_version worker_step_execution_id now".split())


def _end_refused(
    row: Row, partition_id: int, expected_version: int, worker_id: int, target: BatchStatus
) -> PyBatchError:
    """Why end_step_partition changed nothing, from the state its guards judged, in check order."""
    if row["found_version"] is None:
        return StepPartitionNotFound(id=partition_id)
    with corrupt_on():
        parent_id = int64_at(row, "parent_step_execution_id")
        version = int64_at(row, "found_version")
    parent_status = partition_status(row["parent_status"])
    if parent_status not in _COMPLETING_PARENT:
        return PartitionParentNotActive(step_execution_id=parent_id, status=parent_status.value)
    if row["found_worker_step_execution_id"] != worker_id:
        return PartitionWorkerStale(partition_id=partition_id, worker=worker_id)
    if row["same_execution"] is not True:
        return PartitionWorkerMismatch(partition_id=partition_id, worker=worker_id)
    worker_status = partition_status(row["worker_status"])
    if worker_status.is_active:
        if not is_legal_transition(worker_status, target):
            return IllegalTransition(from_status=worker_status.value, to_status=target.value)
    elif worker_status not in RESULT_STATUSES:
        return PartitionAggregationIncomplete(
            step_execution_id=parent_id, status=worker_status.value
        )
    if version != expected_version:
        return StaleVersion(expected=expected_version, actual=version)
    status = partition_status(row["found_status"])
    if status is not BatchStatus.STARTED:
        return PartitionUpdateNotAllowed(id=partition_id, status=status.value)
    return ConcurrentModification()


def _aggregate(
    parent_id: int, row: Row
) -> tuple[BatchStatus, ExitCode, ExecutionCounts, FailureSummary | None]:
    """The parent's outcome from summarize_step_partitions (docs/contract.md, Partitions).

    PartitionAggregationIncomplete, CountExhausted, or PartitionStateCorrupt for an empty plan
    or a partition that does not mirror its worker's durable row.
    """
    if row["incomplete_status"] is not None:
        status = partition_status(row["incomplete_status"])
        raise PartitionAggregationIncomplete(step_execution_id=parent_id, status=status.value)
    with corrupt_on((DecodeError, PyBatchError, ValueError, TypeError)):
        if not int64_at(row, "partitions", 0):
            raise DecodeError("partitions")
        sums = {column: int(row[column]) for column in COUNT_COLUMNS}  # type: ignore[call-overload]
        status = partition_status(row["status"])
        exit_status = ExitCode(text_at(row, "exit_code"))
        failure = decode_failure(row["failure_category"], row["failure_id"])
    if max(sums.values()) > INT64_MAX:
        raise CountExhausted()
    if row["mirrored"] is not True:
        raise PartitionStateCorrupt()
    failure = failure if status is BatchStatus.FAILED else None
    return status, exit_status, decode_counts(sums), failure


def _plan_overrides(parent_id: int) -> Overrides:
    """A plan's unique keys, as the errors a duplicate key or a second plan means."""
    return {
        "step_partition_key_unique": DuplicatePartitionKey,
        "step_partition_ordinal_unique": lambda: PartitionPlanExists(step_execution_id=parent_id),
    }


class Partitions(Capability):
    def _check_plan_target(
        self, q: Statements, conn: Connection, parent_id: int, status: BatchStatus
    ) -> None:
        _require_parent(parent_id, status, _ACTIVE_PARENT)
        if q.find_step_partition_plan.scalar(conn, step_execution_id=parent_id) is True:
            raise PartitionPlanExists(step_execution_id=parent_id)

    def _new_plan(self, parent_id: int, rows: Sequence[Row]) -> list[StepPartition]:
        """Record the plan as unpublished until the unit of work commits; ordinal order."""
        self._uow.unpublished_plans.add(parent_id)
        return sorted(_decoded(rows), key=lambda p: p.ordinal)

    def create_plan(
        self, parent_id: int, entries: Sequence[PartitionPlanEntry], *, decoded: bool = True
    ) -> list[StepPartition]:
        """Create a plan for a STARTING or STARTED parent, all or nothing; entries first.

        Without `decoded`, returns [] (a launcher reads no partition: decoding 1,024 cost ms).
        """
        with self._operation(overrides=_plan_overrides(parent_id)) as (q, conn):
            entries = list(entries)
            if not entries:
                raise EmptyPartitionPlan()
            if len(entries) > MAX_PARTITIONS:
                raise PartitionPlanTooLarge(max=MAX_PARTITIONS)
            if len({entry.key.sort_key for entry in entries}) != len(entries):
                raise DuplicatePartitionKey()
            if any(entry.context.schema_version > MAX_STORABLE_SCHEMA_VERSION for entry in entries):
                raise StateSchemaVersionNotStorable()
            check_identifier(IdentifierKind.STEP_EXECUTION, parent_id)
            self._check_plan_target(q, conn, parent_id, _lock_step(q, conn, parent_id)[1])
            rows = q.insert_step_partitions.many(
                conn, step_execution_id=parent_id, **encode_plan_entries(entries)
            )
            return self._new_plan(parent_id, rows if decoded else [])

    def plan(self, parent_id: int) -> list[StepPartition]:
        """A parent's plan in key byte order; empty without a plan."""
        with self._operation() as (q, conn):
            check_identifier(IdentifierKind.STEP_EXECUTION, parent_id)
            if q.get_step_execution.one(conn, step_execution_id=parent_id) is None:
                raise StepExecutionNotFound(id=parent_id)
            return _decoded(q.list_step_partitions.many(conn, step_execution_id=parent_id))

    def restart_plan(self, source_parent_id: int, target_parent_id: int) -> list[StepPartition]:
        """Carry a committed plan into a restart's parent; COMPLETED partitions are not rerun.

        PartitionStateCorrupt when a step is missing, the logical ids differ, the source job
        is not FAILED or STOPPED, or the source plan is missing or unreadable.
        """
        with self._operation(overrides=_plan_overrides(target_parent_id)) as (q, conn):
            check_identifier(IdentifierKind.STEP_EXECUTION, source_parent_id)
            check_identifier(IdentifierKind.STEP_EXECUTION, target_parent_id)
            pair = q.lock_partition_restart_pair.one(
                conn, source_step_execution_id=source_parent_id, step_execution_id=target_parent_id
            )
            if pair is None or pair["same_logical_id"] is not True:
                raise PartitionStateCorrupt()
            if partition_status(pair["source_job_status"]) not in _RESTARTABLE_SOURCE:
                raise PartitionStateCorrupt()
            target_status = partition_status(pair["target_status"])
            self._check_plan_target(q, conn, target_parent_id, target_status)
            source = q.lock_step_partitions_by_ordinal.many(
                conn, step_execution_id=source_parent_id
            )
            if not _decoded(source):
                raise PartitionStateCorrupt()
            rows = q.copy_step_partitions.many(
                conn, source_step_execution_id=source_parent_id, step_execution_id=target_parent_id
            )
            return self._new_plan(target_parent_id, rows)

    def end_worker(
        self,
        partition_id: int,
        expected_version: int,
        worker_id: int,
        transition: LifecycleTransition,
        exit_status: ExitCode | None,
    ) -> None:
        """End a partition's worker step and complete the partition from it, atomically.

        A worker already in a result status is left as it is. `exit_status` None keeps its exit.
        Nothing is decoded on this path (a worker's hot path): `plan()` reads the partition.
        """
        end = _end_columns(partition_id, expected_version, worker_id, (transition, exit_status))
        with self._operation() as (q, conn):
            row = returned(q.end_step_partition.prepared.one(conn, **end, only_if_lost=False))
            if row["id"] is None:
                raise _end_refused(
                    row, partition_id, expected_version, worker_id, transition.target
                )

    def recover_lost(self, partition: int, expected_version: int, worker_id: int) -> bool:
        """End a STARTED partition's worker FAILED (STALE_RECOVERED) if its lease is gone.

        The lease is judged on the database clock under the parent's and the partition's locks,
        so a renewal since the caller's read proves the worker alive: False, nothing changed.
        """
        lost = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(worker_id))
        end = (LifecycleTransition.failed(self._uow.clock.now(), lost), None)
        ended = _end_columns(partition, expected_version, worker_id, end)
        with self._operation() as (q, conn):
            row = returned(q.end_step_partition.prepared.one(conn, **ended, only_if_lost=True))
            return row["id"] is not None

    def aggregate(
        self, parent_id: int, expected_version: int, transitioned_at: _dt.datetime
    ) -> StepExecution:
        """End the parent with the aggregate of every child, atomically (docs/contract.md).

        A replay with the same `expected_version` after a committed aggregation returns the
        parent unchanged, so a retry after CommitOutcomeUnknown is safe.
        """
        with self._operation() as (q, conn):
            check_expected_version(expected_version)
            check_identifier(IdentifierKind.STEP_EXECUTION, parent_id)
            parent = _lifecycle.lock(steps.ROWS, q, conn, parent_id)
            status, exit_status, counts, failure = _aggregate(
                parent_id,
                returned(q.summarize_step_partitions.one(conn, step_execution_id=parent_id)),
            )
            current = parent.metadata
            if (
                parent.version == expected_version + 1
                and current.status is status
                and current.exit_status == exit_status
                and current.counts == counts
                and current.failure == failure
            ):
                return parent
            _require_parent(parent_id, current.status, _COMPLETING_PARENT)
            if failure is not None:  # a FAILED aggregate: its selected worker always carries one
                transition = LifecycleTransition.failed(transitioned_at, failure)
            else:
                transition = LifecycleTransition.new(status, transitioned_at)
            metadata, version = apply_transition(
                current, parent.version, expected_version, transition, counts_apply=True
            )
            metadata = attrs.evolve(metadata, exit_status=exit_status, counts=counts)
            changed = q.update_step_execution_aggregate.affected(
                conn,
                **encode_execution_metadata(metadata),
                **encode_counts(metadata.counts),
                transitioned_at=transitioned_at,
                step_execution_id=parent_id,
                expected_version=expected_version,
            )
            new = (metadata, version)
            return _lifecycle.swapped(
                steps.ROWS, q, conn, parent, changed, expected_version, new, transitioned_at
            )

    def claim(
        self,
        parent: StepExecution,
        owner: OwnerToken | None = None,
        lease: ExecutionLease | None = None,
        *,
        fresh: bool = False,
        ending: Ending | None = None,
    ) -> tuple[StepPartition, StepExecution] | None:
        """Claim the next partition of a STARTED parent for a new worker step, or None.

        One guarded statement (docs/architecture.md, Partitioned steps); `fresh`: the cheaper
        one that claims only a first attempt's unassigned partitions. With `ending` (the worker's
        last partition) end_step_partition ends that one first in the same transaction and round
        trip, and the claim runs only if the end completed it; both are the whole unit of work,
        committed alone without waiting for the flush, and a refused end raises as `end_worker`
        does.
        """
        owner = owner or OwnerToken.generate()
        lease = lease or ExecutionLease()
        if parent.id in self._uow.unpublished_plans:
            raise PartitionPlanNotCommitted(step_execution_id=parent.id)
        end = _NO_END | {"now": self._uow.clock.now()} if ending is None else _end_columns(*ending)
        q = self._uow.statements
        claim = (q.claim_fresh_step_partition if fresh else q.claim_step_partition).prepared
        params = {
            "step_execution_id": parent.id,
            # Worker names add `#ordinal.version` to the parent's name cut to 100 bytes.
            "worker_name_prefix": parent.step_name.value.encode()[:100].decode("utf-8", "ignore"),
            **EMPTY_FAULT_STATE_PARAMETERS,
            "owner_token": owner.value,
            "lease_ms": lease.milliseconds,
            **{name: end[name] for name in _NO_END},
        }
        if not fresh:  # what only the full claim reads: where to resume, how many tries
            params.update(node_id=parent.logical_id.value, max_partition_version=_MAX_VERSION)

        def decode(*rows: Row | None) -> tuple[StepPartition, StepExecution] | None:
            if ending is not None and (ended := returned(rows[0]))["id"] is None:
                partition_id, version, worker_id, (transition, _) = ending
                raise _end_refused(ended, partition_id, version, worker_id, transition.target)
            if (row := returned(rows[-1]))["id"] is None:
                return None
            return decode_claimed_partition(row, parent.id), decode_step_execution(row)

        if ending is not None:
            # Neither waits for its flush: the next chunk, the aggregation or the run's end does
            # (docs/contract.md, Durability of commits); the chunks' fences refuse a lost claim.
            ended = end | {"only_if_lost": False}
            return self._uow.commit_statement(
                q.end_step_partition.prepared,
                ended,
                decode,
                then=(claim, params),
                wait_for_flush=False,
            )
        with self._operation() as (_, conn):
            return decode(claim.one(conn, **params))

    def count_open(self, parent_id: int) -> int:
        """Partitions still STARTING, STARTED, or claimable again after a lost worker."""
        with self._operation() as (q, conn):
            check_identifier(IdentifierKind.STEP_EXECUTION, parent_id)
            found = q.count_open_step_partitions.scalar(
                conn, step_execution_id=parent_id, max_partition_version=_MAX_VERSION
            )
            return decode_int64(found, column="open_partitions", minimum=0)
