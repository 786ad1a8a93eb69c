"""Bad checkpoint and context values are refused with typed errors before they reach the server.

Each one used to reach PostgreSQL (a NUL, which jsonb cannot store), be stored and then fail
to read back (a 5,000-digit number), or escape as a raw TypeError (a list or None). Now the
chunk's commit refuses it before pybatch's progress statements run; the chunk rolls back,
so the business rows of that chunk are not written and the step's state is unchanged.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import StateError, StateMalformed, StatePayloadNotObject
from pybatch.etl import Job, StepRun
from pybatch.values.status import BatchStatus

DAY = {"business_date": "2026-11-30"}


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def order_count(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM public.orders").fetchone()
    assert row is not None
    return int(row[0])


BAD_CHECKPOINTS: list[tuple[str, Any, Any, type[StateError]]] = [
    ("nul in a checkpoint string", {"file": "a\x00b"}, None, StateMalformed),
    ("nul in a checkpoint key", {"a\x00": 1}, None, StateMalformed),
    ("nul in a context string", {"offset": 1}, {"file": "\x00"}, StateMalformed),
    ("5,000-digit checkpoint integer", {"offset": 10**4999}, None, StateMalformed),
    ("5,000-digit checkpoint decimal", {"offset": Decimal("9" * 5000)}, None, StateMalformed),
    ("5,000-digit decimal fraction", {"f": Decimal("0." + "1" * 5000)}, None, StateMalformed),
    ("checkpoint that is a list", [1, 2], None, StatePayloadNotObject),
    ("checkpoint that is None", None, None, StatePayloadNotObject),
    ("context that is a list", {"offset": 1}, [1], StatePayloadNotObject),
]


@pytest.mark.parametrize(
    ("checkpoint", "context", "expected"),
    [case[1:] for case in BAD_CHECKPOINTS],
    ids=[case[0] for case in BAD_CHECKPOINTS],
)
def test_a_bad_checkpoint_or_context_is_refused_and_nothing_is_written(
    repository: JobRepository,
    admin: psycopg.Connection[Any],
    orders: None,
    checkpoint: Any,
    context: Any,
    expected: type[StateError],
) -> None:
    good_then_bad: list[str] = []

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'good')")
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        good_then_bad.append("good")
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (2, 'bad')")
            chunk.commit(read=1, written=1, checkpoint=checkpoint, context=context)
        good_then_bad.append("bad")

    job = Job(repository, "bad_state", DAY)
    with pytest.raises(expected), job.launch() as run:
        run.step("load", work)
    assert good_then_bad == ["good"]
    assert order_count(admin) == 1  # the bad chunk's row rolled back with it
    with repository.begin() as uow:
        [execution] = uow.executions.of_instance(run.instance.id)
        [step] = uow.steps.of_execution(execution.id)
    assert step.checkpoint.payload == {"offset": 1}
    assert (step.metadata.counts.read, step.metadata.counts.committed) == (1, 1)
    assert execution.status is BatchStatus.FAILED

    # The restart reads the committed state back without error and resumes from it.
    resumed: list[int] = []

    def resume(step: StepRun) -> None:
        resumed.append(int(step.checkpoint["offset"]))

    with Job(repository, "bad_state", DAY).launch() as rerun:
        rerun.step("load", resume)
    assert resumed == [1]


def test_written_processed_and_filtered_above_read_are_stored_as_given(
    repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    """The contract's counters are independent: a chunk that expands one
    source row into several target rows writes more than it reads."""

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'a'), (2, 'b'), (3, 'c')")
            chunk.commit(read=1, processed=2, written=3, filtered=2, checkpoint={"offset": 1})

    with Job(repository, "expanding", DAY).launch() as run:
        outcome = run.step("load", work)
    counts = outcome.step.metadata.counts
    assert (counts.read, counts.processed, counts.written, counts.filtered) == (1, 2, 3, 2)
    assert order_count(admin) == 3
