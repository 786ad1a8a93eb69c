"""Chunk transactions, checkpoints and fault state (O1-O7), and N7.

Also the chunk-specific robustness rules: a lost COMMIT acknowledgement,
business statements that are cancelled or rejected, a failing state provider, and fault
state tampered with behind pybatch's back (refused, never decoded as a default).
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import pq
from psycopg.rows import dict_row

from pybatch import ConnectionConfig, JobRepository
from pybatch._chunks import StepSession, load_committed_state
from pybatch._fault_state import FaultState, RetryPolicy
from pybatch.errors import (
    BusinessTransactionError,
    Cancelled,
    CapacityExhausted,
    ChunkCommitOutcomeUnknown,
    FaultStateCorrupt,
    FaultStateUnbound,
    Infrastructure,
    NotCommitted,
    Rejected,
    StaleReservation,
    StepExecutionNotFound,
)
from pybatch.values.chunks import ChunkContext, ChunkCounts, FaultProgress
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    FaultStateEnvelope,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ClassifierRevision, JobName, StateSchemaId, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import StepExecution
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.chunks import FirstChunks, Receipt, commit, commit_from, inherited_progress
from tests.support.clock import ManualClock
from tests.support.owners import TEST_OWNER, claim_test_owner
from tests.support.statements import create_step

S = BatchStatus
SCHEMA = StateSchemaId("tests.orders.cursor.v1")
POLICY = RetryPolicy(RetryLimit(3), RetryStateLimit(4))
#: SHA-256 of the canonical empty fault-state envelope.
EMPTY_FAULT_CHECKSUM = bytes.fromhex(
    "a491114819e0d3bd8b7ca004dc0636f95b45e2fcb1a67ddb5726beaea12f9922"
)

_keys = itertools.count(1)


# --------------------------------------------------------------------------- helpers


def new_key() -> JobInstanceKey:
    return JobInstanceKey(JobName("orders"), JobParameters.of({"run": next(_keys)}))


def started_step(
    repository: JobRepository, clock: ManualClock, name: str = "load"
) -> StepExecution:
    """A committed STARTED step of a STARTED job execution."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(new_key()).instance
        execution = uow.executions.create(instance.id)
        execution = claim_test_owner(uow, execution, clock.advance())
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        step = create_step(uow, execution.id, StepName(name))
        step = uow.steps.transition(step.id, 0, LifecycleTransition.new(S.STARTED, clock.advance()))
        uow.commit()
    return step


def context_of(step: StepExecution) -> ChunkContext:
    return ChunkContext(step.id, step.job_execution_id, TEST_OWNER)


def cursor(offset: int, **extra: Any) -> Checkpoint:
    return Checkpoint(SCHEMA, 1, {"offset": offset, **extra})


def stored_step(repository: JobRepository, step_id: int) -> StepExecution:
    with repository.begin() as uow:
        step = uow.steps.get(step_id)
    assert step is not None
    return step


def raw_step(admin: psycopg.Connection[Any], step_id: int) -> dict[str, Any]:
    with admin.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT * FROM pybatch.step_execution WHERE id = %s", (step_id,)
        ).fetchone()
    assert row is not None
    return row


def business_ids(admin: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in admin.execute("SELECT id FROM public.orders ORDER BY id")]


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    """The business table the chunks write to."""
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def entry(key_byte: int, ordinal: int, phase: FaultPhase = FaultPhase.PROCESS) -> FaultEntry:
    return FaultEntry(
        key=RetryKey(bytes([key_byte]) * 32),
        phase=phase,
        category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
        ordinal=RetryOrdinal(ordinal),
        revision=ClassifierRevision("classifier-1"),
    )


def bound_fault_state(
    repository: JobRepository, step: StepExecution, policy: RetryPolicy = POLICY
) -> FaultState:
    fault_state = FaultState(repository, policy)
    fault_state.bind(context_of(step))
    return fault_state


def retained_keys(repository: JobRepository, step: StepExecution) -> int:
    """How many retry keys the step's durable fault state retains."""
    return len(load_committed_state(repository, context_of(step)).fault_state.entries)


#: The FirstChunks each test opened; their sessions are closed when the test ends.
_opened: list[FirstChunks] = []


def chunks_on(repository: JobRepository) -> FirstChunks:
    """Chunks opened as a step's first chunk is: each on a new session, reading the state."""
    chunks = FirstChunks(repository)
    _opened.append(chunks)
    return chunks


@pytest.fixture(autouse=True)
def _close_chunk_sessions() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def commit_chunk(manager: FirstChunks, step: StepExecution, offset: int, read: int = 1) -> None:
    with manager.begin(context_of(step)) as chunk:
        commit(
            chunk, ChunkCounts(read=read, processed=read, written=read), checkpoint=cursor(offset)
        )


def terminate(admin: psycopg.Connection[Any], pid: int) -> None:
    """Terminate backend `pid` and wait until it is gone."""
    assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    deadline = time.monotonic() + 10
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
        assert time.monotonic() < deadline, f"backend {pid} survived pg_terminate_backend"
        time.sleep(0.01)


# --------------------------------------------------------------------------- O1


def test_a_chunk_commit_advances_progress_with_its_business_writes(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Scenario O1."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    context = ExecutionContext(SCHEMA, 2, {"file": "orders-1.csv"})
    at = clock.advance(timedelta(minutes=1))
    with manager.begin(context_of(step)) as chunk:
        assert chunk.progress.version == step.version
        assert (
            chunk.execute("INSERT INTO public.orders VALUES (%s, %s), (%s, %s)", (1, "a", 2, "b"))
            == 2
        )
        state = commit(
            chunk,
            ChunkCounts(read=3, processed=3, written=2, filtered=1),
            FaultProgress(read_skips=1, process_skips=2, write_skips=3, no_rollbacks=4),
            checkpoint=cursor(3),
            context=context,
        )
    expected = ExecutionCounts(read=3, processed=3, written=2, filtered=1, committed=1)
    assert state.version == step.version + 1
    assert state.counts == expected
    assert state.checkpoint == cursor(3) and state.context == context
    assert state.fault_state == FaultStateEnvelope.EMPTY
    assert business_ids(admin) == [1, 2]

    durable = stored_step(repository, step.id)
    assert durable.status is S.STARTED
    assert durable.version == step.version + 1
    assert durable.metadata.counts == expected
    assert durable.checkpoint == cursor(3) and durable.context == context
    assert (
        durable.fault_counts.read_skip,
        durable.fault_counts.process_skip,
        durable.fault_counts.write_skip,
        durable.fault_counts.no_rollback,
    ) == (1, 2, 3, 4)
    assert durable.updated_at == at
    assert manager.load_committed_state(context_of(step)) == state

    # A second chunk adds to the totals; the context is kept when none is given.
    with manager.begin(context_of(step)) as chunk:
        chunk.execute("INSERT INTO public.orders VALUES (%s, %s)", (3, "c"))
        second = commit(
            chunk,
            ChunkCounts(read=1, processed=1, written=1),
            FaultProgress(read_skips=1),
            checkpoint=cursor(4),
        )
    assert second.counts == ExecutionCounts(read=4, processed=4, written=3, filtered=1, committed=2)
    assert second.version == step.version + 2 and second.context == context
    durable = stored_step(repository, step.id)
    assert durable.metadata.counts == second.counts
    assert durable.fault_counts.read_skip == 2 and durable.fault_counts.no_rollback == 4
    # updated_at never moves backwards, even with a clock that did.
    clock.set(at - timedelta(hours=1))
    commit_chunk(manager, step, 5)
    assert stored_step(repository, step.id).updated_at == at
    assert business_ids(admin) == [1, 2, 3]


def test_a_chunk_commit_clears_fault_state_and_keeps_the_rollback_count(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario O1."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    commit_chunk(manager, step, 1)
    fault_state = bound_fault_state(repository, step)
    fault_state.reserve(entry(1, 1))
    fault_state.reserve(entry(2, 1, FaultPhase.WRITE))
    assert retained_keys(repository, step) == 2
    before = stored_step(repository, step.id)
    assert before.metadata.counts.rolled_back == 2

    commit_chunk(manager, step, 2)
    after = stored_step(repository, step.id)
    assert after.metadata.counts.rolled_back == 2  # a commit never touches rolled_back
    assert after.metadata.counts.committed == 2
    assert after.fault_counts.process_retry == 1 and after.fault_counts.write_retry == 1
    assert retained_keys(repository, step) == 0
    assert fault_state.reserved_ordinal(entry(1, 1).key) is None
    raw = raw_step(admin, step.id)
    assert bytes(raw["fault_state_checksum"]) == EMPTY_FAULT_CHECKSUM
    assert raw["fault_state_payload"] == {"checkpoint": "0" * 64, "entries": []}
    # The cleared key starts again at ordinal 1 in the new checkpoint generation.
    fault_state.reserve(entry(1, 1))
    assert fault_state.reserved_ordinal(entry(1, 1).key) == RetryOrdinal(1)


def test_the_state_provider_supplies_the_committed_checkpoint_and_context(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario O1."""
    step = started_step(repository, clock)
    calls: list[tuple[ExecutionCounts, ChunkCounts]] = []

    class Provider:
        def state_for_commit(
            self, committed_counts: ExecutionCounts, chunk_counts: ChunkCounts
        ) -> Receipt:
            calls.append((committed_counts, chunk_counts))
            offset = committed_counts.read + chunk_counts.read
            return Receipt(cursor(offset), ExecutionContext(SCHEMA, 1, {"n": offset}))

    with contextlib.closing(StepSession(repository, context_of(step))) as session:
        for _ in range(2):
            with session.begin() as chunk:
                commit_from(chunk, ChunkCounts(read=5, processed=5, written=5), Provider())
    assert calls == [
        (ExecutionCounts(), ChunkCounts(read=5, processed=5, written=5)),
        (
            ExecutionCounts(read=5, processed=5, written=5, committed=1),
            ChunkCounts(read=5, processed=5, written=5),
        ),
    ]
    durable = stored_step(repository, step.id)
    assert durable.checkpoint == cursor(10)
    assert durable.context == ExecutionContext(SCHEMA, 1, {"n": 10})


def test_the_checkpoint_digest_survives_the_jsonb_round_trip(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Keys jsonb reorders and floats it reprints still give the written digest. Scenario O1."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    awkward = cursor(7, big=1e16, small=1e-7, nested={"bb": 1, "a": [2.5, -0.0]}, text="é/\n")
    with manager.begin(context_of(step)) as chunk:
        commit(chunk, ChunkCounts(read=1), checkpoint=awkward)
    inherited = inherited_progress(repository, context_of(step))
    assert inherited.checkpoint_digest == awkward.generation_digest()
    assert inherited.read_count == 1
    # The reservation validates against the digest recomputed from the stored row.
    fault_state = bound_fault_state(repository, step)
    fault_state.reserve(entry(9, 1))
    assert manager.load_committed_state(context_of(step)).fault_state.checkpoint_digest == (
        awkward.generation_digest()
    )
    assert inherited_progress(repository, context_of(step)).fault_state.ordinal_for(
        entry(9, 1).key
    ) == RetryOrdinal(1)


# --------------------------------------------------------------------------- O2


#: A legal path from STARTING to each status a chunk must refuse.
NOT_STARTED_PATHS: dict[BatchStatus, tuple[BatchStatus, ...]] = {
    S.STARTING: (),
    S.STOPPING: (S.STOPPING,),
    S.UNKNOWN: (S.UNKNOWN,),
    S.STOPPED: (S.STARTED, S.STOPPED),
    S.COMPLETED: (S.STARTED, S.COMPLETED),
    S.FAILED: (S.STARTED, S.FAILED),
    S.ABANDONED: (S.STARTED, S.FAILED, S.ABANDONED),
}


def test_begin_for_refuses_a_step_that_is_not_started(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario O2."""
    steps: dict[BatchStatus, StepExecution] = {}
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(new_key()).instance.id)
        for status, path in NOT_STARTED_PATHS.items():
            step = create_step(uow, execution.id, StepName(f"load-{status.value}"))
            for target in path:
                at = clock.advance()
                transition = (
                    LifecycleTransition.failed(
                        at, FailureSummary(FailureCategory.TIMEOUT, FailureId(1))
                    )
                    if target is S.FAILED
                    else LifecycleTransition.new(target, at)
                )
                step = uow.steps.transition(step.id, step.version, transition)
            assert step.status is status
            steps[status] = step
        uow.commit()
    manager = chunks_on(repository)
    for status, step in steps.items():
        with pytest.raises(NotCommitted):
            manager.begin(context_of(step))
        assert stored_step(repository, step.id).version == step.version, status

    # A missing step, or one named with another job execution's id, is refused too.
    step = started_step(repository, clock)
    other = started_step(repository, clock)
    with pytest.raises(NotCommitted):  # without an owner token nothing can commit
        StepSession(repository, ChunkContext(step.id, step.job_execution_id)).begin()
    with pytest.raises(NotCommitted):
        manager.begin(ChunkContext(step.id + 1000, step.job_execution_id, TEST_OWNER))
    with pytest.raises(NotCommitted):  # the step exists, but in another job execution
        manager.begin(ChunkContext(step.id, other.job_execution_id, TEST_OWNER))
    with pytest.raises(StepExecutionNotFound):
        manager.load_committed_state(ChunkContext(step.id, other.job_execution_id, TEST_OWNER))


def test_a_commit_after_the_step_left_started_is_not_committed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Scenario O2."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    chunk = manager.begin(context_of(step))
    chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
    with repository.begin() as uow:  # an operator stop moves the step on
        stopping = uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(S.STOPPING, clock.advance())
        )
        uow.commit()
    with pytest.raises(NotCommitted):
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    assert business_ids(admin) == []
    durable = stored_step(repository, step.id)
    assert (durable.status, durable.version) == (S.STOPPING, stopping.version)
    assert durable.metadata.counts == ExecutionCounts()
    with pytest.raises(NotCommitted):  # the chunk is closed; a second commit cannot land
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))


def test_the_status_guard_is_part_of_the_commit_predicate(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Status moved behind the chunk's back without a version bump: still NotCommitted.

    Scenario O2.
    """
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    with manager.begin(context_of(step)) as chunk:
        chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
        admin.execute(
            "UPDATE pybatch.step_execution SET status = 'STOPPING' WHERE id = %s", (step.id,)
        )
        with pytest.raises(NotCommitted):
            commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    assert business_ids(admin) == []
    assert raw_step(admin, step.id)["version"] == step.version


# --------------------------------------------------------------------------- O3


def test_two_chunks_from_one_version_only_one_commits(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Scenario O3."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    first = manager.begin(context_of(step))
    second = manager.begin(context_of(step))
    assert first.progress.version == second.progress.version == step.version
    first.execute("INSERT INTO public.orders VALUES (1, 'first')")
    second.execute("INSERT INTO public.orders VALUES (2, 'second')")
    commit(first, ChunkCounts(read=2, processed=2, written=1), checkpoint=cursor(2))
    with pytest.raises(NotCommitted):
        commit(second, ChunkCounts(read=3, processed=3, written=3), checkpoint=cursor(3))
    assert business_ids(admin) == [1]
    durable = stored_step(repository, step.id)
    assert durable.metadata.counts == ExecutionCounts(read=2, processed=2, written=1, committed=1)
    assert durable.checkpoint == cursor(2)
    assert durable.version == step.version + 1


def test_a_chunk_opened_while_the_sessions_chunk_is_open_gets_a_connection_of_its_own(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """A nested chunk of one session is a second writer: both start from one version, and
    only the first commit lands; the held connection stays the session's."""
    step = started_step(repository, clock)
    with contextlib.closing(StepSession(repository, context_of(step))) as session:
        outer = session.begin()
        inner = session.begin()
        assert outer.connection is not inner.connection
        outer.execute("INSERT INTO public.orders VALUES (1, 'outer')")
        inner.execute("INSERT INTO public.orders VALUES (2, 'inner')")
        commit(inner, ChunkCounts(read=1, processed=1, written=1), checkpoint=cursor(1))
        assert not inner.is_open and outer.is_open
        with pytest.raises(NotCommitted):
            commit(outer, ChunkCounts(read=2), checkpoint=cursor(2))
        assert not outer.is_open
        # The session goes on from what its nested chunk committed.
        with session.begin() as chunk:
            commit(chunk, ChunkCounts(read=1), checkpoint=cursor(3))
    assert business_ids(admin) == [2]
    durable = stored_step(repository, step.id)
    assert durable.checkpoint == cursor(3) and durable.version == step.version + 2


def test_a_session_starts_each_chunk_from_the_version_it_committed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """The next chunk starts from the committed version without reading it; a stale state
    is refused at commit, by the progress UPDATE's own predicate. Scenario O3."""
    step = started_step(repository, clock)
    with contextlib.closing(StepSession(repository, context_of(step))) as session:
        for offset in (1, 2):
            with session.begin() as chunk:
                commit(chunk, ChunkCounts(read=1), checkpoint=cursor(offset))
        assert session.progress is not None
        assert session.progress.version == step.version + 2
        assert load_committed_state(repository, context_of(step)) == session.progress.value()
        # A reservation bumps the version behind the session's back: its next chunk (which
        # reads nothing) cannot commit.
        bound_fault_state(repository, step).reserve(entry(1, 1))
        chunk = session.begin()
        assert chunk.progress.version == step.version + 2
        with pytest.raises(NotCommitted):
            commit(chunk, ChunkCounts(read=1), checkpoint=cursor(3))
    state = load_committed_state(repository, context_of(step))
    assert state.counts.committed == 2 and state.fault_state.entries


# --------------------------------------------------------------------------- O4


def test_reservation_ordinals_must_follow_the_stored_one(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario O4."""
    step = started_step(repository, clock)
    fault_state = bound_fault_state(repository, step)
    key = entry(1, 1).key
    assert fault_state.reserved_ordinal(key) is None
    with pytest.raises(StaleReservation):  # skips ordinal 1
        fault_state.reserve(entry(1, 2))
    assert stored_step(repository, step.id).version == step.version

    fault_state.reserve(entry(1, 1))
    assert fault_state.reserved_ordinal(key) == RetryOrdinal(1)
    with pytest.raises(StaleReservation):  # spending ordinal 1 twice
        fault_state.reserve(entry(1, 1))
    fault_state.reserve(entry(1, 2))
    assert fault_state.reserved_ordinal(key) == RetryOrdinal(2)
    assert retained_keys(repository, step) == 1
    with pytest.raises(StaleReservation):  # going backwards
        fault_state.reserve(entry(1, 1))

    durable = stored_step(repository, step.id)
    assert durable.version == step.version + 2
    assert durable.fault_counts.process_retry == 2
    assert durable.metadata.counts.rolled_back == 2


def test_each_phase_counts_its_own_retries(repository: JobRepository, clock: ManualClock) -> None:
    """Scenario O4."""
    step = started_step(repository, clock)
    fault_state = bound_fault_state(repository, step)
    clock.advance(timedelta(minutes=5))
    fault_state.reserve(entry(1, 1, FaultPhase.READ))
    fault_state.reserve(entry(2, 1, FaultPhase.WRITE))
    fault_state.reserve(entry(2, 2, FaultPhase.WRITE))
    fault_state.reserve(entry(3, 1, FaultPhase.PROCESS))
    durable = stored_step(repository, step.id)
    counts = durable.fault_counts
    assert (counts.read_retry, counts.process_retry, counts.write_retry) == (1, 1, 2)
    assert durable.metadata.counts.rolled_back == 4
    assert durable.metadata.counts.committed == 0
    assert durable.version == step.version + 4
    assert durable.updated_at == clock.now()
    assert retained_keys(repository, step) == 3
    envelope = load_committed_state(repository, context_of(step)).fault_state
    assert [e.key for e in envelope.entries] == sorted(e.key for e in envelope.entries)
    assert envelope.checkpoint_digest == durable.checkpoint.generation_digest()


def test_reservations_need_a_bound_started_step(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario O4."""
    step = started_step(repository, clock)
    unbound = FaultState(repository, POLICY)
    with pytest.raises(FaultStateUnbound):
        unbound.reserve(entry(1, 1))
    with pytest.raises(FaultStateUnbound):
        unbound.reserved_ordinal(entry(1, 1).key)
    fault_state = bound_fault_state(repository, step)
    with repository.begin() as uow:
        uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(S.STOPPING, clock.advance())
        )
        uow.commit()
    with pytest.raises(StaleReservation):
        fault_state.reserve(entry(1, 1))
    durable = stored_step(repository, step.id)
    assert durable.fault_counts.process_retry == 0 and durable.version == step.version + 1


# --------------------------------------------------------------------------- O5


def test_a_new_key_beyond_the_state_limit_is_capacity_exhausted(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario O5."""
    step = started_step(repository, clock)
    fault_state = bound_fault_state(
        repository, step, RetryPolicy(RetryLimit(5), RetryStateLimit(2))
    )
    fault_state.reserve(entry(1, 1))
    fault_state.reserve(entry(2, 1))
    with pytest.raises(CapacityExhausted) as exhausted:
        fault_state.reserve(entry(3, 1))
    assert exhausted.value.max == 2
    fault_state.reserve(entry(2, 2))  # a retained key can still advance
    assert retained_keys(repository, step) == 2
    assert fault_state.reserved_ordinal(entry(3, 1).key) is None
    durable = stored_step(repository, step.id)
    assert durable.fault_counts.process_retry == 3 and durable.version == step.version + 3


# --------------------------------------------------------------------------- O6


def test_inherited_progress_refuses_a_superseded_generation(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario O6."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    fresh = inherited_progress(repository, context_of(step))
    assert fresh.read_count == 0
    assert fresh.checkpoint_digest == Checkpoint.empty().generation_digest()
    assert fresh.fault_state == FaultStateEnvelope.EMPTY
    with pytest.raises(NotCommitted):  # no such step
        inherited_progress(
            repository, ChunkContext(step.id + 99, step.job_execution_id, TEST_OWNER)
        )

    commit_chunk(manager, step, 4, read=4)
    fault_state = bound_fault_state(repository, step)
    fault_state.reserve(entry(1, 1))

    inherited = inherited_progress(repository, context_of(step))
    assert inherited.read_count == 4
    assert inherited.checkpoint_digest == cursor(4).generation_digest()
    assert inherited.fault_state.ordinal_for(entry(1, 1).key) == RetryOrdinal(1)

    # The checkpoint moves on without clearing the retained retries (a writer that is not
    # pybatch): the retained state now belongs to a superseded generation.
    admin.execute(
        "UPDATE pybatch.step_execution SET checkpoint_payload = %s::jsonb WHERE id = %s",
        ('{"offset": 5}', step.id),
    )
    with pytest.raises(NotCommitted):
        inherited_progress(repository, context_of(step))


# --------------------------------------------------------------------------- O7


def test_a_rejected_statement_poisons_the_chunk_and_frees_its_connection(
    pg_config: ConnectionConfig, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Scenario O7."""
    # Two pooled connections (the session's and one for the checks) and a short acquire
    # timeout: a leaked chunk connection would make the follow-up chunk fail instead of
    # passing by luck.
    config = attrs.evolve(pg_config, pool_size=2, acquire_timeout=timedelta(seconds=3))
    admin.execute("INSERT INTO public.orders VALUES (1, 'existing')")
    with JobRepository.connect(config, clock=clock) as repository:
        step = started_step(repository, clock)
        # One session: the step's chunks keep its single held connection.
        session = StepSession(repository, context_of(step))
        with session.begin() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (2, 'ok')")
            with pytest.raises(Rejected) as rejected:
                chunk.execute("INSERT INTO public.orders VALUES (1, 'duplicate')")
            assert rejected.value.sqlstate == "23505"
            with pytest.raises(BusinessTransactionError):  # the transaction is failed now
                chunk.execute("INSERT INTO public.orders VALUES (3, 'after')")
            with pytest.raises(NotCommitted):
                commit(chunk, ChunkCounts(read=2, written=2), checkpoint=cursor(2))
        assert business_ids(admin) == [1]
        durable = stored_step(repository, step.id)
        assert durable.version == step.version
        assert durable.metadata.counts == ExecutionCounts()
        assert durable.checkpoint == Checkpoint.empty()
        # Other classes 22, 23 and 42 are Rejected as well, and keep the connection.
        cases = {
            "INSERT INTO public.orders VALUES (9, NULL)": "23502",
            "SELECT 1 / 0": "22012",
            "SELECT * FROM public.no_such_table": "42P01",
        }
        for statement, sqlstate in cases.items():
            with session.begin() as chunk:
                pid = chunk.connection.info.backend_pid
                with pytest.raises(Rejected) as rejected:
                    chunk.execute(statement)
                assert rejected.value.sqlstate == sqlstate
                assert not chunk.connection.closed
                with pytest.raises(NotCommitted):
                    commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
        assert stored_step(repository, step.id).version == step.version
        # The step is still usable, on the same (single, kept) connection.
        with session.begin() as chunk:
            assert chunk.connection.info.backend_pid == pid
            chunk.execute("INSERT INTO public.orders VALUES (2, 'retried')")
            commit(chunk, ChunkCounts(read=1, written=1), checkpoint=cursor(1))
        session.close()
        assert business_ids(admin) == [1, 2]


def test_the_statement_timeout_cancels_a_business_statement(
    pg_config: ConnectionConfig, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Scenario O7."""
    config = attrs.evolve(
        pg_config,
        statement_timeout=timedelta(seconds=1),
        lock_timeout=timedelta(seconds=1),
    )
    with JobRepository.connect(config, clock=clock) as repository:
        step = started_step(repository, clock)
        manager = chunks_on(repository)
        started = time.monotonic()
        with manager.begin(context_of(step)) as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
            with pytest.raises(Cancelled):
                chunk.execute("SELECT pg_sleep(30)")
            assert time.monotonic() - started < 15
            with pytest.raises(NotCommitted):
                commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
        assert business_ids(admin) == []
        assert stored_step(repository, step.id).version == step.version
        commit_chunk(manager, step, 1)  # the connection survived and the step goes on
        assert stored_step(repository, step.id).metadata.counts.committed == 1


# --------------------------------------------------------------------------- refusals


def test_refusals_before_commit_leave_nothing_durable(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    step = started_step(repository, clock)

    class Exploding:
        def state_for_commit(
            self, committed_counts: ExecutionCounts, chunk_counts: ChunkCounts
        ) -> Receipt:
            raise RuntimeError("reader position unavailable")

    class Wrong:
        def state_for_commit(
            self, committed_counts: ExecutionCounts, chunk_counts: ChunkCounts
        ) -> Any:
            return {"offset": 1}

    manager = chunks_on(repository)
    for provider in (Exploding(), Wrong()):
        with manager.begin(context_of(step)) as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
            with pytest.raises(NotCommitted):
                commit_from(chunk, ChunkCounts(read=1), provider)
            assert not chunk.is_open
    assert business_ids(admin) == []
    assert stored_step(repository, step.id).version == step.version

    # A counter that would pass 2**63-1 refuses the chunk as well.
    commit_chunk(manager, step, 1, read=2**63 - 2)
    with manager.begin(context_of(step)) as chunk:
        chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
        with pytest.raises(NotCommitted):
            commit(chunk, ChunkCounts(read=2), checkpoint=cursor(2))
    assert business_ids(admin) == []
    assert stored_step(repository, step.id).metadata.counts.read == 2**63 - 2


# --------------------------------------------------------------------------- lost COMMIT


class _TerminateAfterUpdate:
    """Statements proxy: run the chunk's progress UPDATE, then kill its backend."""

    def __init__(self, statements: Any, admin: psycopg.Connection[Any]) -> None:
        self._statements = statements
        self._admin = admin

    def __getattr__(self, name: str) -> Any:
        statement = getattr(self._statements, name)
        if not name.endswith(("_chunk_commit", "_chunk_progress")):
            return statement
        admin = self._admin

        class Killing:
            def affected_on(self, cursor: psycopg.Cursor[Any], **params: object) -> int:
                changed: int = statement.prepared.affected_on(cursor, **params)
                assert changed == 1
                terminate(admin, cursor.connection.info.backend_pid)
                return changed

        class KillingStatement:
            prepared = Killing()

        return KillingStatement()


def test_lost_commit_acknowledgement_is_outcome_unknown(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    orders: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = started_step(repository, clock)
    session = StepSession(repository, context_of(step))
    with session.begin() as chunk:
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    killing = _TerminateAfterUpdate(session._statements, admin)
    writes = (killing.update_step_chunk_progress, killing.update_step_chunk_commit)
    monkeypatch.setattr(session, "_writes", (*writes, session._writes[2]))
    chunk = session.begin()
    chunk.execute("INSERT INTO public.orders VALUES (1, 'in doubt')")
    with pytest.raises(ChunkCommitOutcomeUnknown):
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(2))
    # The in-memory state did not advance, and the chunk is closed.
    assert chunk.progress.version == step.version + 1
    with pytest.raises(NotCommitted):
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(2))
    # Only the database knows the outcome now: the session forgot what it committed.
    assert session.progress is None
    # A fresh read shows the truth: the backend died before COMMIT, nothing landed.
    monkeypatch.undo()
    state = load_committed_state(repository, context_of(step))
    assert state.version == step.version + 1
    assert state.checkpoint == cursor(1) and state.counts.committed == 1
    assert business_ids(admin) == []
    # The session's next chunk starts from that durable state, on a fresh connection.
    with session.begin() as chunk:
        assert chunk.progress.value() == state
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(2))
    session.close()
    assert load_committed_state(repository, context_of(step)).checkpoint == cursor(2)


def test_a_state_schema_version_beyond_integer_is_not_committed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """A u32 schema version above 2^31-1 cannot be stored: the chunk, business writes
    included, is refused before its progress UPDATE runs, and the step can go on."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    for checkpoint, context in (
        (Checkpoint(SCHEMA, 2**31, {"offset": 1}), None),
        (cursor(1), ExecutionContext(SCHEMA, 2**31, {})),
    ):
        chunk = manager.begin(context_of(step))
        chunk.execute("INSERT INTO public.orders VALUES (1, 'refused')")
        with pytest.raises(NotCommitted) as refused:
            commit(chunk, ChunkCounts(read=1), checkpoint=checkpoint, context=context)
        assert "2147483647" in str(refused.value)
        assert not chunk.is_open
    assert business_ids(admin) == []
    assert stored_step(repository, step.id).version == step.version
    commit_chunk(manager, step, 1)
    assert manager.load_committed_state(context_of(step)).checkpoint == cursor(1)


def test_lost_acknowledgement_of_a_checkpoint_only_chunk_is_outcome_unknown(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """A chunk that ran no statement commits its progress UPDATE alone, as its own
    transaction: a connection lost while that UPDATE is in flight leaves the outcome
    unknown (never NotCommitted, which would claim nothing landed), and a reload shows
    the truth."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    session = StepSession(repository, context_of(step))
    with session.begin() as chunk:
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    # A session's later chunk sends nothing before its own: its first statement is its
    # progress UPDATE.
    chunk = session.begin()
    pid = chunk.connection.info.backend_pid
    with psycopg.connect(admin.info.dsn, password=admin.info.password) as locker:
        locker.execute("SELECT 1 FROM pybatch.step_execution WHERE id = %s FOR UPDATE", (step.id,))

        def kill_while_it_waits() -> None:
            deadline = time.monotonic() + 10
            while not admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                (pid,),
            ).fetchone():
                assert time.monotonic() < deadline, "the progress UPDATE never waited"
                time.sleep(0.01)
            terminate(admin, pid)

        killer = threading.Thread(target=kill_while_it_waits)
        killer.start()
        with pytest.raises(ChunkCommitOutcomeUnknown):
            commit(chunk, ChunkCounts(read=1), checkpoint=cursor(2))
        killer.join()
    assert not chunk.is_open
    assert session.progress is None  # the session re-reads the durable state
    session.close()
    state = manager.load_committed_state(context_of(step))
    assert state.version == step.version + 1  # here it did not land
    assert state.checkpoint == cursor(1) and state.counts.committed == 1
    commit_chunk(manager, step, 2)  # the pool replaced the dead connection
    assert manager.load_committed_state(context_of(step)).checkpoint == cursor(2)


def _protocol(conn: psycopg.Connection[Any], run: Any) -> str:
    """libpq's trace of the messages `run()` exchanges on `conn`."""
    with tempfile.TemporaryFile(mode="w+") as handle:
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            run()
        finally:
            conn.pgconn.untrace()
        handle.seek(0)
        return handle.read()


def test_a_checkpoint_only_chunk_commits_in_one_round_trip(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """No BEGIN and no COMMIT travel for a chunk that ran no statement of its own; a chunk
    with business writes keeps them in one transaction with its progress."""
    step = started_step(repository, clock)
    session = StepSession(repository, context_of(step))
    with session.begin() as chunk:  # prepares the statements on the held connection
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    chunk = session.begin()
    conn = chunk.connection
    trace = _protocol(conn, lambda: commit(chunk, ChunkCounts(read=1), checkpoint=cursor(2)))
    sent = [line for line in trace.splitlines() if line.startswith("F")]
    assert not any("BEGIN" in line or "COMMIT" in line for line in sent), trace
    assert sum(1 for line in sent if "\tSync" in line) == 1, trace
    assert conn.autocommit is False  # the pooled connection is handed on as configured

    chunk = session.begin()
    conn = chunk.connection

    def business_chunk() -> None:
        chunk.execute("INSERT INTO public.orders VALUES (3, 'with progress')")
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(3))

    sent = [line for line in _protocol(conn, business_chunk).splitlines() if "F" in line[:2]]
    assert any("BEGIN" in line for line in sent) and any("COMMIT" in line for line in sent)
    assert business_ids(admin) == [3]
    state = load_committed_state(repository, context_of(step))
    assert state.checkpoint == cursor(3) and state.counts.committed == 3
    session.close()


def test_connection_lost_before_commit_is_not_committed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    """Before COMMIT nothing is unknown; a dead connection there is NotCommitted."""
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    chunk = manager.begin(context_of(step))
    chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
    terminate(admin, chunk.connection.info.backend_pid)  # after the business writes
    with pytest.raises(NotCommitted):
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    assert not chunk.is_open
    assert business_ids(admin) == []
    assert stored_step(repository, step.id).version == step.version

    # A business statement on a dead connection is Infrastructure; the chunk is then closed.
    chunk = manager.begin(context_of(step))
    terminate(admin, chunk.connection.info.backend_pid)
    with pytest.raises(Infrastructure):
        chunk.execute("INSERT INTO public.orders VALUES (1, 'lost')")
    with pytest.raises(NotCommitted):
        commit(chunk, ChunkCounts(read=1), checkpoint=cursor(1))
    commit_chunk(manager, step, 1)
    assert stored_step(repository, step.id).metadata.counts.committed == 1


# --------------------------------------------------------------------------- N7


@pytest.fixture
def tampered_step(
    repository: JobRepository, clock: ManualClock
) -> Iterator[tuple[StepExecution, FirstChunks]]:
    step = started_step(repository, clock)
    manager = chunks_on(repository)
    commit_chunk(manager, step, 1)
    bound_fault_state(repository, step).reserve(entry(1, 1))
    yield step, manager


def test_a_fault_state_checksum_mismatch_fails_closed(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    tampered_step: tuple[StepExecution, FirstChunks],
) -> None:
    """Scenario N7."""
    step, manager = tampered_step
    bound = bound_fault_state(repository, step)
    # Rewrite the ordinal 1 -> 2 but keep the old checksum.
    admin.execute(
        """
        UPDATE pybatch.step_execution
        SET fault_state_payload = jsonb_set(fault_state_payload, '{entries,0,ordinal}', '2')
        WHERE id = %s
        """,
        (step.id,),
    )
    context = context_of(step)
    with pytest.raises(FaultStateCorrupt):
        manager.load_committed_state(context)
    with pytest.raises(FaultStateCorrupt):
        FaultState(repository, POLICY).bind(context)
    with pytest.raises(NotCommitted):
        inherited_progress(repository, context)
    with pytest.raises(NotCommitted):
        manager.begin(context)
    before = raw_step(admin, step.id)
    with pytest.raises(FaultStateCorrupt):  # a store bound before the tamper
        bound.reserve(entry(1, 2))
    assert raw_step(admin, step.id)["version"] == before["version"]
    with pytest.raises(FaultStateCorrupt):
        bound.reserved_ordinal(entry(1, 1).key)


def test_fault_state_from_a_superseded_checkpoint_fails_closed(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    tampered_step: tuple[StepExecution, FirstChunks],
) -> None:
    """Scenario N7."""
    step, _ = tampered_step
    context = context_of(step)
    fault_state = bound_fault_state(repository, step)
    # The checkpoint generation moves on; the retained (correctly checksummed) state stays.
    admin.execute(
        "UPDATE pybatch.step_execution SET checkpoint_payload = '{\"offset\": 2}' WHERE id = %s",
        (step.id,),
    )
    with pytest.raises(FaultStateCorrupt):
        FaultState(repository, POLICY).bind(context)
    with pytest.raises(NotCommitted):
        inherited_progress(repository, context)
    version = raw_step(admin, step.id)["version"]
    with pytest.raises(FaultStateCorrupt):
        fault_state.reserve(entry(1, 2))
    with pytest.raises(FaultStateCorrupt):
        fault_state.reserve(entry(2, 1))
    assert raw_step(admin, step.id)["version"] == version
    # Reads of a bound store fail closed too (the fault state is verified on every load).
    with pytest.raises(FaultStateCorrupt):
        fault_state.reserved_ordinal(entry(1, 1).key)


def test_fault_state_above_the_policy_fails_closed(
    repository: JobRepository,
    tampered_step: tuple[StepExecution, FirstChunks],
) -> None:
    """A retained ordinal above the retry limit, or more keys than the state limit. Scenario N7."""
    step, _ = tampered_step
    bound_fault_state(repository, step).reserve(entry(1, 2))
    bound_fault_state(repository, step).reserve(entry(2, 1))
    with pytest.raises(FaultStateCorrupt):
        FaultState(repository, RetryPolicy(RetryLimit(1), RetryStateLimit(4))).bind(
            context_of(step)
        )
    with pytest.raises(FaultStateCorrupt):
        FaultState(repository, RetryPolicy(RetryLimit(3), RetryStateLimit(1))).bind(
            context_of(step)
        )
