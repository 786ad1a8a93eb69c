"""Chunk transactions: business writes and step progress in one COMMIT.

See docs/contract.md, Chunk transactions.

A chunk transaction leases one pooled connection. The ETL runs its own statements on it
(`execute`, `executemany`, `copy`, or the raw `connection`), then `commit` writes the
step's counters, checkpoint and context as one compare-and-swap UPDATE and COMMITs, so a
crash at any instant leaves either the whole chunk or none of it. A manager made with
`hold_connection` keeps that connection leased from one chunk of a step to the next
(`close` gives it back), so a chunk costs no pool checkout and its prepared commit
statement is reused.

Statements: chunks.sql get_step_chunk_state, update_step_chunk_commit,
update_step_chunk_progress. All run prepared on the chunk's connection (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from pybatch import _sqlstate
from pybatch._connect import check_idle_connection
from pybatch._statements import Connection, Statement
from pybatch._transaction import CommitErrors, Lease
from pybatch.codecs.chunks import (
    decode_committed_step_state,
    encode_chunk_commit,
    encode_chunk_progress,
)
from pybatch.errors import (
    ChunkCommitOutcomeUnknown,
    CountExhausted,
    Infrastructure,
    NotCommitted,
    PyBatchError,
    StepExecutionNotFound,
    Unavailable,
)
from pybatch.values.chunks import (
    NO_FAULT_PROGRESS,
    ChunkCommitReceipt,
    ChunkContext,
    ChunkCounts,
    ChunkStateProvider,
    CommittedStepState,
    FaultProgress,
    InheritedProgress,
)
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.state import MAX_STORABLE_SCHEMA_VERSION, Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus

if TYPE_CHECKING:
    from pybatch.job_repository import JobRepository

__all__ = ["ChunkTransaction", "ChunkTransactionManager"]


def _not_committed(reason: str) -> NotCommitted:
    return NotCommitted(reason=reason)


#: libpq's transaction states, compared on `pgconn` directly: `conn.info` builds an object per
#: access, and the chunk path reads the state on every chunk.
_IDLE = TransactionStatus.IDLE
_INERROR = TransactionStatus.INERROR

#: How a chunk reports a COMMIT that did not make it durable.
_COMMIT_ERRORS = CommitErrors(
    aborted=lambda: _not_committed("a statement in the chunk failed"),
    refused=lambda _error: _not_committed("COMMIT was refused"),
    unknown=ChunkCommitOutcomeUnknown,
)


class ChunkTransaction:
    """One open chunk: business statements plus the step's progress, committed together."""

    __slots__ = ("_context", "_cursor", "_held", "_lease", "_manager", "_open", "committed")

    def __init__(
        self,
        manager: ChunkTransactionManager,
        lease: Lease,
        context: ChunkContext,
        state: CommittedStepState,
        *,
        held: bool = False,
        cursor: psycopg.Cursor[Any] | None = None,
    ) -> None:
        self._manager = manager
        #: The step and the owner whose ownership the commit proves (the fence).
        self._context = context
        self._lease = lease
        #: Whether the lease outlives this chunk (the step's held connection).
        self._held = held
        #: The cursor the chunk's own statements and its progress UPDATE run on: the held
        #: connection's, kept from chunk to chunk, or one made for this chunk on first use.
        self._cursor = cursor
        self._open = True
        #: The step's committed state: where this chunk started, and after `commit` the
        #: state it committed (what the next chunk of the step starts from).
        self.committed: CommittedStepState = state

    def __repr__(self) -> str:
        return (
            f"ChunkTransaction(step_execution_id={self.committed.step_execution_id}, "
            f"version={self.committed.version}, open={self.is_open})"
        )

    @property
    def is_open(self) -> bool:
        """Whether the chunk can still run statements and commit."""
        return self._open and self._lease.is_open

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
    def connection(self) -> Connection:
        """The chunk's connection, for the ETL's own statements (they commit with the chunk).

        Errors raised through it are psycopg's own; `execute`, `executemany` and `copy`
        classify them into Rejected, Cancelled and Infrastructure instead.
        """
        conn = self._lease.connection
        if conn is None or not self._open:
            raise NotCommitted(reason="the chunk is closed")
        return conn

    def _chunk_cursor(self) -> psycopg.Cursor[Any]:
        """The cursor of the chunk's connection (made on first use when none is held)."""
        conn = self.connection
        cursor = self._cursor
        if cursor is None:
            cursor = self._cursor = conn.cursor()
        return cursor

    def _classified(self, error: psycopg.Error) -> PyBatchError:
        """A business statement's error as Rejected, Cancelled or Infrastructure.

        An Infrastructure error discards the connection: it can no longer be trusted.
        """
        conn = self._lease.connection
        classified = _sqlstate.classify_business_error(error, conn)
        if isinstance(classified, Infrastructure):
            self._discard()
        return classified

    def execute(self, query: Any, params: Sequence[Any] | Mapping[str, Any] | None = None) -> int:
        """Run one business statement in the chunk; return its row count.

        It runs on a cursor of its own, closed at once, so rows it returns are not kept.
        """
        conn = self.connection
        try:
            with conn.cursor() as cursor:
                cursor.execute(query, params)
                return cursor.rowcount
        except psycopg.Error as error:
            raise self._classified(error) from None

    def executemany(
        self, query: Any, rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]]
    ) -> int:
        """Run one business statement once per row (pipelined); return the rows affected."""
        cursor = self._chunk_cursor()
        try:
            cursor.executemany(query, rows)
        except psycopg.Error as error:
            raise self._classified(error) from None
        return cursor.rowcount

    def copy(self, statement: Any, rows: Iterable[Sequence[Any]]) -> int:
        """COPY rows in (e.g. `COPY t (a, b) FROM STDIN`); return how many were sent."""
        cursor = self._chunk_cursor()
        try:
            with cursor.copy(statement) as copy:
                write_row = copy.write_row
                if isinstance(rows, list | tuple):  # its length is known: no count per row
                    for row in rows:
                        write_row(row)
                    return len(rows)
                sent = 0
                for row in rows:
                    write_row(row)
                    sent += 1
        except psycopg.Error as error:
            raise self._classified(error) from None
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
        cursor = self._chunk_cursor()
        state = self.committed
        # Read once: no statement runs between here and the progress UPDATE.
        transaction_status = cursor.connection.pgconn.transaction_status
        try:
            if transaction_status == _INERROR:
                raise NotCommitted(reason="a statement in the chunk failed")
            try:
                next_counts = state.counts.after_chunk(
                    counts.read, counts.processed, counts.written, counts.filtered
                )
            except (CountExhausted, PyBatchError):
                raise NotCommitted(reason="a counter would overflow") from None
            receipt = self._receipt(state, counts, checkpoint, context)
            if (
                receipt.checkpoint.schema_version > MAX_STORABLE_SCHEMA_VERSION
                or receipt.context.schema_version > MAX_STORABLE_SCHEMA_VERSION
            ):
                raise NotCommitted(
                    reason="a state schema version above 2147483647 cannot be stored"
                )
            progress = fault_progress or NO_FAULT_PROGRESS
            now = self._manager.clock.now()
            statements = self._manager.statements
            # The common chunk (same context, no skips, no retained retries) writes only its
            # counters and checkpoint: every other column already holds what the full
            # statement would write, as the version guard proves (chunks.sql).
            if (
                receipt.context is state.context
                and state.fault_state is FaultStateEnvelope.EMPTY
                and (progress is NO_FAULT_PROGRESS or progress == NO_FAULT_PROGRESS)
            ):
                statement = statements.update_step_chunk_progress
                params = encode_chunk_progress(self._context, state, next_counts, receipt, now)
            else:
                statement = statements.update_step_chunk_commit
                params = encode_chunk_commit(
                    self._context, state, next_counts, receipt, progress, now
                )
        except NotCommitted:
            self.rollback()
            raise
        # A chunk that sent no statement of its own (checkpoint-only) is the UPDATE alone: as
        # one autocommit statement it is atomic by itself and commits in one round trip
        # instead of BEGIN, UPDATE, COMMIT. A lost connection then leaves its outcome unknown.
        alone = transaction_status == _IDLE
        try:
            changed = _run_progress_update(statement, cursor, params, autocommit=alone)
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, cursor.connection):
                self._discard()
                if alone:
                    raise ChunkCommitOutcomeUnknown() from None
            else:
                self.rollback()
            raise NotCommitted(reason="the progress update failed") from None
        if changed != 1:
            self.rollback()
            raise NotCommitted(
                reason="the step changed, is no longer STARTED, or its owner lost it"
            )
        self._open = False
        self._lease.commit(_COMMIT_ERRORS, keep=self._held)
        self.committed = CommittedStepState(
            step_execution_id=state.step_execution_id,
            job_execution_id=state.job_execution_id,
            status=state.status,
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
        if self._open:
            self._open = False
            self._lease.rollback(keep=self._held)

    def _discard(self) -> None:
        self._open = False
        self._lease.discard()


class ChunkTransactionManager:
    """Opens chunk transactions for STARTED steps of one repository."""

    def __init__(
        self,
        repository: JobRepository,
        state_provider: ChunkStateProvider | None = None,
        *,
        hold_connection: bool = False,
    ) -> None:
        self.repository = repository
        self.statements = repository.statements
        self.clock = repository.clock
        self.state_provider = state_provider
        self._hold_connection = hold_connection
        #: The connection kept between chunks (hold_connection), its cursor, and the chunk
        #: using it.
        self._held: Lease | None = None
        self._held_cursor: psycopg.Cursor[Any] | None = None
        self._held_by: ChunkTransaction | None = None

    def begin(self) -> ChunkTransaction:
        """A chunk needs a step: without a context nothing can commit."""
        raise NotCommitted(reason="a chunk transaction needs a step execution context")

    def _lease(self) -> tuple[Lease, bool]:
        """A lease for the next chunk, and whether it is the held one (kept after the chunk).

        The held connection serves one chunk at a time; a chunk opened while another of the
        manager's chunks is still open gets a pooled connection of its own.
        """
        held = self._held
        if held is not None and held.is_open:
            busy = self._held_by is not None and self._held_by.is_open
            if not busy and _still_alive(held):
                return held, True
        try:
            lease = self.repository.transactions.lease()
        except Unavailable:
            raise NotCommitted(reason="the database is unavailable") from None
        if self._hold_connection and (held is None or not held.is_open):
            self._held, self._held_cursor = lease, None
            return lease, True
        return lease, False

    def _open(
        self, lease: Lease, context: ChunkContext, state: CommittedStepState, *, held: bool
    ) -> ChunkTransaction:
        if not held:
            return ChunkTransaction(self, lease, context, state)
        cursor = self._held_cursor
        conn = lease.connection
        if cursor is None and conn is not None:
            cursor = self._held_cursor = conn.cursor()
        chunk = self._held_by = ChunkTransaction(
            self, lease, context, state, held=True, cursor=cursor
        )
        return chunk

    def close(self) -> None:
        """Give the held connection back to the pool (rolling back a chunk left open)."""
        held, self._held, self._held_by = self._held, None, None
        cursor, self._held_cursor = self._held_cursor, None
        if cursor is not None:
            cursor.close()
        if held is not None:
            held.rollback()

    def begin_for(self, context: ChunkContext) -> ChunkTransaction:
        """Open a chunk for a STARTED step, reading its committed state (not locked).

        Raises:
            NotCommitted: the step is missing, undecodable or not STARTED, or the
                database is unreachable.
        """
        if context.owner is None:
            raise NotCommitted(reason="a chunk needs the owner token of its step's execution")
        lease, held = self._lease()
        conn = lease.connection
        try:
            if conn is None:  # an open lease always holds its connection
                raise Unavailable()
            row = self.statements.get_step_chunk_state.prepared.one(
                conn,
                step_execution_id=context.step_execution_id,
                job_execution_id=context.job_execution_id,
            )
        except (psycopg.Error, Unavailable):
            lease.discard()
            raise NotCommitted(reason="the database is unavailable") from None
        try:
            if row is None:
                raise NotCommitted(reason="the step execution does not exist")
            state = decode_committed_step_state(row)
            if state.status is not BatchStatus.STARTED:
                raise NotCommitted(reason=f"the step is {state.status.value}, not STARTED")
        except PyBatchError as error:
            lease.rollback(keep=held)
            if isinstance(error, NotCommitted):
                raise
            raise NotCommitted(reason="the committed step state is unusable") from None
        return self._open(lease, context, state, held=held)

    def begin_after(self, context: ChunkContext, committed: CommittedStepState) -> ChunkTransaction:
        """Open the next chunk of a step from the state this process just committed.

        No statement runs until the chunk's own: the step is not re-read, because the
        commit is a compare-and-swap on the committed version and STARTED, so any change
        made meanwhile (a stop, a recovery, another writer) still refuses the chunk, at
        commit instead of at begin. Connections carry the configured timeouts as session
        defaults, and BEGIN is READ COMMITTED explicitly.

        Raises:
            NotCommitted: the context has no owner, or the database is unreachable.
        """
        if context.owner is None:
            raise NotCommitted(reason="a chunk needs the owner token of its step's execution")
        lease, held = self._lease()
        return self._open(lease, context, committed, held=held)

    def load_committed_state(self, context: ChunkContext) -> CommittedStepState:
        """The step's committed state, read in its own read-only transaction.

        Raises:
            StepExecutionNotFound: no such step in that job execution.
            FaultStateCorrupt: the retained fault state is unusable.
            Unavailable: other undecodable state, or the database is unreachable.
        """
        with self.repository.read_transaction() as conn:
            row = self.statements.get_step_chunk_state.one(
                conn,
                step_execution_id=context.step_execution_id,
                job_execution_id=context.job_execution_id,
            )
        if row is None:
            raise StepExecutionNotFound(id=context.step_execution_id)
        return decode_committed_step_state(row)

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


def _run_progress_update(
    statement: Statement,
    cursor: psycopg.Cursor[Any],
    params: dict[str, object],
    *,
    autocommit: bool,
) -> int:
    """Run the chunk's progress UPDATE prepared; with `autocommit`, as its own transaction."""
    if not autocommit:
        return statement.prepared.affected_on(cursor, **params)
    conn = cursor.connection
    conn.autocommit = True
    try:
        return statement.prepared.affected_on(cursor, **params)
    finally:
        if conn.pgconn.transaction_status == _IDLE:  # else it is discarded
            conn.autocommit = False


def _still_alive(held: Lease) -> bool:
    """The held connection passes the pool's checkout check (no round trip); else drop it.

    A held connection never goes back through the pool between chunks, so a backend ended
    while it sat idle would fail the next chunk; it is discarded and a fresh one leased.
    """
    conn = held.connection
    if conn is None:
        return False
    try:
        check_idle_connection(conn)
    except psycopg.Error:
        held.discard()
        return False
    return True
