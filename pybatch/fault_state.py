"""Durable retry reservations of a step (behaviour.md 2.16, 4.15).

A reservation is spent in its own short transaction, after a known rollback and before
the backoff: the step row is locked, the stored envelope is verified, the ordinal must
follow the stored one, and the update is a compare-and-swap on version and STARTED. A
stale or concurrent reserver therefore loses instead of spending an ordinal twice.

Statements: fault_state.sql lock_step_fault_state, update_step_fault_reservation_{read,
process,write}; chunks.sql get_step_chunk_state (reads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch._statements import Statement
from pybatch.chunks import ChunkContext, ChunkTransactionManager
from pybatch.codecs._jsonb import to_jsonb
from pybatch.codecs._primitives import DecodeError, decode_enum, decode_int64
from pybatch.codecs.executions import decode_checkpoint
from pybatch.errors import (
    FaultStateCommitOutcomeUnknown,
    FaultStateCorrupt,
    FaultStateFormatError,
    FaultStateUnavailable,
    FaultStateUnbound,
    PyBatchError,
    StaleReservation,
)
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    FaultStateEnvelope,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.status import BatchStatus

if TYPE_CHECKING:
    from pybatch.repository import JobRepository

__all__ = ["FaultState", "RetryPolicy"]


@attrs.frozen
class RetryPolicy:
    """How many retries one key may spend and how many keys a step may retain."""

    retry_limit: RetryLimit
    state_limit: RetryStateLimit


class FaultState:
    """The fault-state store of one step, bound with `bind` before use."""

    def __init__(self, repository: JobRepository, policy: RetryPolicy) -> None:
        self._repository = repository
        self._policy = policy
        self._context: ChunkContext | None = None
        self._statements = repository.statements

    def _bound(self) -> ChunkContext:
        if self._context is None:
            raise FaultStateUnbound()
        return self._context

    def bind(self, context: ChunkContext) -> None:
        """Attach to a step and validate its retained state against the policy.

        Raises:
            FaultStateCorrupt: the envelope is corrupt, exceeds the policy, or belongs to a
                superseded checkpoint (no work may begin).
        """
        self._load(context)
        self._context = context

    def _load(self, context: ChunkContext) -> FaultStateEnvelope:
        """Load the retained envelope and validate it against the policy and checkpoint.

        Every read validates, as seed 000 does: state of a superseded generation or beyond
        the policy is FaultStateCorrupt, never an answer work could proceed on (6.3).
        """
        state = ChunkTransactionManager(self._repository).load_committed_state(context)
        try:
            state.fault_state.validate_for(
                self._policy.retry_limit,
                self._policy.state_limit,
                state.checkpoint.generation_digest(),
            )
        except FaultStateFormatError:
            raise FaultStateCorrupt() from None
        return state.fault_state

    def reserved_ordinal(self, key: RetryKey) -> RetryOrdinal | None:
        """The ordinal stored for `key`, or None.

        Raises:
            FaultStateCorrupt: the retained state is unusable (as in `bind`).
        """
        return self._load(self._bound()).ordinal_for(key)

    def unresolved(self) -> int:
        """How many retry keys the step retains.

        Raises:
            FaultStateCorrupt: the retained state is unusable (as in `bind`).
        """
        return len(self._load(self._bound()).entries)

    def resolve(self, key: RetryKey) -> None:
        """No-op: retained state is cleared by the next chunk commit, which supersedes it."""
        self._bound()

    def clear_resolved(self) -> None:
        """No-op, as `resolve`."""
        self._bound()

    def _update_statement(self, phase: FaultPhase) -> Statement:
        statements = {
            FaultPhase.READ: self._statements.update_step_fault_reservation_read,
            FaultPhase.PROCESS: self._statements.update_step_fault_reservation_process,
            FaultPhase.WRITE: self._statements.update_step_fault_reservation_write,
        }
        statement = statements.get(phase)
        if statement is None:
            raise StaleReservation()
        return statement

    def reserve(self, entry: FaultEntry) -> None:
        """Spend retry `entry.ordinal` of `entry.key` durably, in its own transaction.

        Raises:
            FaultStateUnbound: `bind` was not called.
            FaultStateCorrupt: the stored envelope is unusable.
            StaleReservation: the step left STARTED, the ordinal does not follow the stored
                one, the phase has no retry counter, or a concurrent writer won.
            CapacityExhausted: a new key beyond the state limit.
            FaultStateUnavailable: the database failed or refused the COMMIT.
            FaultStateCommitOutcomeUnknown: the COMMIT acknowledgement was lost; retrying
                the same ordinal is safe (it is StaleReservation if the first one landed).
        """
        context = self._bound()
        repository = self._repository
        try:
            conn = repository._acquire()
        except PyBatchError:
            raise FaultStateUnavailable() from None
        discard = False
        try:
            self._reserve_locked(conn, context, entry)
            try:
                conn.commit()
            except psycopg.Error as error:
                if _sqlstate.is_connection_loss(error, conn):
                    discard = True
                    raise FaultStateCommitOutcomeUnknown() from None
                raise FaultStateUnavailable() from None
        except psycopg.Error as error:
            discard = _sqlstate.is_connection_loss(error, conn)
            raise FaultStateUnavailable() from None
        finally:
            if not discard and not conn.broken and not conn.closed:
                try:
                    conn.rollback()
                except psycopg.Error:
                    discard = True
            repository._release(conn, discard=discard or conn.broken)

    def _reserve_locked(
        self, conn: psycopg.Connection[Any], context: ChunkContext, entry: FaultEntry
    ) -> None:
        config = self._repository.config
        self._statements.set_transaction_timeouts(
            conn,
            statement_timeout_ms=str(config.statement_timeout_ms),
            lock_timeout_ms=str(config.lock_timeout_ms),
            idle_transaction_timeout_ms=str(config.idle_transaction_timeout_ms),
        )
        row = self._statements.lock_step_fault_state(
            conn,
            step_execution_id=context.step_execution_id,
            job_execution_id=context.job_execution_id,
        )
        if row is None:
            raise StaleReservation()
        try:
            envelope = FaultStateEnvelope.from_columns(
                row["fault_state_format"],
                row["fault_state_schema"],
                row["fault_state_schema_version"],
                row["fault_state_payload"],
                row["fault_state_checksum"],
            )
            digest = decode_checkpoint(row).generation_digest()
            envelope.validate_for(self._policy.retry_limit, self._policy.state_limit, digest)
            status = decode_enum(BatchStatus, row["status"], column="status")
            version = decode_int64(row["version"], column="version", minimum=0)
        except (FaultStateFormatError, DecodeError, ValueError, TypeError):
            raise FaultStateCorrupt() from None
        if status is not BatchStatus.STARTED:
            raise StaleReservation()
        try:
            reserved = envelope.reserved(entry, digest, self._policy.state_limit)
        except FaultStateFormatError:
            raise FaultStateCorrupt() from None
        statement = self._update_statement(entry.phase)
        columns = reserved.to_columns()
        changed = statement(
            conn,
            fault_state_payload=to_jsonb(columns["fault_state_payload"]),
            fault_state_checksum=columns["fault_state_checksum"],
            now=self._repository.clock.now(),
            step_execution_id=context.step_execution_id,
            expected_version=version,
        )
        if changed != 1:
            raise StaleReservation()
