"""Chunk commits and retry reservations racing on one step (O3, O4).

Rows "Two chunk commits for one step" (CAS on version and STARTED: one chunk advances the
checkpoint, the other is NotCommitted) and "Two retry reservations of the same ordinal"
(row lock + CAS: the ordinal is spent once, the other is StaleReservation). Threads are
released by a barrier and every race repeats; one race runs in two spawned processes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any, cast

import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch._chunks import ChunkTransaction, StepSession, load_committed_state
from pybatch._fault_state import FaultState, RetryPolicy
from pybatch.errors import NotCommitted, StaleReservation
from pybatch.values.chunks import ChunkContext, ChunkCounts, CommittedStepState
from pybatch.values.counts import ExecutionCounts
from pybatch.values.fault import (
    FaultEntry,
    FaultPhase,
    RetryKey,
    RetryLimit,
    RetryOrdinal,
    RetryStateLimit,
)
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import ClassifierRevision, JobName, StateSchemaId, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import StepExecution
from pybatch.values.state import Checkpoint
from pybatch.values.status import BatchStatus, FailureCategory
from tests.support.chunks import FirstChunks, commit
from tests.support.clock import ManualClock
from tests.support.owners import TEST_OWNER, claim_test_owner
from tests.support.race import DEADLINE_SECONDS, portable, race, race_processes
from tests.support.statements import create_step

pytestmark = pytest.mark.race

ITERATIONS = 5
SCHEMA = StateSchemaId("tests.orders.cursor.v1")
POLICY = RetryPolicy(RetryLimit(ITERATIONS + 1), RetryStateLimit(4))
CHUNK = ChunkCounts(read=3, processed=3, written=2, filtered=1)
_runs = itertools.count(1)


def started_step(repository: JobRepository, clock: ManualClock) -> StepExecution:
    key = JobInstanceKey(JobName("chunk-race"), JobParameters.of({"run": next(_runs)}))
    with repository.begin() as uow:
        execution = uow.executions.create(uow.instances.select_or_create(key).instance.id)
        execution = claim_test_owner(uow, execution, clock.advance())
        execution = uow.executions.transition(
            execution.id, 0, LifecycleTransition.new(BatchStatus.STARTED, clock.advance())
        )
        step = create_step(uow, execution.id, StepName("load"))
        step = uow.steps.transition(
            step.id, 0, LifecycleTransition.new(BatchStatus.STARTED, clock.advance())
        )
        uow.commit()
    return step


def cursor(offset: int) -> Checkpoint:
    return Checkpoint(SCHEMA, 1, {"offset": offset})


def entry(key_byte: int, ordinal: int) -> FaultEntry:
    return FaultEntry(
        key=RetryKey(bytes([key_byte]) * 32),
        phase=FaultPhase.READ,
        category=FailureCategory.TRANSIENT_INFRASTRUCTURE,
        ordinal=RetryOrdinal(ordinal),
        revision=ClassifierRevision("classifier-1"),
    )


def business_ids(admin: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in admin.execute("SELECT id FROM public.orders ORDER BY id")]


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def step_row(admin: psycopg.Connection[Any], step_id: int) -> tuple[int, ...]:
    row = admin.execute(
        """
        SELECT version, read_count, processed_count, write_count, filter_count, commit_count,
            rollback_count, read_retry_count
        FROM pybatch.step_execution WHERE id = %s
        """,
        (step_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


# --------------------------------------------------------------------------- chunk commits


def test_two_chunk_commits_from_one_version_exactly_one_lands(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any], orders: None
) -> None:
    step = started_step(repository, clock)
    context = ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
    # Two writers: each chunk on a session of its own, each reading the committed state.
    manager = FirstChunks(repository)
    winners: list[int] = []
    for round_ in range(ITERATIONS):
        chunks = [manager.begin(context), manager.begin(context)]
        assert chunks[0].progress.version == chunks[1].progress.version == step.version + round_

        def commit_one(
            index: int, chunks: list[ChunkTransaction] = chunks, round_: int = round_
        ) -> CommittedStepState:
            business_id = 10 * round_ + index
            chunks[index].execute("INSERT INTO public.orders VALUES (%s, 'race')", (business_id,))
            return commit(chunks[index], CHUNK, checkpoint=cursor(business_id))

        outcomes = race(2, commit_one)
        for chunk in chunks:
            chunk.rollback()
        [winner] = [outcome for outcome in outcomes if outcome.ok]
        [loser] = [outcome for outcome in outcomes if not outcome.ok]
        assert isinstance(loser.error, NotCommitted), loser.error
        winners.append(10 * round_ + winner.index)
        assert winner.value is not None and winner.value.version == step.version + round_ + 1

        # One chunk advanced the checkpoint and the counters; only its business row exists.
        state = load_committed_state(repository, context)
        assert state.version == step.version + round_ + 1
        assert state.checkpoint == cursor(winners[-1])
        assert business_ids(admin) == winners
    manager.close()
    n = ITERATIONS
    assert step_row(admin, step.id) == (step.version + n, 3 * n, 3 * n, 2 * n, n, n, 0, 0)


# --------------------------------------------------------------------------- reservations


def test_two_reservations_of_one_ordinal_spend_it_once(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    step = started_step(repository, clock)
    context = ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
    stores = [FaultState(repository, POLICY), FaultState(repository, POLICY)]
    for store in stores:
        store.bind(context)
    for ordinal in range(1, ITERATIONS + 1):

        def reserve(index: int, ordinal: int = ordinal) -> None:
            stores[index].reserve(entry(1, ordinal))

        outcomes = race(2, reserve)
        assert sorted(outcome.ok for outcome in outcomes) == [False, True]
        [loser] = [outcome for outcome in outcomes if not outcome.ok]
        assert isinstance(loser.error, StaleReservation), loser.error
        assert stores[0].reserved_ordinal(entry(1, 1).key) == RetryOrdinal(ordinal)
    n = ITERATIONS
    # version, 4 zero counters, commit 0, rollback n, read retries n: each ordinal spent once.
    assert step_row(admin, step.id) == (step.version + n, 0, 0, 0, 0, 0, n, n)


def test_concurrent_reservations_of_different_keys_both_land(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """The row lock serializes reservers without losing either update."""
    step = started_step(repository, clock)
    context = ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
    stores = [FaultState(repository, POLICY), FaultState(repository, POLICY)]
    for store in stores:
        store.bind(context)
    for ordinal in range(1, ITERATIONS + 1):

        def reserve_own_key(index: int, ordinal: int = ordinal) -> None:
            stores[index].reserve(entry(1 + index, ordinal))

        outcomes = race(2, reserve_own_key)
        assert all(outcome.ok for outcome in outcomes), [o.error for o in outcomes]
    assert len(load_committed_state(repository, context).fault_state.entries) == 2
    assert stores[1].reserved_ordinal(entry(2, 1).key) == RetryOrdinal(ITERATIONS)
    n = 2 * ITERATIONS
    assert step_row(admin, step.id) == (step.version + n, 0, 0, 0, 0, 0, n, n)


# --------------------------------------------------------------------------- processes


def commit_chunk_in_process(
    config_fields: dict[str, Any], barrier: Any, step_id: int, job_execution_id: int
) -> tuple[str, int]:
    """Child process body: open a chunk, wait for the other process, then commit.

    Both chunks are opened before the barrier, so both start from the same version. The
    business row's id is the process id. Returns (outcome, pid); outcome is "committed",
    or the error's type name.
    """
    pid = os.getpid()
    with JobRepository.connect(ConnectionConfig(**config_fields)) as repository:
        context = ChunkContext(step_id, job_execution_id, TEST_OWNER)
        with (
            contextlib.closing(StepSession(repository, context)) as session,
            session.begin() as chunk,
        ):
            barrier.wait(DEADLINE_SECONDS)
            try:
                chunk.execute("INSERT INTO public.orders VALUES (%s, 'process')", (pid,))
                commit(chunk, CHUNK, checkpoint=cursor(pid))
            except Exception as error:
                return (type(error).__name__, pid)
    return ("committed", pid)


def test_two_processes_commit_chunks_from_one_version(
    repository: JobRepository,
    clock: ManualClock,
    pg_config: ConnectionConfig,
    admin: psycopg.Connection[Any],
    orders: None,
) -> None:
    step = started_step(repository, clock)
    results = cast(
        list[tuple[str, int]],
        race_processes(
            2, commit_chunk_in_process, (portable(pg_config), step.id, step.job_execution_id)
        ),
    )
    assert sorted(outcome for outcome, _ in results) == ["NotCommitted", "committed"]
    [winner_pid] = [pid for outcome, pid in results if outcome == "committed"]
    assert business_ids(admin) == [winner_pid]
    state = load_committed_state(
        repository, ChunkContext(step.id, step.job_execution_id, TEST_OWNER)
    )
    assert state.version == step.version + 1
    assert state.checkpoint == cursor(winner_pid)
    assert state.counts == ExecutionCounts(read=3, processed=3, written=2, filtered=1, committed=1)
