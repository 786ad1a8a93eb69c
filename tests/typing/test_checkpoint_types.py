"""Checkpoints and contexts are typed JSON: mypy refuses what cannot be stored as it is.

mypy checks this file with `warn_unused_ignores` (strict): each `type: ignore[...]` below must
match an error mypy reports, so a checkpoint type that accepted a datetime or a Decimal again
would fail the lint. The calls themselves are refused at run time too (StateMalformed naming
the key path and the type), tested here against a real job.
"""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest

from pybatch import JobRepository
from pybatch.errors import StateMalformed
from pybatch.etl import Chunk, Job, StepRun
from pybatch.values.state import JsonValue


def commits_that_mypy_refuses(chunk: Chunk) -> None:
    """Never run: what mypy must refuse, each line its own error."""
    now = datetime.datetime.now(datetime.UTC)
    chunk.commit(read=1, written=1, checkpoint={"at": now})  # type: ignore[dict-item]
    chunk.commit(read=1, written=1, checkpoint={"amount": Decimal("1.10")})  # type: ignore[dict-item]
    chunk.commit(read=1, written=1, checkpoint={"ids": {1, 2}})  # type: ignore[dict-item]
    chunk.commit(read=1, written=1, checkpoint={}, context={"t": datetime.time()})  # type: ignore[dict-item]


def commits_that_mypy_accepts(chunk: Chunk, offsets: dict[str, int]) -> None:
    """Never run: JSON values, nested, and a mapping typed narrower than JsonValue."""
    chunk.commit(read=1, written=1, checkpoint={"offset": 1, "file": "a.csv", "ratio": 0.5})
    chunk.commit(read=1, written=1, checkpoint={"seen": [1, 2], "last": {"id": None}})
    chunk.commit(read=1, written=1, checkpoint=offsets)


@pytest.mark.parametrize(
    ("checkpoint", "path", "value_type"),
    [
        ({"amount": Decimal("12345678901234567890.10")}, "$.amount", "Decimal"),
        ({"window": {"ends": [datetime.date(2026, 11, 30)]}}, "$.window.ends[0]", "date"),
    ],
)
def test_a_decimal_or_a_date_in_a_checkpoint_is_refused_naming_its_path_and_type(
    repository: JobRepository, checkpoint: dict[str, object], path: str, value_type: str
) -> None:
    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint=checkpoint)  # type: ignore[arg-type]

    with pytest.raises(StateMalformed) as refused:
        with Job(repository, "typed_checkpoint", {"run": path}).launch() as run:
            run.step("load", work)
    assert (refused.value.path, refused.value.value_type) == (path, value_type)
    assert f"path {path}" in str(refused.value) and value_type in str(refused.value)
    assert "12345678901234567890" not in str(refused.value)  # the value is never shown


def test_floats_ints_and_nested_json_come_back_as_committed(repository: JobRepository) -> None:
    committed: dict[str, JsonValue] = {
        "offset": 7,
        "ratio": 0.1,
        "file": "é.csv",
        "seen": [1, None, True],
    }
    read_back: list[dict[str, JsonValue]] = []

    def first(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint=committed)
        raise RuntimeError("fail after the commit, to restart from its checkpoint")

    def second(step: StepRun) -> None:
        read_back.append(step.checkpoint)

    job = Job(repository, "json_checkpoint", {})
    with pytest.raises(RuntimeError), job.launch() as run:
        run.step("load", first)
    with job.launch() as run:
        run.step("load", second)
    assert read_back == [committed]
