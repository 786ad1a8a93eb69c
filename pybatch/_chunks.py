"""The step session: one held connection per running step, and its chunk transactions.

A chunk (`ChunkTransaction`) is the ETL's statements, one compare-and-swap UPDATE of the step's
progress fenced in its own predicate (the committed version, STARTED, the owner's token), and
COMMIT: a crash leaves the whole chunk or none of it (docs/contract.md, Chunk transactions).
Its statements (chunks.sql) are prepared once per connection (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from pybatch import _sqlstate
from pybatch import errors as e
from pybatch._codecs.chunks import (
    decode_committed_step_state,
    encode_chunk_commit,
    encode_chunk_fence,
    encode_chunk_progress,
    encode_chunk_rollback,
)
from pybatch._connect import check_idle_connection
from pybatch._statements import Connection, Statement
from pybatch._transaction import Lease
from pybatch.values import chunks
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.ids import INT64_MAX
from pybatch.values.state import MAX_STORABLE_SCHEMA_VERSION, Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository


#: libpq's transaction states, compared on `pgconn` directly: `conn.info` builds an object per
#: access, and the chunk path reads the state on every chunk.
_IDLE = TransactionStatus.IDLE
_INERROR = TransactionStatus.INERROR
#: Read once: a class attribute lookup per chunk otherwise.
_EMPTY_FAULT_STATE = FaultStateEnvelope.EMPTY
#: A chunk's fault progress that leaves the step's skip counters as they are.
_NO_FAULT_PROGRESS = (None, chunks.NO_FAULT_PROGRESS)


@attrs.define
class StepProgress:
    """A step's committed state as plain fields; its `CommittedStepState` is built when read.

    A chunk only adds to the counters and swaps the checkpoint: building two frozen, validated
    values for that on every chunk cost more client time than the rest of the chunk's Python.
    `origin` is the state read from the database (the ids and the status no chunk changes);
    `counts` are ExecutionCounts' six, in its field order.
    """

    origin: chunks.CommittedStepState
    version: int
    counts: tuple[int, ...]
    checkpoint: Checkpoint
    context: ExecutionContext
    fault_state: FaultStateEnvelope
    _value: chunks.CommittedStepState | None = None

    @classmethod
    def of(cls, state: chunks.CommittedStepState) -> StepProgress:
        """The progress of a state read from the database (its value is that state)."""
        counts = attrs.astuple(state.counts)
        fields = (state.version, counts, state.checkpoint, state.context, state.fault_state)
        return cls(state, *fields, value=state)

    def value(self) -> chunks.CommittedStepState:
        """The state as a value, built at the first read."""
        if self._value is None:
            self._value = attrs.evolve(
                self.origin,
                version=self.version,
                counts=ExecutionCounts(**dict(zip(_COUNT_FIELDS, self.counts, strict=True))),
                checkpoint=self.checkpoint,
                context=self.context,
                fault_state=self.fault_state,
            )
        return self._value


_COUNT_FIELDS = tuple(field.name for field in attrs.fields(ExecutionCounts))


def load_committed_state(
    repository: JobRepository, context: chunks.ChunkContext
) -> chunks.CommittedStepState:
    """A step's committed state, read in its own read-only transaction.

    Raises:
        StepExecutionNotFound: no such step in that job execution.
        FaultStateCorrupt: the retained fault state is unusable.
        Unavailable: other undecodable state, or the database is unreachable.
    """
    with repository.read_transaction() as conn:
        row = repository.statements.get_step_chunk_state.one(
            conn,
            step_execution_id=context.step_execution_id,
            job_execution_id=context.job_execution_id,
        )
    if row is None:
        raise e.StepExecutionNotFound(id=context.step_execution_id)
    return decode_committed_step_state(row)


class StepSession:
    """A running step's connection, cursor and committed state, from its first chunk to `close`.

    Only the first chunk reads the step's state; a later one starts from the state the session
    committed last and sends nothing before the ETL's first statement: its compare-and-swap
    still refuses it after a stop, a recovery or another writer. A chunk opened while another
    is open gets a pooled connection of its own.
    """

    def __init__(self, repository: JobRepository, context: chunks.ChunkContext) -> None:
        self._transactions = repository.transactions
        q = self._statements = repository.statements
        self._clock = repository.clock
        #: The chunk writes of the step's fence (progress, full commit, rollback count): a
        #: step's statements, or a partition worker's twins (chunks.sql).
        self._writes = (
            (q.update_step_chunk_progress, q.update_step_chunk_commit, q.update_step_chunk_rollback)
            if context.partition_id is None
            else (
                q.update_partition_chunk_progress,
                q.update_partition_chunk_commit,
                q.update_partition_chunk_rollback,
            )
        )
        #: The step and the owner whose ownership every commit proves (the fence), encoded once.
        self._context = context
        self._fence = encode_chunk_fence(context)
        #: The held connection's pool slip, the connection and its cursor (None: not held).
        self._lease: Lease | None = None
        self._conn: Connection | None = None
        self._cursor: psycopg.Cursor[Any] | None = None
        #: The chunk on the held connection, while it is open.
        self._chunk: ChunkTransaction | None = None
        #: The step's state as this session last committed it; None until the first chunk
        #: read it, and again after an outcome-unknown COMMIT (it is re-read from the
        #: database, the only place that knows).
        self.progress: StepProgress | None = None

    def __repr__(self) -> str:
        return (
            f"StepSession(step_execution_id={self._context.step_execution_id}, "
            f"held={self._conn is not None})"
        )

    def begin(self) -> ChunkTransaction:
        """Open the step's next chunk on the held connection.

        Raises:
            NotCommitted: the context has no owner, the database is unreachable, or (first
                chunk) the step is missing, undecodable or not STARTED.
        """
        if self._context.owner is None:
            raise e.NotCommitted(reason="a chunk needs the owner token of its step's execution")
        if self._chunk is not None and self._chunk.is_open:
            return self._begin_apart()
        conn = self._conn
        # A backend that ended while the connection sat idle (idle_session_timeout, an
        # operator's pg_terminate_backend) is replaced before the chunk sends anything.
        if conn is None or not _still_alive(conn):
            conn = self._hold()
        elif self._lease is not None:
            try:
                self._lease.begin()  # behind a transaction-mode pooler: the settings
            except e.Unavailable:
                self._lease = self._conn = self._cursor = None  # begin discarded it
                raise e.NotCommitted(reason="the database is unavailable") from None
        progress = self.progress
        if progress is None:
            progress = self.progress = self._read_state(conn, self._drop, self._rollback_held)
        chunk = self._chunk = ChunkTransaction(self, conn, self._cursor, progress)
        return chunk

    def forget(self) -> None:
        """Re-read the committed state at the next chunk: a retry reservation moved it."""
        self.progress = None

    def _begin_apart(self) -> ChunkTransaction:
        """A chunk on a pooled connection of its own, for as long as the held one is busy."""
        lease, conn = self._lease_one()
        progress = self.progress  # set: the busy chunk started from it
        if progress is None:
            progress = self._read_state(conn, lease.discard, lease.rollback)
        return ChunkTransaction(self, conn, None, progress, lease)

    def _hold(self) -> Connection:
        """Lease the connection the session holds from now on, with its cursor."""
        self._drop()
        lease, conn = self._lease_one()
        self._lease, self._conn, self._cursor = lease, conn, conn.cursor()
        return conn

    def _lease_one(self) -> tuple[Lease, Connection]:
        try:
            lease = self._transactions.lease()
        except e.Unavailable:
            raise e.NotCommitted(reason="the database is unavailable") from None
        if lease.connection is None:  # a fresh lease always holds its connection
            lease.discard()
            raise e.NotCommitted(reason="the database is unavailable")
        return lease, lease.connection

    def _read_state(
        self, conn: Connection, discard: Callable[[], object], rollback: Callable[[], object]
    ) -> StepProgress:
        """Read and check the step's committed state; the chunk's transaction goes on from it."""
        context = self._context
        try:
            row = self._statements.get_step_chunk_state.prepared.one(
                conn,
                step_execution_id=context.step_execution_id,
                job_execution_id=context.job_execution_id,
            )
        except psycopg.Error:
            discard()
            raise e.NotCommitted(reason="the database is unavailable") from None
        try:
            if row is None:
                raise e.NotCommitted(reason="the step execution does not exist")
            state = decode_committed_step_state(row)
            if state.status is not BatchStatus.STARTED:
                raise e.NotCommitted(reason=f"the step is {state.status.value}, not STARTED")
        except e.PyBatchError as error:
            rollback()
            if isinstance(error, e.NotCommitted):
                raise
            raise e.NotCommitted(reason="the committed step state is unusable") from None
        return StepProgress.of(state)

    def close(self) -> None:
        """Give the held connection back to the pool (rolling back a chunk left open)."""
        chunk, self._chunk = self._chunk, None
        if chunk is not None:
            chunk.is_open = False
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            cursor.close()
        lease, self._lease, self._conn = self._lease, None, None
        if lease is not None:
            lease.rollback()

    def _rollback_held(self) -> None:
        """ROLLBACK on the held connection; one that cannot roll back is discarded."""
        if self._lease is not None and not self._lease.rollback(keep=True):
            self._drop()  # the lease discarded its connection: forget it and the cursor

    def _drop(self) -> None:
        """Discard the held connection (it can no longer be trusted); the next chunk leases anew."""
        lease, self._lease, self._conn, self._cursor = self._lease, None, None, None
        if lease is not None:
            lease.discard()


class ChunkTransaction:
    """One open chunk of a step session: business statements and progress, committed together."""

    __slots__ = ("_conn", "_cursor", "_lease", "_session", "is_open", "progress")

    def __init__(
        self,
        session: StepSession,
        conn: Connection,
        cursor: psycopg.Cursor[Any] | None,
        progress: StepProgress,
        lease: Lease | None = None,
    ) -> None:
        self._session = session
        self._conn = conn
        #: The cursor the chunk's statements and its progress UPDATE run on: the session's,
        #: or one made on first use by a chunk on a connection of its own.
        self._cursor = cursor
        #: The pool slip of a chunk on a connection of its own (None: the session's).
        self._lease = lease
        #: Whether the chunk can still run statements and commit.
        self.is_open = True
        #: The step's committed state: where this chunk started, and after `commit` the
        #: state it committed.
        self.progress = progress

    def __repr__(self) -> str:
        return (
            f"ChunkTransaction(step_execution_id={self.progress.origin.step_execution_id}, "
            f"version={self.progress.version}, open={self.is_open})"
        )

    def __enter__(self) -> ChunkTransaction:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.rollback()

    @property
    def connection(self) -> Connection:
        """The chunk's connection, for the ETL's own statements (they commit with the chunk).

        Errors raised through it are psycopg's own; `execute`, `executemany` and `copy`
        classify them into Rejected, Cancelled and Infrastructure instead.
        """
        if not self.is_open:
            raise e.NotCommitted(reason="the chunk is closed")
        return self._conn

    def _open_cursor(self) -> psycopg.Cursor[Any]:
        """The chunk's cursor (made on first use by a chunk on a connection of its own)."""
        if not self.is_open:
            raise e.NotCommitted(reason="the chunk is closed")
        cursor = self._cursor
        if cursor is None:
            cursor = self._cursor = self._conn.cursor()
        return cursor

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
        cursor = self._open_cursor()
        try:
            cursor.executemany(query, rows)
        except psycopg.Error as error:
            raise self._classified(error) from None
        return cursor.rowcount

    def copy(self, statement: Any, rows: Iterable[Sequence[Any]]) -> int:
        """COPY rows in (e.g. `COPY t (a, b) FROM STDIN`); return how many were sent."""
        cursor = self._open_cursor()
        try:
            with cursor.copy(statement) as copy:
                write_row = copy.write_row
                if isinstance(rows, (list, tuple)):  # its length is known: no count per row
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

    def _classified(self, error: psycopg.Error) -> e.PyBatchError:
        """A business statement's error as Rejected, Cancelled or Infrastructure.

        An Infrastructure error discards the connection: it can no longer be trusted.
        """
        classified = _sqlstate.classify_business_error(error, self._conn)
        if isinstance(classified, e.Infrastructure):
            self._discard()
        return classified

    def commit_counts(
        self,
        read: int,
        processed: int,
        written: int,
        filtered: int,
        fault_progress: chunks.FaultProgress | None = None,
        *,
        checkpoint: Checkpoint,
        context: ExecutionContext | None = None,
    ) -> None:
        """Commit the chunk, its four counts already valid (as `ChunkCounts` checks them).

        `context` defaults to the committed one. A chunk that sent no statement of its own
        (checkpoint-only) is the UPDATE alone, in autocommit: one round trip, atomic by itself.
        Then `progress` is the state the chunk committed.

        Raises:
            NotCommitted: a business statement failed, the step changed or left STARTED, its
                owner lost it, a counter would overflow, or COMMIT was refused; nothing of
                the chunk is durable.
            ChunkCommitOutcomeUnknown: the acknowledgement was lost; the session re-reads
                the step's durable state at its next chunk.
        """
        if not self.is_open:
            raise e.NotCommitted(reason="the chunk is closed")
        status = self._conn.pgconn.transaction_status  # read once: nothing runs until the UPDATE
        if status == _INERROR:
            raise self._refused("a statement in the chunk failed")
        state = self.progress
        r, p, w, f, k, rolled_back = state.counts  # read, processed, written, filtered, committed
        counts = (r + read, p + processed, w + written, f + filtered, k + 1, rolled_back)
        if max(counts) > INT64_MAX:
            raise self._refused("a counter would overflow")
        if context is None:
            context = state.context
        if (
            checkpoint.schema_version > MAX_STORABLE_SCHEMA_VERSION
            or context.schema_version > MAX_STORABLE_SCHEMA_VERSION
        ):
            raise self._refused("a state schema version above 2147483647 cannot be stored")
        session = self._session
        now = session._clock.now()
        fence, version = session._fence, state.version
        progress, full, _ = session._writes
        # The common chunk (same context, no skips, no retained retries) writes only its
        # counters and checkpoint: every other column already holds what the full statement
        # would write, as the version guard proves (chunks.sql).
        if (
            context is state.context
            and state.fault_state is _EMPTY_FAULT_STATE
            and fault_progress in _NO_FAULT_PROGRESS
        ):
            statement = progress
            params = encode_chunk_progress(fence, version, counts, checkpoint, now)
        else:
            statement = full
            fault = fault_progress or chunks.NO_FAULT_PROGRESS
            params = encode_chunk_commit(fence, version, counts, checkpoint, context, fault, now)
        committed = StepProgress(
            state.origin, version + 1, counts, checkpoint, context, _EMPTY_FAULT_STATE
        )
        alone = status == _IDLE  # checkpoint-only: the UPDATE is the whole transaction
        self._update_progress(statement, params, alone=alone)
        if not alone:
            self._commit_or_classify()
        self.is_open = False
        self.progress = self._session.progress = committed
        if self._lease is not None:
            self._lease.rollback()  # idle after the COMMIT: only gives the connection back

    def _refused(self, reason: str) -> e.NotCommitted:
        """Roll the chunk back and say why nothing of it is durable (the caller raises it)."""
        self.rollback()
        return e.NotCommitted(reason=reason)

    def _update_progress(
        self, statement: Statement, params: dict[str, object], *, alone: bool
    ) -> None:
        """The fenced progress UPDATE: one row changes, else NotCommitted; lost alone: unknown."""
        cursor = self._open_cursor()
        try:
            if alone:
                changed = _run_alone(statement, cursor, params)
            else:
                changed = statement.prepared.affected_on(cursor, **params)
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, self._conn):
                self._discard()
                if alone:
                    self._session.progress = None
                    raise e.ChunkCommitOutcomeUnknown() from None
            else:
                self.rollback()
            raise e.NotCommitted(reason="the progress update failed") from None
        if changed != 1:
            raise self._refused("the step changed, is no longer STARTED, or its owner lost it")

    def _commit_or_classify(self) -> None:
        """COMMIT; refused: NotCommitted; acknowledgement lost: outcome-unknown, state forgotten."""
        conn = self._conn
        try:
            conn.commit()
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                self._discard()
                self._session.progress = None
                raise e.ChunkCommitOutcomeUnknown() from None
            raise self._refused("COMMIT was refused") from None

    def rollback(self) -> None:
        """Discard the chunk's business writes and progress; a second call is a no-op."""
        if not self.is_open:
            return
        self.is_open = False
        if self._lease is not None:
            self._lease.rollback()
        else:
            self._session._rollback_held()

    def _discard(self) -> None:
        """Drop the chunk's connection: it can no longer be trusted."""
        self.is_open = False
        if self._lease is not None:
            self._lease.discard()
        elif self._session._conn is self._conn:
            self._session._drop()

    def rollback_counted(self) -> None:
        """Roll the open chunk back and count it in the step's durable rollback_count.

        The count is its own fenced transaction after the ROLLBACK (update_step_chunk_rollback);
        it leaves the step's version as it is, so the next chunk starts from the same state.

        Raises:
            NotCommitted: the count was refused (the step left STARTED, or its owner lost it)
                or the database is unavailable; the business writes are rolled back.
        """
        if not self.is_open:
            return
        session, conn, start = self._session, self._conn, self.progress
        statement = session._writes[2]
        params = encode_chunk_rollback(session._fence, session._clock.now())
        try:
            conn.rollback()
            with conn.cursor() as cursor:
                changed = _run_alone(statement, cursor, params)
        except psycopg.Error:
            self._discard()
            session.progress = None  # only the database knows whether the count landed
            raise e.NotCommitted(reason="the database is unavailable") from None
        self.rollback()  # gives a connection of its own back; the held one is idle
        if changed != 1:
            raise e.NotCommitted(reason="the step is no longer STARTED, or its owner lost it")
        state = start.value()
        counted = StepProgress.of(attrs.evolve(state, counts=state.counts.with_terminal_rollback()))
        if session.progress is start:
            session.progress = counted
        self.progress = counted


def _run_alone(statement: Statement, cursor: psycopg.Cursor[Any], params: dict[str, object]) -> int:
    """Run the progress UPDATE prepared, as its own (autocommit) transaction."""
    conn = cursor.connection
    conn.autocommit = True
    try:
        return statement.prepared.affected_on(cursor, **params)
    finally:
        if conn.pgconn.transaction_status == _IDLE:  # else it is discarded
            conn.autocommit = False


def _still_alive(conn: Connection) -> bool:
    """The held connection passes the pool's checkout check (it never goes back between chunks)."""
    try:
        check_idle_connection(conn)
    except psycopg.Error:
        return False
    return True
