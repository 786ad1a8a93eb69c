"""Test-side chunk helpers: first chunks on fresh step sessions, inherited progress, providers.

pybatch opens a step's chunks on one `StepSession`, which reads and checks the step's state
at its first chunk only. Tests that arrange rows between chunks (a stop, a reservation, a
tampered envelope) open each chunk the way a first chunk opens, with `FirstChunks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import attrs

from pybatch._chunks import ChunkTransaction, StepSession, load_committed_state
from pybatch._job_repository import JobRepository
from pybatch.errors import NotCommitted, PyBatchError
from pybatch.values.chunks import ChunkContext, ChunkCounts, CommittedStepState, FaultProgress
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import FaultStateEnvelope
from pybatch.values.state import Checkpoint, ExecutionContext

__all__ = [
    "FirstChunks",
    "InheritedProgress",
    "Receipt",
    "StateProvider",
    "commit",
    "commit_from",
    "first_chunks",
    "inherited_progress",
]


class FirstChunks:
    """Opens every chunk on a new StepSession, so each one reads and checks the step's state.

    A session is closed (its connection given back) once its chunk ended, at the next
    `begin`, or at `close`.
    """

    def __init__(self, repository: JobRepository) -> None:
        self.repository = repository
        self._sessions: list[tuple[StepSession, ChunkTransaction | None]] = []

    def begin(self, context: ChunkContext) -> ChunkTransaction:
        self._close_ended()
        session = StepSession(self.repository, context)
        self._sessions.append((session, None))
        chunk = session.begin()
        self._sessions[-1] = (session, chunk)
        return chunk

    def load_committed_state(self, context: ChunkContext) -> CommittedStepState:
        return load_committed_state(self.repository, context)

    def _close_ended(self) -> None:
        kept: list[tuple[StepSession, ChunkTransaction | None]] = []
        for session, chunk in self._sessions:
            if chunk is None or not chunk.is_open:
                session.close()
            else:
                kept.append((session, chunk))
        self._sessions = kept

    def close(self) -> None:
        for session, _ in self._sessions:
            session.close()
        self._sessions = []


@contextmanager
def first_chunks(repository: JobRepository) -> Iterator[FirstChunks]:
    """A FirstChunks whose sessions are all closed when the block ends."""
    chunks = FirstChunks(repository)
    try:
        yield chunks
    finally:
        chunks.close()


@attrs.frozen(kw_only=True)
class InheritedProgress:
    """What a restarted step inherits: items read, checkpoint generation, retained retries."""

    read_count: int
    checkpoint_digest: bytes
    fault_state: FaultStateEnvelope


def inherited_progress(repository: JobRepository, context: ChunkContext) -> InheritedProgress:
    """What a (restarted) step resumes from; refuses fault state of a superseded checkpoint.

    Raises:
        NotCommitted: the state cannot be loaded, or retained retries belong to another
            checkpoint generation (no work may begin).
    """
    try:
        state = load_committed_state(repository, context)
    except PyBatchError:
        raise NotCommitted(reason="the committed step state is unusable") from None
    digest = state.checkpoint.generation_digest()
    if state.fault_state.entries and state.fault_state.checkpoint_digest != digest:
        raise NotCommitted(reason="retained retries belong to a superseded checkpoint")
    return InheritedProgress(
        read_count=state.counts.read, checkpoint_digest=digest, fault_state=state.fault_state
    )


@attrs.frozen
class Receipt:
    """The checkpoint and context a provider hands a chunk to commit."""

    checkpoint: Checkpoint
    context: ExecutionContext


class StateProvider(Protocol):
    """Produces the checkpoint and context of a chunk from the step's counts."""

    def state_for_commit(
        self, committed_counts: ExecutionCounts, chunk_counts: ChunkCounts
    ) -> Receipt: ...


def commit(
    chunk: ChunkTransaction,
    counts: ChunkCounts,
    fault_progress: FaultProgress | None = None,
    *,
    checkpoint: Checkpoint,
    context: ExecutionContext | None = None,
) -> CommittedStepState:
    """`chunk.commit_counts` with the counts as one value, as the tests spell them."""
    read, processed, written, filtered = attrs.astuple(counts)
    chunk.commit_counts(
        read, processed, written, filtered, fault_progress, checkpoint=checkpoint, context=context
    )
    return chunk.progress.value()


def commit_from(
    chunk: ChunkTransaction, counts: ChunkCounts, provider: StateProvider
) -> CommittedStepState:
    """Commit `chunk` with the state `provider` gives; a failing provider rolls it back.

    Raises:
        NotCommitted: the provider failed or returned no receipt (nothing is durable).
    """
    try:
        receipt: Any = provider.state_for_commit(chunk.progress.value().counts, counts)
    except Exception:
        chunk.rollback()
        raise NotCommitted(reason="the state provider failed") from None
    if not isinstance(receipt, Receipt):
        chunk.rollback()
        raise NotCommitted(reason="the state provider returned no receipt")
    return commit(chunk, counts, checkpoint=receipt.checkpoint, context=receipt.context)
