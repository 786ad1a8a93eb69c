"""Durable retry reservations of a step (docs/contract.md, Fault state; Chunk transactions).

A reservation is spent in its own short transaction (row lock, verified envelope, the next
ordinal, compare-and-swap on version and STARTED): a stale reserver never spends one twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch import errors as e
from pybatch._chunks import load_committed_state
from pybatch._codecs._jsonb import to_jsonb
from pybatch._codecs._primitives import DecodeError
from pybatch._codecs.fault_state import decode_locked_fault_state, encode_fault_state
from pybatch._statements import Statement
from pybatch._transaction import CommitErrors
from pybatch.values import fault
from pybatch.values.chunks import ChunkContext
from pybatch.values.status import BatchStatus

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository

#: How a reservation reports a COMMIT that did not make it durable.
_COMMIT_ERRORS = CommitErrors(
    aborted=e.FaultStateUnavailable,
    refused=lambda _error: e.FaultStateUnavailable(),
    unknown=e.FaultStateCommitOutcomeUnknown,
)


@attrs.frozen
class RetryPolicy:
    """How many retries one key may spend and how many keys a step may retain."""

    retry_limit: fault.RetryLimit
    state_limit: fault.RetryStateLimit


class FaultState:
    """The fault-state store of one step, bound with `bind` before use."""

    def __init__(self, repository: JobRepository, policy: RetryPolicy) -> None:
        self._repository = repository
        self._policy = policy
        self._context: ChunkContext | None = None
        self._statements = q = repository.statements
        self._updates: dict[fault.FaultPhase, Statement] = {
            fault.FaultPhase.READ: q.update_step_fault_reservation_read,
            fault.FaultPhase.PROCESS: q.update_step_fault_reservation_process,
            fault.FaultPhase.WRITE: q.update_step_fault_reservation_write,
        }

    def _bound(self) -> ChunkContext:
        if self._context is None:
            raise e.FaultStateUnbound()
        return self._context

    def bind(self, context: ChunkContext) -> None:
        """Attach to a step once its retained state is valid (FaultStateCorrupt: no work begins)."""
        self._load(context)
        self._context = context

    def _load(self, context: ChunkContext) -> fault.FaultStateEnvelope:
        """The retained envelope; a superseded or over-policy one is FaultStateCorrupt."""
        state = load_committed_state(self._repository, context)
        try:
            digest = state.checkpoint.generation_digest()
            state.fault_state.validate_for(
                self._policy.retry_limit, self._policy.state_limit, digest
            )
        except e.FaultStateFormatError:
            raise e.FaultStateCorrupt() from None
        return state.fault_state

    def reserved_ordinal(self, key: fault.RetryKey) -> fault.RetryOrdinal | None:
        """The ordinal stored for `key`, or None."""
        return self._load(self._bound()).ordinal_for(key)

    def reserve(self, entry: fault.FaultEntry) -> None:
        """Spend retry `entry.ordinal` of `entry.key` durably, in its own transaction.

        After FaultStateCommitOutcomeUnknown retrying the same ordinal is safe: it is
        StaleReservation if the first one landed.
        """
        context = self._bound()
        try:
            lease = self._repository.transactions.lease()
        except e.PyBatchError:
            raise e.FaultStateUnavailable() from None
        conn = lease.connection
        try:
            if conn is None:  # a fresh lease always holds its connection
                raise e.FaultStateUnavailable()
            self._reserve_locked(conn, context, entry)
        except psycopg.Error as error:
            if _sqlstate.is_connection_loss(error, conn):
                lease.discard()
            lease.rollback()
            raise e.FaultStateUnavailable() from None
        except BaseException:
            lease.rollback()
            raise
        lease.commit(_COMMIT_ERRORS)

    def _reserve_locked(
        self, conn: psycopg.Connection[Any], context: ChunkContext, entry: fault.FaultEntry
    ) -> None:
        row = self._statements.lock_step_fault_state.one(
            conn,
            step_execution_id=context.step_execution_id,
            job_execution_id=context.job_execution_id,
        )
        if row is None:
            raise e.StaleReservation()
        try:
            locked = decode_locked_fault_state(row)
            envelope, digest = locked.envelope, locked.checkpoint_digest
            envelope.validate_for(self._policy.retry_limit, self._policy.state_limit, digest)
        except (e.FaultStateFormatError, DecodeError, ValueError, TypeError):
            raise e.FaultStateCorrupt() from None
        if locked.status is not BatchStatus.STARTED:
            raise e.StaleReservation()
        try:
            reserved = envelope.reserved(entry, digest, self._policy.state_limit)
        except e.FaultStateFormatError:
            raise e.FaultStateCorrupt() from None
        if (statement := self._updates.get(entry.phase)) is None:
            raise e.StaleReservation()
        columns = encode_fault_state(reserved)
        changed = statement.affected(
            conn,
            fault_state_payload=to_jsonb(columns["fault_state_payload"]),
            fault_state_checksum=columns["fault_state_checksum"],
            now=self._repository.clock.now(),
            step_execution_id=context.step_execution_id,
            expected_version=locked.version,
        )
        if changed != 1:
            raise e.StaleReservation()
