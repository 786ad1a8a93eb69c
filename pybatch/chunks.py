"""Chunk transactions: business writes and step progress in one COMMIT (behaviour.md 4.15).

A chunk transaction owns one pooled connection. The ETL runs its own statements on it
(`execute`, `executemany`, `copy`, or the raw `connection`), then `commit` writes the
step's counters, checkpoint and context as one compare-and-swap UPDATE and COMMITs, so a
crash at any instant leaves either the whole chunk or none of it.

Statements: chunks.sql begin_step_chunk, update_step_chunk_commit, get_step_chunk_state.
The two per-chunk statements run prepared on the chunk's connection (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from pybatch import _sqlstate
from pybatch.codecs._jsonb import CanonicalJsonb, to_jsonb
from pybatch.codecs._primitives import DecodeError, decode_enum, decode_int64
from pybatch.codecs.executions import decode_checkpoint, decode_context, decode_counts
from pybatch.errors import (
    ChunkCommitOutcomeUnknown,
    CountExhausted,
    FaultStateCorrupt,
    FaultStateFormatError,
    NotCommitted,
    PyBatchError,
    StepExecutionNotFound,
    Unavailable,
)
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.ids import IdentifierKind, check_counter, check_identifier
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus

if TYPE_CHECKING:
    from pybatch.repository import JobRepository

__all__ = [
    "ChunkCommitReceipt",
    "ChunkContext",
    "ChunkCounts",
    "ChunkStateProvider",
    "ChunkTransaction",
    "ChunkTransactionManager",
    "CommittedStepState",
    "FaultProgress",
    "InheritedProgress",
]

_EMPTY_FAULT_STATE_CHECKSUM = FaultStateEnvelope.EMPTY.checksum()


def _as_is(canonical: bytes) -> bytes:
    return canonical


def _canonical_jsonb(canonical: bytes) -> CanonicalJsonb:
    """Bind JSON bytes that are already canonical as jsonb, without parsing and re-encoding."""
    return CanonicalJsonb(canonical, dumps=_as_is)


# Every chunk commit writes the empty fault state: its canonical payload is encoded once
# (the same bytes `to_jsonb` would produce on every commit).
_EMPTY_FAULT_STATE_PAYLOAD = _canonical_jsonb(FaultStateEnvelope.EMPTY.canonical_bytes())


def _count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int:
        raise TypeError(f"{attribute.name} is an int")
    check_counter(attribute.name, value)


@attrs.frozen
class ChunkContext:
    """Which step (of which job execution) a chunk belongs to."""

    step_execution_id: int
    job_execution_id: int

    def __attrs_post_init__(self) -> None:
        check_identifier(IdentifierKind.STEP_EXECUTION, self.step_execution_id)
        check_identifier(IdentifierKind.JOB_EXECUTION, self.job_execution_id)


@attrs.frozen(kw_only=True)
class ChunkCounts:
    """What one chunk did: items read, processed, written and filtered."""

    read: int = attrs.field(default=0, validator=_count)
    processed: int = attrs.field(default=0, validator=_count)
    written: int = attrs.field(default=0, validator=_count)
    filtered: int = attrs.field(default=0, validator=_count)


@attrs.frozen(kw_only=True)
class FaultProgress:
    """Skips and no-rollback retries of one chunk, added to the step's totals at commit."""

    read_skips: int = attrs.field(default=0, validator=_count)
    process_skips: int = attrs.field(default=0, validator=_count)
    write_skips: int = attrs.field(default=0, validator=_count)
    no_rollbacks: int = attrs.field(default=0, validator=_count)


_NO_FAULT_PROGRESS = FaultProgress()


@attrs.frozen
class ChunkCommitReceipt:
    """The durable state a chunk commits: its checkpoint and execution context."""

    checkpoint: Checkpoint
    context: ExecutionContext


@attrs.frozen(kw_only=True)
class CommittedStepState:
    """A step's last committed progress: where a chunk starts and a restart resumes."""

    step_execution_id: int
    job_execution_id: int
    status: BatchStatus
    version: int
    counts: ExecutionCounts
    checkpoint: Checkpoint
    context: ExecutionContext
    fault_state: FaultStateEnvelope


@attrs.frozen(kw_only=True)
class InheritedProgress:
    """What a restarted step inherits: items read, checkpoint generation, retained retries."""

    read_count: int
    checkpoint_digest: bytes
    fault_state: FaultStateEnvelope


class ChunkStateProvider(Protocol):
    """Produces the checkpoint and context to commit with a chunk (the seed's provider)."""

    def state_for_commit(
        self, committed_counts: ExecutionCounts, chunk_counts: ChunkCounts
    ) -> ChunkCommitReceipt:
        """The state to commit; raising makes the chunk roll back with NotCommitted."""
        ...


def _decode_state(row: Mapping[str, Any]) -> CommittedStepState:
    """Decode a chunk-state row; a bad fault envelope is FaultStateCorrupt, the rest Unavailable."""
    try:
        fault_state = FaultStateEnvelope.from_columns(
            row["fault_state_format"],
            row["fault_state_schema"],
            row["fault_state_schema_version"],
            row["fault_state_payload"],
            row["fault_state_checksum"],
        )
    except (FaultStateFormatError, ValueError, TypeError):
        raise FaultStateCorrupt() from None
    try:
        return CommittedStepState(
            step_execution_id=decode_int64(row["id"], column="id", minimum=1),
            job_execution_id=decode_int64(
                row["job_execution_id"], column="job_execution_id", minimum=1
            ),
            status=decode_enum(BatchStatus, row["status"], column="status"),
            version=decode_int64(row["version"], column="version", minimum=0),
            counts=decode_counts(row),
            checkpoint=decode_checkpoint(row),
            context=decode_context(row),
            fault_state=fault_state,
        )
    except (DecodeError, PyBatchError):
        raise Unavailable() from None


class ChunkTransaction:
    """One open chunk: business statements plus the step's progress, committed together."""

    def __init__(
        self,
        manager: ChunkTransactionManager,
        conn: psycopg.Connection[Any],
        state: CommittedStepState,
    ) -> None:
        self._manager = manager
        self._conn: psycopg.Connection[Any] | None = conn
        self.committed: CommittedStepState = state

    def __repr__(self) -> str:
        return (
            f"ChunkTransaction(step_execution_id={self.committed.step_execution_id}, "
            f"version={self.committed.version}, open={self._conn is not None})"
        )

    def __enter__(self) -> ChunkTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.rollback()

    # ------------------------------------------------------------------ business statements

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The chunk's connection, for the ETL's own statements (they commit with the chunk).

        Errors raised through it are psycopg's own; `execute`, `executemany` and `copy`
        classify them into Rejected, Cancelled and Infrastructure instead.
        """
        if self._conn is None:
            raise NotCommitted(reason="the chunk is closed")
        return self._conn

    @contextmanager
    def _business(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self.connection
        try:
            yield conn
        except psycopg.Error as error:
            classified = _sqlstate.classify_business_error(error, conn)
            if classified.__class__.__name__ == "Infrastructure":
                self._close(discard=True)
            raise classified from None

    def execute(self, query: Any, params: Sequence[Any] | Mapping[str, Any] | None = None) -> int:
        """Run one business statement in the chunk; return its row count."""
        with self._business() as conn, conn.cursor() as cursor:
            cursor.execute(query, params)
            return cursor.rowcount

    def executemany(
        self, query: Any, rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]]
    ) -> int:
        """Run one business statement once per row (pipelined); return the rows affected."""
        with self._business() as conn, conn.cursor() as cursor:
            cursor.executemany(query, rows)
            return cursor.rowcount

    def copy(self, statement: Any, rows: Iterator[Sequence[Any]] | Sequence[Sequence[Any]]) -> int:
        """COPY rows in (e.g. `COPY t (a, b) FROM STDIN`); return how many were sent."""
        sent = 0
        with self._business() as conn, conn.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
                sent += 1
        return sent

    # ------------------------------------------------------------------ outcome

    def commit(
        self,
        counts: ChunkCounts,
        fault_progress: FaultProgress | None = None,
        *,
        checkpoint: Checkpoint | None = None,
        context: ExecutionContext | None = None,
    ) -> CommittedStepState:
        """Commit the chunk: business writes, counters, checkpoint and context at once.

        The checkpoint and context come from the arguments, or else from the manager's
        state provider. Context defaults to the committed one.

        Raises:
            NotCommitted: a business statement failed, the step changed or left STARTED,
                a counter would overflow, the provider failed, or COMMIT was refused;
                nothing of the chunk is durable.
            ChunkCommitOutcomeUnknown: the COMMIT acknowledgement was lost.
        """
        conn = self.connection
        state = self.committed
        progress = fault_progress or _NO_FAULT_PROGRESS
        try:
            if conn.info.transaction_status == TransactionStatus.INERROR:
                raise NotCommitted(reason="a statement in the chunk failed")
            try:
                chunk = ExecutionCounts(
                    read=counts.read,
                    processed=counts.processed,
                    written=counts.written,
                    filtered=counts.filtered,
                    committed=1,
                )
                next_counts = state.counts.plus(chunk)
            except (CountExhausted, PyBatchError):
                raise NotCommitted(reason="a counter would overflow") from None
            receipt = self._receipt(state, counts, checkpoint, context)
            # The committed context, carried over unchanged, goes back as the canonical bytes
            # it was decoded to (canonical JSON of a jsonb document re-encodes to itself).
            context_payload = (
                _canonical_jsonb(state.context.payload_json())
                if receipt.context is state.context
                else to_jsonb(receipt.context.payload)
            )
            params = {
                "read_count": next_counts.read,
                "processed_count": next_counts.processed,
                "write_count": next_counts.written,
                "filter_count": next_counts.filtered,
                "commit_count": next_counts.committed,
                "checkpoint_schema": receipt.checkpoint.schema.value,
                "checkpoint_schema_version": receipt.checkpoint.schema_version,
                "checkpoint_payload": to_jsonb(receipt.checkpoint.payload),
                "context_schema": receipt.context.schema.value,
                "context_schema_version": receipt.context.schema_version,
                "context_payload": context_payload,
                "read_skips": progress.read_skips,
                "process_skips": progress.process_skips,
                "write_skips": progress.write_skips,
                "no_rollbacks": progress.no_rollbacks,
                "fault_state_payload": _EMPTY_FAULT_STATE_PAYLOAD,
                "fault_state_checksum": _EMPTY_FAULT_STATE_CHECKSUM,
                "now": self._manager.clock.now(),
                "step_execution_id": state.step_execution_id,
                "job_execution_id": state.job_execution_id,
                "expected_version": state.version,
            }
        except NotCommitted:
            self.rollback()
            raise
        try:
            changed = self._manager.statements.update_step_chunk_commit.run(
                conn, params, prepare=True
            )
        except psycopg.Error as error:
            lost = _sqlstate.is_connection_loss(error, conn)
            self._close(discard=lost) if lost else self.rollback()
            raise NotCommitted(reason="the progress update failed") from None
        if changed != 1:
            self.rollback()
            raise NotCommitted(reason="the step changed or is no longer STARTED")
        try:
            conn.commit()
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                self._close(discard=True)
                raise ChunkCommitOutcomeUnknown() from None
            self.rollback()
            raise NotCommitted(reason="COMMIT was refused") from None
        self._close(discard=False)
        self.committed = attrs.evolve(
            state,
            version=state.version + 1,
            counts=next_counts,
            checkpoint=receipt.checkpoint,
            context=receipt.context,
            fault_state=FaultStateEnvelope.EMPTY,
        )
        return self.committed

    def _receipt(
        self,
        state: CommittedStepState,
        counts: ChunkCounts,
        checkpoint: Checkpoint | None,
        context: ExecutionContext | None,
    ) -> ChunkCommitReceipt:
        if checkpoint is not None:
            return ChunkCommitReceipt(checkpoint, context if context is not None else state.context)
        provider = self._manager.state_provider
        if provider is None:
            raise NotCommitted(reason="no checkpoint and no state provider")
        try:
            receipt = provider.state_for_commit(state.counts, counts)
        except Exception:
            raise NotCommitted(reason="the state provider failed") from None
        if not isinstance(receipt, ChunkCommitReceipt):
            raise NotCommitted(reason="the state provider returned no receipt")
        return receipt

    def rollback(self) -> None:
        """Discard the chunk's business writes and progress; a second call is a no-op."""
        conn = self._conn
        if conn is None:
            return
        if conn.broken or conn.closed:
            self._close(discard=True)
            return
        try:
            conn.rollback()
        except psycopg.Error:
            self._close(discard=True)
            return
        self._close(discard=False)

    def _close(self, *, discard: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._manager.repository._release(conn, discard=discard)


class ChunkTransactionManager:
    """Opens chunk transactions for STARTED steps of one repository."""

    def __init__(
        self, repository: JobRepository, state_provider: ChunkStateProvider | None = None
    ) -> None:
        self.repository = repository
        self.statements = repository.statements
        self.clock = repository.clock
        self.state_provider = state_provider

    def begin(self) -> ChunkTransaction:
        """A chunk needs a step: without a context nothing can commit."""
        raise NotCommitted(reason="a chunk transaction needs a step execution context")

    def begin_for(self, context: ChunkContext) -> ChunkTransaction:
        """Open a chunk for a STARTED step, reading its committed state (not locked).

        Raises:
            NotCommitted: the step is missing, undecodable or not STARTED, or the
                database is unreachable.
        """
        repository = self.repository
        try:
            conn = repository._acquire()
        except Unavailable:
            raise NotCommitted(reason="the database is unavailable") from None
        config = repository.config
        try:
            row = self.statements.begin_step_chunk.run(
                conn,
                {
                    "statement_timeout_ms": str(config.statement_timeout_ms),
                    "lock_timeout_ms": str(config.lock_timeout_ms),
                    "idle_transaction_timeout_ms": str(config.idle_transaction_timeout_ms),
                    "step_execution_id": context.step_execution_id,
                    "job_execution_id": context.job_execution_id,
                },
                prepare=True,
            )
        except psycopg.Error:
            repository._release(conn, discard=True)
            raise NotCommitted(reason="the database is unavailable") from None
        try:
            if row is None:
                raise NotCommitted(reason="the step execution does not exist")
            state = _decode_state(row)
            if state.status is not BatchStatus.STARTED:
                raise NotCommitted(reason=f"the step is {state.status.value}, not STARTED")
        except PyBatchError as error:
            conn.rollback()
            repository._release(conn, discard=False)
            if isinstance(error, NotCommitted):
                raise
            raise NotCommitted(reason="the committed step state is unusable") from None
        return ChunkTransaction(self, conn, state)

    def begin_after(self, committed: CommittedStepState) -> ChunkTransaction:
        """Open the next chunk of a step from the state this process just committed.

        No statement runs until the chunk's own: the step is not re-read, because the
        commit is a compare-and-swap on the committed version and STARTED, so any change
        made meanwhile (a stop, a recovery, another writer) still refuses the chunk, at
        commit instead of at begin. Pooled connections carry the configured timeouts as
        session defaults, and BEGIN is READ COMMITTED explicitly.

        Raises:
            NotCommitted: the database is unreachable.
        """
        try:
            conn = self.repository._acquire()
        except Unavailable:
            raise NotCommitted(reason="the database is unavailable") from None
        return ChunkTransaction(self, conn, committed)

    def load_committed_state(self, context: ChunkContext) -> CommittedStepState:
        """The step's committed state, read in its own read-only transaction.

        Raises:
            StepExecutionNotFound: no such step in that job execution.
            FaultStateCorrupt: the retained fault state is unusable.
            Unavailable: other undecodable state, or the database is unreachable.
        """
        with self.repository.read_transaction() as conn:
            row = self.statements.get_step_chunk_state(
                conn,
                step_execution_id=context.step_execution_id,
                job_execution_id=context.job_execution_id,
            )
        if row is None:
            raise StepExecutionNotFound(id=context.step_execution_id)
        return _decode_state(row)

    def inherited_progress(self, context: ChunkContext) -> InheritedProgress:
        """What a (restarted) step resumes from; refuses fault state of a superseded checkpoint.

        Raises:
            NotCommitted: the state cannot be loaded, or retained retries belong to another
                checkpoint generation (no work may begin).
        """
        try:
            state = self.load_committed_state(context)
        except PyBatchError:
            raise NotCommitted(reason="the committed step state is unusable") from None
        digest = state.checkpoint.generation_digest()
        if not state.fault_state.is_empty and state.fault_state.checkpoint_digest != digest:
            raise NotCommitted(reason="retained retries belong to a superseded checkpoint")
        return InheritedProgress(
            read_count=state.counts.read, checkpoint_digest=digest, fault_state=state.fault_state
        )
