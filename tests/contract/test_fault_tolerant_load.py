"""`StepRun.load`: rejected rows are skipped by bisection, transient failures are retried.

What a script author relies on: the target ends up as the source minus exactly the rows the
server rejected for their data; each such row has a skip record naming it (position, key,
SQLSTATE, constraint) and nothing else does; the step's counters agree with both; bisection
costs O(bad x log chunk) write calls; a skip limit fails the step without committing any of
the chunk that crossed it; and a serialization failure or a lock timeout is retried on a
fresh transaction, each retry counted durably before its backoff.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository
from pybatch.errors import LockTimeout, SkipLimitExceeded, TransientConflict
from pybatch.etl import Backoff, Chunk, Job, LoadResult, StepRun
from tests.conftest import plaintext_config

FAST = Backoff(initial=0.001, maximum=0.01)
TABLE = (
    "CREATE TABLE public.target (id BIGINT PRIMARY KEY, amount INTEGER NOT NULL"
    " CONSTRAINT target_amount_positive CHECK (amount > 0), note TEXT NOT NULL)"
)
COPY = "COPY public.target (id, amount, note) FROM STDIN"
INSERT = "INSERT INTO public.target (id, amount, note) VALUES (%s, %s, %s)"

Row = tuple[int, int, str | None]


@pytest.fixture
def target(admin: psycopg.Connection[Any]) -> None:
    admin.execute(TABLE)


def source(total: int, bad: dict[int, str]) -> list[Row]:
    """Rows 1..total; the ones at the positions in `bad` break the CHECK or the NOT NULL."""
    rows: list[Row] = []
    for position in range(total):
        kind = bad.get(position)
        amount = -1 if kind == "check" else position + 1
        rows.append((position + 1, amount, None if kind == "not_null" else f"row {position}"))
    return rows


def reader(rows: list[Row]) -> Callable[[int], Iterator[Row]]:
    def read(position: int) -> Iterator[Row]:
        return iter(rows[position:])

    return read


class Writer:
    """`write` for `StepRun.load` by COPY or executemany, counting its calls."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

    def __call__(self, chunk: Chunk, items: list[Row]) -> None:
        self.calls += 1
        if self.mode == "copy":
            chunk.copy(COPY, items)
        else:
            chunk.executemany(INSERT, items)


def target_ids(admin: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in admin.execute("SELECT id FROM public.target ORDER BY id")]


def skip_records(admin: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return admin.execute(
        "SELECT item_position, item_key, sqlstate, constraint_name, column_name, message"
        " FROM pybatch.step_skip ORDER BY item_position"
    ).fetchall()


def step_row(admin: psycopg.Connection[Any]) -> dict[str, Any]:
    cursor = admin.execute(
        "SELECT status, read_count, write_count, commit_count, write_skip_count,"
        " write_retry_count, checkpoint_payload, failure_error_class"
        " FROM pybatch.step_execution ORDER BY id DESC LIMIT 1"
    )
    row = cursor.fetchone()
    assert row is not None and cursor.description is not None
    return dict(zip([column.name for column in cursor.description], row, strict=True))


def run_load(
    repository: JobRepository, name: str, work: Callable[[StepRun], LoadResult]
) -> list[LoadResult]:
    results: list[LoadResult] = []

    def step_work(step: StepRun) -> None:
        results.append(work(step))

    with Job(repository, name, {}).launch() as run:
        run.step("load", step_work)
    return results


@pytest.mark.parametrize("mode", ["copy", "executemany"])
def test_the_target_is_the_source_minus_exactly_the_rejected_rows(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None, mode: str
) -> None:
    generator = random.Random(f"fault-tolerant-{mode}")
    total, size = 3000, 500
    positions = generator.sample(range(total), 12)
    bad = {p: ("check" if i % 2 else "not_null") for i, p in enumerate(positions)}
    rows = source(total, bad)
    write = Writer(mode)

    results = run_load(
        repository,
        f"skips_{mode}",
        lambda step: step.load(
            reader(rows), write, chunk_size=size, key=lambda row: f"id {row[0]}", skip_limit=20
        ),
    )

    expected = [row[0] for position, row in enumerate(rows) if position not in bad]
    assert target_ids(admin) == expected
    records = skip_records(admin)
    assert [(r[0], r[1]) for r in records] == [(p, f"id {p + 1}") for p in sorted(bad)]
    for position, _key, sqlstate, constraint, column, message in records:
        if bad[position] == "check":
            assert (sqlstate, constraint) == ("23514", "target_amount_positive")
        else:
            assert (sqlstate, constraint, column) == ("23502", None, "note")
        assert sqlstate in message and "row" not in message  # pybatch's words, no values
    step = step_row(admin)
    assert step["status"] == "COMPLETED"
    assert (step["read_count"], step["write_count"]) == (total, total - len(bad))
    assert step["write_skip_count"] == len(bad)
    assert step["commit_count"] == total // size
    assert step["checkpoint_payload"] == {"position": total}
    assert results == [
        LoadResult(
            read=total, written=total - len(bad), skipped=len(bad), retries=0, position=total
        )
    ]
    # One write per chunk, plus at most two per bad row and bisection level.
    chunks = total // size
    assert write.calls <= chunks * 2 + 2 * len(bad) * math.ceil(math.log2(size))
    assert write.calls < total / 10  # far from one write per row


def test_bisection_costs_write_calls_logarithmic_in_the_chunk(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    """executemany's rejection names no row: the chunk is bisected."""
    size = 1024
    rows = source(size, {700: "check"})
    write = Writer("executemany")

    run_load(
        repository,
        "one_bad_row",
        lambda step: step.load(reader(rows), write, chunk_size=size, skip_limit=1),
    )

    # The whole batch, then at most both halves of each of the 10 levels down to the bad row
    # (a right half is split unwritten when its left half was written: the bad row is in it).
    levels = int(math.log2(size))
    assert 1 + levels <= write.calls <= 1 + 2 * levels
    assert len(target_ids(admin)) == size - 1
    assert [r[:2] for r in skip_records(admin)] == [(700, "700")]  # default key: the position


def test_a_rejected_copy_row_is_found_from_the_line_the_server_names(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    """No bisection: the rows before the named line, the row alone, then the rest."""
    size = 1024
    bad = {100: "check", 700: "not_null", 1023: "check"}
    rows = source(size, bad)
    write = Writer("copy")

    run_load(
        repository,
        "named_lines",
        lambda step: step.load(reader(rows), write, chunk_size=size, skip_limit=3),
    )

    # The whole batch, then per bad row the rows before it, the row alone and (but after the
    # last row) the rest.
    assert write.calls == 1 + 3 * len(bad) - 1
    assert target_ids(admin) == [row[0] for p, row in enumerate(rows) if p not in bad]
    assert [r[:2] for r in skip_records(admin)] == [(p, str(p)) for p in sorted(bad)]


class Reversed(Writer):
    """COPY the items in reverse order: the line the server names is not the item's."""

    def __call__(self, chunk: Chunk, items: list[Row]) -> None:
        super().__call__(chunk, items[::-1])


@pytest.mark.parametrize("seed", range(4))
def test_a_copy_whose_lines_are_not_the_items_still_skips_exactly_the_rejected_rows(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None, seed: int
) -> None:
    generator = random.Random(f"misleading-lines-{seed}")
    total, size = 600, 200
    bad = {p: generator.choice(["check", "not_null"]) for p in generator.sample(range(total), 7)}
    rows = source(total, bad)

    (result,) = run_load(
        repository,
        f"reversed_{seed}",
        lambda step: step.load(reader(rows), Reversed("copy"), chunk_size=size, skip_limit=7),
    )

    assert target_ids(admin) == [row[0] for p, row in enumerate(rows) if p not in bad]
    assert [r[0] for r in skip_records(admin)] == sorted(bad)
    assert result == LoadResult(read=total, written=total - 7, skipped=7, retries=0, position=total)
    assert step_row(admin)["write_skip_count"] == 7


def test_a_clean_load_writes_each_chunk_once_and_records_no_skip(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    rows = source(2500, {})
    write = Writer("copy")

    (result,) = run_load(
        repository, "clean", lambda step: step.load(reader(rows), write, chunk_size=1000)
    )

    assert write.calls == 3
    assert result == LoadResult(read=2500, written=2500, skipped=0, retries=0, position=2500)
    assert skip_records(admin) == []
    assert step_row(admin)["commit_count"] == 3


def test_exceeding_the_skip_limit_fails_the_step_and_commits_nothing_of_that_chunk(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    rows = source(400, {10: "check", 250: "not_null", 260: "check"})

    with pytest.raises(SkipLimitExceeded) as refused:
        run_load(
            repository,
            "limited",
            lambda step: step.load(reader(rows), Writer("copy"), chunk_size=100, skip_limit=2),
        )

    assert (refused.value.limit, refused.value.step, refused.value.skips) == (2, "load", 3)
    assert "raise skip_limit or fix the source rows" in (type(refused.value).__doc__ or "")
    # Chunks 0 and 1 committed (one skip); chunk 2 crossed the limit: none of it is durable.
    assert target_ids(admin) == [i for i in range(1, 201) if i != 11]
    assert [r[0] for r in skip_records(admin)] == [10]
    step = step_row(admin)
    assert step["status"] == "FAILED"
    assert step["failure_error_class"] == "pybatch.errors.SkipLimitExceeded"
    assert (step["checkpoint_payload"], step["write_skip_count"]) == ({"position": 200}, 1)


def test_a_skip_limit_of_zero_fails_at_the_first_rejected_row_without_bisecting(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    rows = source(100, {42: "check"})
    write = Writer("executemany")

    with pytest.raises(SkipLimitExceeded):
        run_load(repository, "strict", lambda step: step.load(reader(rows), write, chunk_size=100))

    assert write.calls == 1
    assert target_ids(admin) == [] and skip_records(admin) == []


def conflicts(admin: psycopg.Connection[Any], failures: int, sqlstate: str = "40001") -> None:
    """The first `failures` rows inserted raise `sqlstate` (a sequence outlives a rollback)."""
    admin.execute("CREATE SEQUENCE public.conflict_count")
    admin.execute(
        "CREATE FUNCTION public.conflict() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        f" IF nextval('public.conflict_count') <= {failures} THEN"
        f" RAISE EXCEPTION 'conflict' USING ERRCODE = '{sqlstate}'; END IF; RETURN NEW; END $$"
    )
    admin.execute(
        "CREATE TRIGGER conflict BEFORE INSERT ON public.target"
        " FOR EACH ROW EXECUTE FUNCTION public.conflict()"
    )


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_a_serialization_failure_or_deadlock_is_retried_and_counted_durably(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None, sqlstate: str
) -> None:
    conflicts(admin, 2, sqlstate)
    rows = source(300, {})

    (result,) = run_load(
        repository,
        "conflicted",
        lambda step: step.load(reader(rows), Writer("copy"), chunk_size=100, backoff=FAST),
    )

    assert result.retries == 2
    assert len(target_ids(admin)) == 300
    step = step_row(admin)
    assert (step["status"], step["write_retry_count"], step["write_count"]) == ("COMPLETED", 2, 300)


def test_retries_end_at_the_limit_with_the_last_error_and_a_restart_keeps_the_count(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    conflicts(admin, 10**6)
    rows = source(50, {})

    def work(limit: int) -> Callable[[StepRun], LoadResult]:
        return lambda step: step.load(
            reader(rows), Writer("copy"), chunk_size=50, retry_limit=limit, backoff=FAST
        )

    with pytest.raises(TransientConflict) as failed:
        run_load(repository, "always_conflicted", work(2))
    assert failed.value.sqlstate == "40001"
    assert step_row(admin)["write_retry_count"] == 2
    # The restart inherits the two reserved retries of that chunk: one more is left.
    with pytest.raises(TransientConflict):
        run_load(repository, "always_conflicted", work(3))
    step = step_row(admin)
    assert (step["status"], step["write_retry_count"]) == ("FAILED", 3)
    assert target_ids(admin) == []


def test_a_lock_timeout_is_retried_until_the_lock_is_released(
    db_dsn: str, admin: psycopg.Connection[Any], target: None
) -> None:
    config = plaintext_config(db_dsn, pool_size=4, lock_timeout=timedelta(milliseconds=100))
    holder = psycopg.connect(db_dsn)
    holder.execute("LOCK TABLE public.target IN SHARE MODE")
    released = threading.Timer(0.5, holder.rollback)
    released.start()
    rows = source(100, {})
    started = time.monotonic()
    try:
        with JobRepository.connect(config) as repository:
            (result,) = run_load(
                repository,
                "locked",
                lambda step: step.load(
                    reader(rows),
                    Writer("executemany"),
                    chunk_size=100,
                    retry_limit=10,
                    backoff=Backoff(initial=0.05, maximum=0.2),
                ),
            )
    finally:
        released.join()
        holder.close()

    assert time.monotonic() - started >= 0.5
    assert result.retries >= 1
    assert len(target_ids(admin)) == 100
    assert step_row(admin)["write_retry_count"] == result.retries


def test_a_lock_timeout_past_the_retry_limit_fails_the_step_with_it(
    db_dsn: str, admin: psycopg.Connection[Any], target: None
) -> None:
    config = plaintext_config(db_dsn, pool_size=4, lock_timeout=timedelta(milliseconds=50))
    holder = psycopg.connect(db_dsn)
    holder.execute("LOCK TABLE public.target IN SHARE MODE")
    try:
        with JobRepository.connect(config) as repository, pytest.raises(LockTimeout):
            run_load(
                repository,
                "stuck",
                lambda step: step.load(
                    reader(source(10, {})), Writer("copy"), retry_limit=1, backoff=FAST
                ),
            )
    finally:
        holder.close()
    assert step_row(admin)["write_retry_count"] == 1


def test_a_duplicate_key_within_a_chunk_skips_the_later_row_only(
    repository: JobRepository, admin: psycopg.Connection[Any], target: None
) -> None:
    rows: list[Row] = [(i, i, f"row {i}") for i in range(1, 101)]
    rows[80] = (20, 5, "again")  # position 80 repeats id 20 of position 19

    run_load(
        repository,
        "duplicates",
        lambda step: step.load(reader(rows), Writer("copy"), chunk_size=100, skip_limit=1),
    )

    assert target_ids(admin) == [i for i in range(1, 101) if i != 81]
    assert [(r[0], r[2], r[3]) for r in skip_records(admin)] == [(80, "23505", "target_pkey")]
    assert admin.execute("SELECT note FROM public.target WHERE id = 20").fetchone() == ("row 20",)
