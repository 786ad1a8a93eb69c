"""The ETL-facing API: launch or restart a job, run steps, commit chunks with checkpoints.

Written for script authors (docs/etl-guide.md) rather than mirroring the repository's ports.
Composition only: every statement is run by the repository, chunk and recovery modules.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import logging
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import attrs
import psycopg

from pybatch import _partitioned as partitioned
from pybatch import _skips, _telemetry
from pybatch import errors as e
from pybatch._chunks import ChunkTransaction, StepProgress, StepSession, load_committed_state
from pybatch._failure_reasons import failure_reason
from pybatch._fault_state import FaultState, RetryPolicy
from pybatch._job_repository import JobRepository
from pybatch._lease_keeper import LeaseKeeper, PartitionLeaseKeeper
from pybatch._services.flow import FlowPoint
from pybatch._unit_of_work import UnitOfWork
from pybatch.values import fault
from pybatch.values.chunks import ChunkContext, ChunkCounts, CommittedStepState, FaultProgress
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import FlowTarget, StartLimit, TerminalKind
from pybatch.values.ids import INT64_MAX
from pybatch.values.names import ClassifierRevision, JobName, NodeId, StateSchemaId, StepName
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.partitions import StepPartition
from pybatch.values.records import JobExecution, JobInstance, StepExecution
from pybatch.values.state import Checkpoint, ExecutionContext, JsonObject, StateLimits
from pybatch.values.status import BatchStatus, FailureCategory, FailureReason

__all__ = [
    "Backoff",
    "Chunk",
    "Job",
    "JobRun",
    "LoadResult",
    "PartitionRun",
    "StepRun",
    "join_partitioned_step",
]

logger = logging.getLogger("pybatch.etl")

#: The schema id of checkpoints and contexts written through this API.
ETL_STATE_SCHEMA = StateSchemaId("pybatch.etl.v1")


def _state(cls: type[Checkpoint] | type[ExecutionContext], payload: JsonObject) -> Any:
    """The envelope, built before any chunk statement runs: a dict as it is, a mapping copied."""
    if type(payload) is not dict:
        if not isinstance(payload, Mapping):
            raise e.StatePayloadNotObject()
        payload = dict(payload)
    return cls(ETL_STATE_SCHEMA, 1, payload, limits=StateLimits.STEP)


class Chunk:
    """One chunk of a step (`StepRun.chunk`): your statements and its progress commit together."""

    __slots__ = ("_step", "_transaction")

    def __init__(self, step: StepRun, transaction: ChunkTransaction) -> None:
        self._step = step
        self._transaction = transaction

    def __enter__(self) -> Chunk:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        if not self._transaction.is_open:  # committed or rolled back
            return
        if exc is not None:
            self._transaction.rollback()  # the block's own error propagates
            return
        # A silent rollback here would end the step COMPLETED with nothing written.
        self.rollback()
        raise e.ChunkNotEnded(step_execution_id=self._step.execution.id)

    def rollback(self) -> None:
        """Discard the chunk's statements on purpose; the step's rollback count advances.

        Raises:
            NotCommitted: the count was refused (the step changed or its owner lost it).
        """
        try:
            self._transaction.rollback_counted()
        except e.NotCommitted:
            self._step._raise_if_ownership_lost()
            raise
        self._step._committed = self._transaction.progress

    def _discard(self) -> None:
        """Roll back without counting: the chunk is redone at once (`StepRun.load`)."""
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
        return self._transaction.copy(statement, rows)

    def commit(
        self,
        *,
        read: int,
        written: int,
        checkpoint: JsonObject,
        processed: int | None = None,
        filtered: int = 0,
        context: JsonObject | None = None,
        skips: FaultProgress | None = None,
    ) -> None:
        """COMMIT the chunk with the step's new checkpoint; the step's counters advance.

        Raises:
            NotCommitted: nothing of the chunk is durable (a statement failed, or the step
                was changed by someone else); the step then fails.
            ChunkCommitOutcomeUnknown: the acknowledgement was lost; the step fails and a
                restart resumes from whatever is durable.
        """
        if processed is None:
            processed = read
        if not (
            type(read) is type(processed) is type(written) is type(filtered) is int
            and 0 <= read <= INT64_MAX
            and 0 <= processed <= INT64_MAX
            and 0 <= written <= INT64_MAX
            and 0 <= filtered <= INT64_MAX
        ):  # ChunkCounts raises the typed error naming the count that is wrong
            ChunkCounts(read=read, processed=processed, written=written, filtered=filtered)
        state = _state(Checkpoint, checkpoint)
        ctx = None if context is None else _state(ExecutionContext, context)
        try:
            self._transaction.commit_counts(
                read, processed, written, filtered, skips, checkpoint=state, context=ctx
            )
        except e.NotCommitted:
            self._step._raise_if_ownership_lost()
            raise
        self._step._committed = self._transaction.progress


class _ObservedChunk(Chunk):
    """A chunk with a span and counters: the chunk class of steps run with opentelemetry."""

    __slots__ = ("_probe",)

    def __init__(self, step: StepRun, transaction: ChunkTransaction) -> None:
        super().__init__(step, transaction)
        self._probe = _telemetry.ChunkProbe(step._probe)  # type: ignore[arg-type]

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        rolled_back = exc is not None and self._transaction.is_open
        if exc is None and self._transaction.is_open:  # ended neither way: Chunk raises for it
            self._probe.ended(e.ChunkNotEnded(step_execution_id=self._step.execution.id))
        super().__exit__(exc_type, exc, traceback)
        if rolled_back:
            self._probe.ended(exc)

    def _discard(self) -> None:
        super()._discard()
        self._probe.ended(None)

    def rollback(self) -> None:
        """`Chunk.rollback`, counted and ending the chunk's span."""
        try:
            super().rollback()
        except BaseException as error:
            self._probe.ended(error)
            raise
        self._probe.ended(None)

    def commit(self, **arguments: Any) -> None:
        """`Chunk.commit` (the same keyword arguments), counted, timed and ending the span."""
        started = time.perf_counter()
        try:
            super().commit(**arguments)
        except BaseException as error:
            if not self._transaction.is_open:  # else the block's exit rolls it back
                self._probe.ended(error)
            raise
        seconds = time.perf_counter() - started
        self._probe.committed(
            arguments["read"], arguments["written"], arguments.get("skips"), seconds
        )


class StepRun:
    """A running step: its committed checkpoint and a way to open chunks."""

    def __init__(
        self, run: JobRun, step: StepExecution, *, context: ChunkContext | None = None
    ) -> None:
        self.run = run
        self.execution = step
        self._committed: StepProgress | None = None  # see `state`
        if context is None:
            if run.owner is None:  # only partition workers run without the execution's owner
                raise e.ExecutionOwnershipLost(id=step.job_execution_id)
            context = ChunkContext(step.id, step.job_execution_id, run.owner)
        # One held connection for all the step's chunks (`close`); each commit proves `context`.
        self._session = StepSession(run.repository, context)
        #: The step's span (None without opentelemetry, or in a partition worker), and the
        #: chunk class bound to it once here: nothing is checked per chunk.
        job = run._probe
        self._probe = None if job is None else _telemetry.StepProbe(job, self.name, step.id)
        self._chunk_type: type[Chunk] = Chunk if self._probe is None else _ObservedChunk

    @property
    def name(self) -> str:
        """The step name."""
        return self.execution.step_name.value

    @property
    def state(self) -> CommittedStepState | None:
        """What the step's chunks last committed in this run (None: nothing yet)."""
        return None if self._committed is None else self._committed.value()

    @property
    def checkpoint(self) -> dict[str, Any]:
        """The last committed checkpoint payload ({} on a fresh step); resume from here.

        Values are JSON (`JsonValue`) as committed; typed `Any` so a read needs no cast.
        """
        return dict((self.state or self.execution).checkpoint.payload)

    @property
    def context(self) -> dict[str, Any]:
        """The last committed execution context payload."""
        return dict((self.state or self.execution).context.payload)

    @property
    def read_count(self) -> int:
        """Items read so far, across restarts (counters carry over)."""
        return (self.state or self.execution.metadata).counts.read

    @property
    def written_count(self) -> int:
        """Items written so far, across restarts."""
        return (self.state or self.execution.metadata).counts.written

    @property
    def commit_count(self) -> int:
        """Chunks committed so far, across restarts."""
        return (self.state or self.execution.metadata).counts.committed

    @property
    def stop_requested(self) -> bool:
        """Whether an operator asked the run to stop (polled every lease renewal).

        A long chunk may check it to end early; `chunk()` raises StopRequested anyway.
        """
        return self.run._keeper is not None and self.run._keeper.stop_requested

    def chunk(self) -> Chunk:
        """Open a chunk transaction on the step: `with step.chunk() as chunk: ...`.

        End the block with `chunk.commit(...)` or `chunk.rollback()`; leaving it without
        either rolls back and raises ChunkNotEnded (an error leaving it rolls back and
        propagates). After a commit, the step continues from the state the chunk committed.

        Raises:
            StopRequested: a stop was requested; the step and the job end STOPPED, and
                the run's `with` block ends quietly (`JobRun.stopped`).
            ExecutionOwnershipLost: this process no longer owns the execution.
        """
        self._at_chunk_boundary()
        return self._chunk_type(self, self._session.begin())

    def load(
        self,
        read: Callable[[int], Iterable[Any]],
        write: Callable[[Chunk, list[Any]], object],
        *,
        chunk_size: int = 1000,
        key: Callable[[Any], object] | None = None,
        retry_limit: int = 3,
        skip_limit: int = 0,
        backoff: Backoff | None = None,
    ) -> LoadResult:
        """Load `read`'s items in chunks written by `write`, skipping rejected items, retrying.

        `read(position)` yields the items from `position` on (kept in the checkpoint as
        `{"position": n}`); `write(chunk, items)` writes a batch with the chunk's methods.
        Items the server rejects for their data (SQLSTATE class 22 or 23) are recorded in
        `pybatch.step_skip` (keyed by `key(item)`, default the position) with the chunk; a
        transient failure is retried up to `retry_limit` times (docs/etl-guide.md, "Fault
        tolerance").

        Raises:
            SkipLimitExceeded: the step's skips would exceed `skip_limit`; nothing of that
                chunk is committed.
            Rejected: a rejection that is not the data's (a syntax error, a missing table).
            TransientConflict, LockTimeout, Infrastructure: after `retry_limit` retries.
        """
        return _FaultTolerantLoad(
            self, read, write, chunk_size, key, retry_limit, skip_limit, backoff or Backoff()
        ).run()

    def close(self) -> None:
        """Give back the connection the step's chunks held (a chunk left open rolls back)."""
        self._session.close()

    def _at_chunk_boundary(self) -> None:
        self.run._at_chunk_boundary()

    def _raise_if_ownership_lost(self) -> None:
        """After a refused commit: if the cause is a lost ownership, say so."""
        if self.run._keeper is not None:
            self.run._keeper.raise_if_lost()


@attrs.frozen
class Backoff:
    """How long `StepRun.load` waits before retry n: exponential, with jitter.

    The wait before retry n is drawn from [d/2, d], d = min(maximum, initial * multiplier
    ** (n - 1)) seconds, so retries of concurrent steps spread out.
    """

    initial: float = 0.05
    maximum: float = 5.0
    multiplier: float = 2.0

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.initial <= self.maximum or self.multiplier < 1:
            raise ValueError("Backoff needs 0 <= initial <= maximum and multiplier >= 1")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry `retry` (1 and up)."""
        ceiling = min(self.maximum, self.initial * self.multiplier ** max(retry - 1, 0))
        return random.uniform(ceiling / 2, ceiling)


@attrs.frozen
class LoadResult:
    """What one `StepRun.load` call did (this process only; the step's counters hold all)."""

    read: int
    written: int
    skipped: int
    retries: int
    position: int


#: SQLSTATE classes of rejections caused by an item's own data: such items are skipped.
_SKIPPABLE_CLASSES = frozenset({"22", "23"})
#: Failures after which the same batch may succeed on a fresh transaction.
_TRANSIENT = (e.TransientConflict, e.LockTimeout, e.Infrastructure)
#: The fault-state classifier revision `StepRun.load` reserves its retries under.
_LOAD_REVISION = ClassifierRevision("pybatch-load-1")
#: How many retry keys a loading step may retain: one per chunk, cleared at its commit.
_LOAD_STATE_LIMIT = fault.RetryStateLimit(16)
_MAX_CHUNK_SIZE = 1_000_000


def _position_of(checkpoint: Mapping[str, Any]) -> int:
    position = checkpoint.get("position", 0)
    if type(position) is not int or position < 0:
        raise ValueError("the step's checkpoint has no valid position for StepRun.load")
    return position


#: The line a rejected COPY names in its error context ("COPY t, line 5: ..."), 1-based.
_COPY_LINE = re.compile(r"^COPY .+, line (\d+)", re.MULTILINE)


class _SkipLimitReached(Exception):
    """Isolation found one skip more than the limit allows: stop writing."""


class _HintMissed(Exception):
    """Rows before the line a COPY named were rejected too: isolate by bisection instead."""


@attrs.define
class _FaultTolerantLoad:
    """One `StepRun.load` call: its chunks, the isolation of rejected items, retries, skips."""

    step: StepRun
    read: Callable[[int], Iterable[Any]]
    write: Callable[[Chunk, list[Any]], object]
    chunk_size: int
    key: Callable[[Any], object] | None
    retry_limit: int
    skip_limit: int
    backoff: Backoff
    result: dict[str, int] = attrs.field(
        init=False, factory=lambda: {"read": 0, "written": 0, "skipped": 0, "retries": 0}
    )
    #: The isolating chunk's skips so far, and how many the step's skip limit still allows.
    skipped: list[_skips.SkippedItem] = attrs.field(init=False, factory=list)
    allowed: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        for name, low, high in (
            ("chunk_size", 1, _MAX_CHUNK_SIZE),
            ("retry_limit", 0, fault.RetryOrdinal.MAX.value),
            ("skip_limit", 0, INT64_MAX),
        ):
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= high:
                raise ValueError(f"{name} must be an int from {low} to {high}")

    def run(self) -> LoadResult:
        position = _position_of(self.step.checkpoint)
        items = iter(self.read(position))
        pending: list[Any] = []
        while True:
            if not pending:
                pending = list(itertools.islice(items, self.chunk_size))
                if not pending:
                    break
            durable = self._chunk(position, pending)
            if durable != position + len(pending):
                # An outcome-unknown commit did not land, or landed elsewhere: read again
                # from what is durable.
                items = iter(self.read(durable))
            position, pending = durable, []
        return LoadResult(position=position, **self.result)

    def _chunk(self, start: int, batch: list[Any]) -> int:
        """Commit `batch` (read from `start`), retrying; return the durable position after it."""
        failed: BaseException | None = None
        while True:
            if failed is not None:
                self._spend_retry(start, failed)
                failed = None
            try:
                return self._attempt(start, batch)
            except e.ChunkCommitOutcomeUnknown as unknown:
                # Never redone blindly: only the database knows whether it landed.
                durable = _position_of(self._durable_state().checkpoint.payload)
                if durable != start:
                    return durable
                failed = unknown
            except _TRANSIENT as error:
                failed = error

    def _attempt(self, start: int, batch: list[Any]) -> int:
        """One transaction of the batch; rejected, one that isolates its rejected items."""
        step = self.step
        with step.chunk() as chunk:
            durable = _position_of(chunk._transaction.progress.checkpoint.payload)
            if durable != start:
                chunk._discard()
                return durable
            rejection = self._write(chunk, batch)
            if rejection is None:
                self._commit(chunk, start, len(batch), [])
                return start + len(batch)
            # Nothing but this batch is in the transaction: rolling it back is rolling back
            # to a savepoint before it, without the savepoint's round trips on every chunk.
            chunk._discard()
        isolate = self._isolate
        while True:
            with step._chunk_type(step, step._session.begin()) as chunk:
                try:
                    # The first statement opens the transaction the savepoints live in.
                    total = _skips.step_skip_total(chunk.connection, step.execution.id)
                except psycopg.Error as error:
                    raise chunk._transaction._classified(error) from None
                self.allowed, self.skipped = self.skip_limit - total, []
                try:
                    if self.allowed <= 0:
                        raise _SkipLimitReached()
                    isolate(chunk, list(enumerate(batch, start)), rejection)
                except _SkipLimitReached:
                    chunk._discard()
                    skips = total + max(len(self.skipped), 1)
                    raise e.SkipLimitExceeded(
                        limit=self.skip_limit, step=step.name, skips=skips
                    ) from None
                except _HintMissed:  # a line was not its item's: bisect, in a new transaction
                    chunk._discard()
                    isolate = self._bisect
                    continue
                self._commit(chunk, start, len(batch), self.skipped)
            return start + len(batch)

    def _isolate(self, chunk: Chunk, items: list[tuple[int, Any]], rejection: e.Rejected) -> None:
        """Write `items` (rejected as a whole with `rejection`) around the line it names.

        A COPY stops at the first line it rejects and names it: the rows before were accepted,
        so they are written again without a savepoint, the row alone in one (skipped if
        rejected), the rest in another (rejected: repeat with its line). No line: bisect.
        _HintMissed: the rows before the line were rejected too; discard the transaction.
        """
        while True:
            driver = rejection.__context__  # the driver's error, kept out of tracebacks
            named = _COPY_LINE.search(getattr(getattr(driver, "diag", None), "context", "") or "")
            line = 0 if named is None else int(named.group(1))
            if not 1 <= line <= len(items):
                self._bisect(chunk, items, rejection)
                return
            before, (position, item), after = items[: line - 1], items[line - 1], items[line:]
            if before and self._write(chunk, [i for _, i in before]) is not None:
                raise _HintMissed()
            alone = self._write(chunk, [item], savepoint=True)
            if alone is not None:
                self._skip(position, item, alone)
            if not after:
                return
            found = self._write(chunk, [i for _, i in after], savepoint=True)
            if found is None:
                return
            items, rejection = after, found

    def _skip(self, position: int, item: Any, rejection: e.Rejected) -> None:
        """Record an item that a write of it alone had rejected; past `allowed` skips, stop."""
        key = position if self.key is None else self.key(item)
        self.skipped.append(_skips.SkippedItem(position, _skips.item_key(key), rejection))
        if len(self.skipped) > self.allowed:
            raise _SkipLimitReached()

    def _bisect(
        self, chunk: Chunk, items: list[tuple[int, Any]], rejection: e.Rejected | None
    ) -> None:
        """Write each half of `items` (known to hold a rejected item) in a savepoint; recurse.

        `rejection` is the single item's own error when `items` is one item (it is then a
        skip). When the left half is written and the whole was rejected, the right half is
        split without being written first: the rejection is in it. That saves a write per
        level and risks nothing, since an item is only skipped after a write of it alone was
        rejected, and only rows a successful write put in the transaction are committed.
        """
        if len(items) == 1:
            if rejection is None:  # never called so: a known-bad item is written alone first
                raise ValueError("a single item is skipped only on its own rejection")
            self._skip(*items[0], rejection)
            return
        middle = len(items) // 2
        left, right = items[:middle], items[middle:]
        found = self._write(chunk, [item for _, item in left], savepoint=True)
        if found is not None:
            self._bisect(chunk, left, found)
        elif len(right) > 1:
            self._bisect(chunk, right, None)
            return
        found = self._write(chunk, [item for _, item in right], savepoint=True)
        if found is not None:
            self._bisect(chunk, right, found)

    def _write(
        self, chunk: Chunk, items: list[Any], *, savepoint: bool = False
    ) -> e.Rejected | None:
        """Run `write`; a rejection of the data is returned, every other failure raised."""
        classified = chunk._transaction._classified
        try:
            with chunk.connection.transaction() if savepoint else contextlib.nullcontext():
                try:
                    self.write(chunk, items)
                except psycopg.Error as error:  # statements run on chunk.connection directly
                    raise classified(error) from None
        except e.Rejected as error:
            if error.sqlstate[:2] in _SKIPPABLE_CLASSES:
                return error
            raise
        except psycopg.Error as error:  # the savepoint's own statements
            raise classified(error) from None
        return None

    def _commit(
        self, chunk: Chunk, start: int, count: int, skipped: list[_skips.SkippedItem]
    ) -> None:
        """The good rows, the skip records and the step's progress: one COMMIT."""
        if skipped:
            try:
                _skips.record_skips(chunk.connection, self.step.execution.id, skipped)
            except psycopg.Error as error:
                raise chunk._transaction._classified(error) from None
        written = count - len(skipped)
        chunk.commit(
            read=count,
            written=written,
            checkpoint={**self.step.checkpoint, "position": start + count},
            skips=FaultProgress(write_skips=len(skipped)) if skipped else None,
        )
        result = self.result
        result["read"] += count
        result["written"] += written
        result["skipped"] += len(skipped)

    def _durable_state(self) -> CommittedStepState:
        """The step's committed state, read afresh; the next chunk starts from it too."""
        step = self.step
        step._session.forget()
        return load_committed_state(step.run.repository, step._session._context)

    def _spend_retry(self, start: int, error: BaseException) -> None:
        """Reserve the batch's next retry durably, then back off; past the limit raise `error`.

        The retry key names the batch by the step's definition, name, checkpoint generation
        and start position, so a process killed mid-retry resumes with the count it had.
        """
        step = self.step
        state = self._durable_state()
        policy = RetryPolicy(fault.RetryLimit(self.retry_limit), _LOAD_STATE_LIMIT)
        fault_state = FaultState(step.run.repository, policy)
        fault_state.bind(step._session._context)
        key = fault.RetryKey.derive(
            step.run.definition.digest,
            step.execution.step_name,
            fault.FaultPhase.WRITE,
            state.checkpoint.generation_digest(),
            start,
        )
        spent = fault_state.reserved_ordinal(key) or fault.RetryOrdinal.INITIAL
        retry = spent.value + 1
        if retry > self.retry_limit:
            raise error
        fault_state.reserve(
            fault.FaultEntry(
                key=key,
                phase=fault.FaultPhase.WRITE,
                category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
                ordinal=fault.RetryOrdinal(retry),
                revision=_LOAD_REVISION,
            )
        )
        step._session.forget()  # the reservation advanced the step's version
        self.result["retries"] += 1
        message = "pybatch: step %s retries the chunk at position %s (retry %s of %s) after %s"
        arguments = (step.name, start, retry, self.retry_limit, type(error).__name__)
        step.run._log(message, *arguments, step=step.name)
        time.sleep(self.backoff.delay(retry))


class PartitionRun(StepRun):
    """One partition being worked on: its key and context, and the worker step's chunks.

    `checkpoint` resumes where an earlier worker of the same partition last committed.
    """

    def __init__(
        self,
        run: JobRun,
        worker: StepExecution,
        partition: StepPartition,
        keeper: PartitionLeaseKeeper,
        state: CommittedStepState | None = None,
    ) -> None:
        # A partition's chunks prove ownership through it: this worker's claim token, its id.
        context = ChunkContext(worker.id, worker.job_execution_id, keeper.owner, partition.id)
        super().__init__(run, worker, context=context)
        if state is not None:  # the claim's own row: the first chunk starts from it
            self._session.progress = StepProgress.of(state)
        self.partition = partition
        self._lease_keeper = keeper

    def _at_chunk_boundary(self) -> None:
        """PartitionOwnershipLost once a renewal found the partition recovered."""
        if self._lease_keeper.lost:
            raise self._lease_keeper.lost_ownership()
        super()._at_chunk_boundary()

    def _raise_if_ownership_lost(self) -> None:
        """After a refused commit: PartitionOwnershipLost when the partition was recovered."""
        self._lease_keeper.raise_if_lost()
        super()._raise_if_ownership_lost()

    @property
    def key(self) -> str:
        """The partition key."""
        return self.partition.key.value

    @property
    def partition_context(self) -> dict[str, Any]:
        """The context the plan gave this partition (what to read: a range, a file, ...)."""
        return self.partition.context.payload


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
        owner: OwnerToken | None,
        lease: ExecutionLease | None = None,
        definition: DefinitionIdentity | None = None,
        parameters: JobParameters | None = None,
    ) -> None:
        """`owner` and `lease` belong to the launching process; a partition worker has none."""
        self.repository = repository
        self.instance = instance
        self.execution = execution
        self.owner = owner
        self.definition = definition or DefinitionIdentity.LEGACY
        self.parameters = parameters or instance.parameters
        #: True once the run ended STOPPED because a stop was requested.
        self.stopped = False
        #: The execution's lease; partition workers lease their partitions for as long.
        self.lease = lease or ExecutionLease()
        self._keeper: LeaseKeeper | None = None
        #: Set by SIGTERM while this run is active: the run stops at its next chunk boundary.
        self._terminated = False
        #: (this run's SIGTERM handler, the one it replaced) while installed.
        self._sigterm: tuple[Any, Any] | None = None
        #: The job execution's span, in the launching process only (None without opentelemetry).
        self._probe: _telemetry.JobProbe | None = None
        if owner is not None:
            job_name = instance.job_name.value
            self._probe = _telemetry.job_started(job_name, instance.id, execution.id)
            self._keeper = LeaseKeeper(repository, execution.id, owner, self.lease, job_name)
            self._keeper.start()
            self._sigterm = _install_sigterm(self)

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
        if self._probe is not None:
            self._probe.enter()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> bool:
        error = exc
        try:
            return self._record_end(exc)
        except BaseException as raised:
            error = raised
            raise
        finally:
            if self._probe is not None:
                self._probe.ended(self.execution.status.value, error)

    def _record_end(self, exc: BaseException | None) -> bool:
        """Record how the run ended; True to swallow `exc` (a requested stop)."""
        lost = self._keeper is not None and self._keeper.lost
        self._stop_renewing()
        if lost or isinstance(exc, e.ExecutionOwnershipLost):
            # Another process recovered this execution: record nothing, touch nothing.
            self._log(
                "pybatch: job execution %s was recovered by another process; this run "
                "stops without recording how it ended",
                self.execution.id,
                level=logging.ERROR,
            )
            if exc is None:
                raise e.ExecutionOwnershipLost(id=self.execution.id)
            return False
        if isinstance(exc, e.StopRequested):
            self._finish(BatchStatus.STOPPED)
            self.stopped = True
            self._log("pybatch: job execution %s stopped on request", self.execution.id)
            return True
        try:
            self._finish(_ended_as(exc), exc)
        except e.StepsUnfinished as unfinished:  # only a run without error asks to complete
            # A server crash or failover lost a step's end (docs/contract.md, Durability of
            # commits): the run ends FAILED, and a restart resumes that step.
            self._finish(BatchStatus.FAILED, unfinished)
            raise
        except e.PyBatchError:
            if exc is None:
                raise
            message = "pybatch: could not record how job execution %s ended"
            self._log(message, self.execution.id, level=logging.ERROR, exc_info=True)
            return False
        self._log(
            "pybatch: job %s execution %s ended %s",
            self.instance.job_name.value,
            self.execution.id,
            self.execution.status.value,
        )
        return False

    def _log(
        self,
        message: str,
        *args: object,
        step: str | None = None,
        level: int = logging.INFO,
        exc_info: bool = False,
    ) -> None:
        """A lifecycle log line; its `extra=` is for a JSON formatter (never a parameter value)."""
        fields: dict[str, object] = {
            "job": self.instance.job_name.value,
            "instance": self.instance.id,
            "execution": self.execution.id,
        }
        if step is not None:
            fields["step"] = step
        logger.log(level, message, *args, extra=fields, exc_info=exc_info, stacklevel=2)

    def _verify_owner(self, uow: UnitOfWork) -> JobExecution:
        """This process still owns the execution (ExecutionOwnershipLost otherwise)."""
        if self.owner is None:
            current = uow.executions.get(self.execution.id)
            if current is None:
                raise e.JobExecutionNotFound(id=self.execution.id)
            return current
        return uow.ownership.verify_owner(self.execution.id, self.owner)

    def _finish(self, status: BatchStatus, error: BaseException | None = None) -> None:
        """End the execution as `status` (STOPPED once a stop was observed), in one statement."""
        owner, reason = self._owned(), self._reason(status, error)
        self.execution = self.repository.run_in_unit_of_work(
            lambda uow: uow.executions.end(self.execution.id, owner, status, reason)
        )

    def _owned(self) -> OwnerToken:
        """This run's owner token (ExecutionOwnershipLost in a run that owns none)."""
        if self.owner is None:
            raise e.ExecutionOwnershipLost(id=self.execution.id)
        return self.owner

    def _reason(self, status: BatchStatus, error: BaseException | None) -> FailureReason | None:
        """The failure reason a FAILED ending records for `error`, never a secret.

        A failure message never carries a parameter value or the DSN's password.
        """
        if status is not BatchStatus.FAILED or error is None:
            return None
        secrets = [str(p.value.value) for _, p in self.parameters.items()]
        password = self.repository.config.connection_kwargs().get("password")
        return failure_reason(error, [*secrets, password] if isinstance(password, str) else secrets)

    def _stop_renewing(self) -> None:
        """Stop renewing the lease and handling SIGTERM, as a process that died would."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.halt()
        sigterm, self._sigterm = self._sigterm, None
        _restore_sigterm(sigterm)

    def _at_chunk_boundary(self) -> None:
        """Raise ExecutionOwnershipLost or StopRequested before another chunk or step begins."""
        keeper = self._keeper
        if keeper is None:
            return
        if self._terminated:
            self._log("pybatch: job execution %s stops on SIGTERM", self.execution.id)
            raise e.StopRequested(id=self.execution.id)
        if keeper.lost:
            raise e.ExecutionOwnershipLost(id=self.execution.id)
        if keeper.stop_requested:
            raise e.StopRequested(id=self.execution.id)

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
        self._at_chunk_boundary()
        owner = self._owned()
        skipped, started = self.repository.run_in_unit_of_work(
            lambda uow: uow.flow.start_step(self.execution.id, owner, step_name, node, limit)
        )
        if skipped:
            self._log("pybatch: step %s completed in an earlier attempt; skipped", name, step=name)
            return StepOutcome(name=name, skipped=True, step=started)
        self._log("pybatch: step %s started (step execution %s)", name, started.id, step=name)
        step_run = StepRun(self, started)
        with contextlib.nullcontext() if step_run._probe is None else step_run._probe.current():
            with self._ended_if_raising(started.id, name), contextlib.closing(step_run):
                work(step_run)
            ended = self._end_step(started.id, BatchStatus.COMPLETED)
        self._log("pybatch: step %s ended COMPLETED", name, step=name)
        return StepOutcome(name=name, skipped=False, step=ended)

    @contextlib.contextmanager
    def _ended_if_raising(self, step_id: int, name: str) -> Iterator[None]:
        """End the step STOPPED or FAILED (`_ended_as`) if its work raises; the error propagates."""
        try:
            yield
        except e.ExecutionOwnershipLost:
            raise  # the step belongs to the recovered execution now: leave it alone
        except BaseException as error:
            status = _ended_as(error)
            try:
                self._end_step(step_id, status, error)
            except e.StepExecutionNotFound:
                # A server crash lost the step's start (docs/contract.md, Durability of commits):
                # nothing of the step committed, and the work's own error says what happened.
                self._log(
                    "pybatch: step %s lost its start in a server crash",
                    name,
                    step=name,
                    level=logging.WARNING,
                )
                raise error from None
            # The error's type only: a message may quote row values.
            message = "pybatch: step %s ended %s (%s)"
            self._log(message, name, status.value, type(error).__name__, step=name)
            raise

    def _end_step(
        self, step_id: int, status: BatchStatus, error: BaseException | None = None
    ) -> StepExecution:
        """End a step of this run as `status`, with its exit status and reason, in one statement."""
        owner, reason = self._owned(), self._reason(status, error)
        return self.repository.run_in_unit_of_work(
            lambda uow: uow.steps.end(self.execution.id, owner, step_id, status, reason)
        )

    def partitioned_step(
        self,
        name: str,
        partitions: Mapping[str, Mapping[str, Any]] | Iterable[str],
        work: Callable[[PartitionRun], None],
        *,
        workers: int = 4,
        start_limit: int | None = None,
    ) -> StepOutcome:
        """Run step `name` as partitions worked on in parallel by `workers` local processes.

        `partitions` maps each key to the context its worker reads (a range, a file), or
        lists keys. The plan commits before any worker starts; `work(partition)` runs once
        per partition like a step (chunks, checkpoint), in forked processes. Workers on other
        hosts join with `pybatch.etl.join_partitioned_step`. The step ends COMPLETED,
        or raises PartitionsFailed naming the partitions that did not complete (the job then
        fails, and a restart reruns only those). A restart carries the earlier plan.
        """
        limit = StartLimit.unrestricted() if start_limit is None else StartLimit(start_limit)
        entries = partitioned.plan_entries(partitions, ETL_STATE_SCHEMA)
        skipped, parent = partitioned.start_partitioned_step(
            self.repository, self.instance.id, self.execution.id, name, entries, limit
        )
        if skipped:
            self._log(
                "pybatch: partitioned step %s completed in an earlier attempt", name, step=name
            )
            return StepOutcome(name=name, skipped=True, step=parent)
        with self._ended_if_raising(parent.id, name):
            partitioned.supervise(
                self.repository,
                parent,
                _runners(self.instance, self.execution, work),
                workers,
                lease=self.lease,
                between_polls=self._at_chunk_boundary,
            )
        ended, unfinished = partitioned.aggregate_plan(self.repository, parent, self._verify_owner)
        if ended.status is not BatchStatus.COMPLETED:
            raise e.PartitionsFailed(
                step_name=name, status=ended.status.value, keys=tuple(unfinished)
            )
        return StepOutcome(name=name, skipped=False, step=ended)

    def _flow(self) -> FlowPoint:
        return FlowPoint(
            self.repository,
            self.instance.id,
            self.execution.id,
            self.definition,
            self.parameters.flow_input_digest(),
        )

    def next_after(self, outcome: StepOutcome) -> FlowTarget:
        """Record and return where the flow goes after a step (a flow definition's manifest).

        A step completed in an earlier attempt reuses that attempt's decision.
        """
        return self._flow().after_step(outcome.step, reused=outcome.skipped).target

    def decide(self, node: str, decider: Callable[[JobRun], str]) -> FlowTarget:
        """Run a decision node: `decider(run)` returns an exit code the manifest routes on.

        A decision recorded for the node in an earlier attempt, on the same definition and
        parameters, is reused: `decider` is not called again.
        """
        return self._flow().decide(NodeId(node), lambda: decider(self)).target

    def run_flow(
        self,
        start: str,
        steps: Mapping[str, Callable[[StepRun], None]],
        deciders: Mapping[str, Callable[[JobRun], str]] | None = None,
    ) -> TerminalKind:
        """Run the flow graph of the job's definition from `start` to a terminal state.

        Each node is a step in `steps` or a decider in `deciders`; after each, the manifest
        selects the next node and the choice is recorded. A step that raises fails the job as
        in `step`. Returns the terminal kind; `FAIL` raises FlowEndedInFailure, so the run
        ends FAILED and a restart resumes the flow.
        """
        node, visited = start, set()
        deciders = deciders or {}
        while True:
            if node in visited:
                raise e.FlowStateCorrupt()
            visited.add(node)
            if node in deciders:
                target = self.decide(node, deciders[node])
            else:
                target = self.next_after(self.step(node, steps[node]))
            if target.terminal is TerminalKind.FAIL:
                raise e.FlowEndedInFailure(node_id=node)
            if target.terminal is not None:
                return target.terminal
            if target.node is None:  # a FlowTarget is a node or a terminal; never reached
                raise e.FlowStateCorrupt()
            node = target.node.value


def _ended_as(error: BaseException | None) -> BatchStatus:
    """COMPLETED, FAILED, or STOPPED (restartable) after a stop request or an interrupt."""
    if error is None:
        return BatchStatus.COMPLETED
    if isinstance(error, e.StopRequested) or not isinstance(error, Exception):
        return BatchStatus.STOPPED
    return BatchStatus.FAILED


def _install_sigterm(run: JobRun) -> tuple[Any, Any] | None:
    """Make SIGTERM (what a container orchestrator sends) stop `run` at its next chunk boundary.

    Only the main thread can set a handler: None there, else (the handler, the one it replaced).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    installed_by = os.getpid()

    def on_sigterm(signum: int, frame: object) -> None:
        if os.getpid() != installed_by:  # a forked partition worker: SIGTERM ends it, as before
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        run._terminated = True  # no logging here: a handler may interrupt a logging call

    return on_sigterm, signal.signal(signal.SIGTERM, on_sigterm)


def _restore_sigterm(installed: tuple[Any, Any] | None) -> None:
    """Put back the handler `_install_sigterm` replaced, unless another was set since."""
    if installed is None or threading.current_thread() is not threading.main_thread():
        return
    handler, previous = installed
    if signal.getsignal(signal.SIGTERM) is handler:  # None: set outside Python, use the default
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


class Job:
    """A job by name and identifying parameters: what `launch` starts or restarts.

    `run_id` (1 and up) adds the identifying parameter `run.id`: a job that runs many times
    for the same key (a business date reloaded on purpose) launches each run with a new one,
    as Spring Batch's run id incrementer does. Without it a COMPLETED instance is refused.
    `lease` (1 s to 1 h, default 10 s, or PYBATCH_LEASE_SECONDS when set) bounds how long a
    crashed run blocks its restart: a launch recovers an unresolved attempt only once its
    lease ran out (`launch`), and says at INFO what it waits for meanwhile.
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
        run_id: int | None = None,
    ) -> None:
        self.repository = repository
        if not isinstance(parameters, JobParameters):
            parameters = JobParameters.of(dict(parameters or {}))
        if run_id is not None:
            # A COMPLETED instance never runs again; a new run id names a new instance.
            if type(run_id) is not int or not 1 <= run_id <= INT64_MAX:
                raise e.RunIdInvalid()
            run = JobParameters.of({RUN_ID_PARAMETER: run_id})
            parameters = JobParameters.from_pairs([*parameters.entries, *run.entries])
        self.key = JobInstanceKey(JobName(name), parameters)
        self.definition = definition or DefinitionIdentity.LEGACY
        self.recover_orphans = recover_orphans
        if lease is None:
            lease = _lease_from_environment()
        self.lease = lease if isinstance(lease, ExecutionLease) else ExecutionLease(lease)

    def launch(self) -> JobRun:
        """Start the first attempt, or restart after FAILED or STOPPED, and mark it STARTED.

        An unresolved attempt whose lease expires while the launch watches it is recovered
        here (docs/etl-guide.md, Crashes and restarts).

        Raises:
            CompletedInstance, AbandonedInstance: the instance never runs again.
            ExecutionAlreadyActive: another live process runs this instance (its lease was
                renewed while the launch watched it), or the unresolved attempt is UNKNOWN
                and needs explicit recovery with reason UNKNOWN_EFFECT (`pybatch recover`).
        """
        owner, key, definition = OwnerToken.generate(), self.key, self.definition
        known: list[int | None] = [None]  # the definition's id, once registered here
        seen_expiry: _dt.datetime | None = None
        deadline = time.monotonic() + self.lease.duration.total_seconds() + 1.0
        next_report = 0.0
        while True:
            # One statement (uow.ownership.launch); the slow paths below loop back to it.
            instance, blocking, lease = self.repository.run_in_unit_of_work(
                lambda uow: uow.ownership.launch(key, definition, owner, self.lease, known[0])
            )
            if instance is not None and blocking is not None:
                break
            if blocking is None or lease is None:  # registered once, then launched
                known[0] = self.repository.run_in_unit_of_work(
                    lambda uow: uow.definitions.register(key.job_name, definition)
                )
                continue
            active = e.ExecutionAlreadyActive(
                instance_id=blocking.job_instance_id,
                execution_id=blocking.id,
                status=blocking.status.value,
            )
            # UNKNOWN is never recovered here (its commit may have happened: only an explicit
            # recovery with reason UNKNOWN_EFFECT resolves it); otherwise the lease decides.
            if not self.recover_orphans or not blocking.status.is_active:
                raise active
            if lease.owner_gone:
                self.repository.run_in_unit_of_work(partial(self._recover, orphan=blocking.id))
                continue
            expires = lease.lease_expires_at
            renewed = seen_expiry is not None and expires is not None and expires > seen_expiry
            if renewed or time.monotonic() > deadline:
                raise active
            if seen_expiry is None:
                seen_expiry = expires
                deadline = time.monotonic() + lease.remaining_seconds + 1.0
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + _LEASE_REPORT_SECONDS
                logger.info(
                    "pybatch: waiting for the lease of job execution %s (its owner may be "
                    "gone): %.1f s left before it can be recovered",
                    blocking.id,
                    max(0.0, deadline - 1.0 - time.monotonic()),
                    extra={"job": key.job_name.value},
                )
            time.sleep(_LEASE_POLL_SECONDS)
        run = JobRun(
            self.repository, instance, blocking, owner, self.lease, definition, key.parameters
        )
        message = "pybatch: job %s instance %s attempt %s started (execution %s)"
        run._log(message, instance.job_name.value, instance.id, blocking.attempt, blocking.id)
        return run

    def _recover(self, uow: UnitOfWork, orphan: int) -> None:
        """Record FAILED (OWNER_LOST), audited, for an attempt whose owner is still gone.

        Under the execution's lock the lease is judged again: a renewal meanwhile, or another
        process that recovered it first, leaves it alone (the launch then sees why).
        """
        execution, lease = uow.ownership.lock(orphan)
        if not execution.status.is_active or not lease.owner_gone:
            return
        uow.recovery.recover_orphaned(orphan, audited=True)
        _telemetry.recovered("OWNER_LOST", self.key.job_name.value)
        logger.warning(
            "pybatch: job execution %s had no live owner (%s); recorded FAILED (OWNER_LOST)",
            orphan,
            "lease expired" if lease.has_lease else "no lease",
            extra={
                "job": self.key.job_name.value,
                "instance": execution.job_instance_id,
                "execution": orphan,
            },
        )


#: How often a launch re-reads a lease it waits on, and how often it says it still waits.
_LEASE_POLL_SECONDS = 0.2
_LEASE_REPORT_SECONDS = 2.0
#: The identifying parameter `Job(run_id=...)` adds.
RUN_ID_PARAMETER = "run.id"
#: The lease `Job` uses when none is given, in seconds (the test plugin's JobRunner sets it).
LEASE_ENVIRONMENT = "PYBATCH_LEASE_SECONDS"


def _lease_from_environment() -> ExecutionLease:
    """The default lease, or PYBATCH_LEASE_SECONDS when set (a kill test's short lease)."""
    text = os.environ.get(LEASE_ENVIRONMENT, "").strip()
    if not text:
        return ExecutionLease()
    try:
        return ExecutionLease(_dt.timedelta(seconds=float(text)))
    except (ValueError, OverflowError):
        raise e.EnvironmentValueInvalid(
            variable=LEASE_ENVIRONMENT, expected="lease in seconds (1 to 3600)"
        ) from None


def _runners(
    instance: JobInstance, execution: JobExecution, work: Callable[[PartitionRun], None]
) -> partitioned.RunnerFactory:
    """How a worker process (local or joined) turns a claimed partition into `work(...)`."""

    def runner(
        run: JobRun,
        worker: StepExecution,
        partition: StepPartition,
        keeper: PartitionLeaseKeeper,
        state: CommittedStepState | None,
    ) -> None:
        partition_run = PartitionRun(run, worker, partition, keeper, state)
        with contextlib.closing(partition_run):
            work(partition_run)

    # A worker's run owns no lease: its partitions' keepers fence its chunks.
    return lambda repository: partial(runner, JobRun(repository, instance, execution, None))


def join_partitioned_step(
    repository: JobRepository,
    job_name: str,
    parameters: Mapping[str, str | int | bool] | JobParameters,
    step_name: str,
    work: Callable[[PartitionRun], None],
    *,
    wait_seconds: float = 60.0,
    poll_seconds: float = partitioned.POLL_SECONDS,
    lease: _dt.timedelta | ExecutionLease | None = None,
) -> int:
    """Join a running partitioned step from any host: the worker entry point.

    Waits up to `wait_seconds` for the running attempt of the instance to publish the plan of
    `step_name`, then works on it like a local worker; returns how many partitions it ran (0
    at once when the step already completed). `lease` (as `Job`'s) is this worker's lease on
    each partition it runs: after a crash its partition is recovered at most that long after.

    Raises:
        PartitionPlanNotPublished: no running attempt published that step's plan in time.
    """
    if not isinstance(parameters, JobParameters):
        parameters = JobParameters.of(dict(parameters))
    key = JobInstanceKey(JobName(job_name), parameters)
    deadline = time.monotonic() + wait_seconds
    while (found := partitioned.find_running_parent(repository, key, StepName(step_name))) is None:
        if time.monotonic() >= deadline:
            raise e.PartitionPlanNotPublished(
                job_name=job_name, step_name=step_name, waited_seconds=wait_seconds
            )
        time.sleep(poll_seconds)
    if found == partitioned.PLAN_FINISHED:
        return 0
    instance, execution, parent = found
    runner = _runners(instance, execution, work)(repository)
    worker_lease = lease if isinstance(lease, ExecutionLease | None) else ExecutionLease(lease)
    return partitioned.work_on_plan(
        repository, parent, runner, poll_seconds=poll_seconds, lease=worker_lease
    )
