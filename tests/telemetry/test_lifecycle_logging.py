"""Lifecycle log lines: INFO under `pybatch`, with structured fields, none per chunk.

A JSON formatter reads `job`, `instance`, `execution` and `step` from each record's
attributes (the `extra=` of the call); parameter values never appear.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from pybatch import JobRepository
from pybatch.etl import Job, StepRun

SECRET_DATE = "2026-11-30-secret"


def loader(chunks: int) -> Any:
    def work(step: StepRun) -> None:
        for offset in range(chunks):
            with step.chunk() as chunk:
                chunk.commit(read=1, written=1, checkpoint={"offset": offset + 1})

    return work


def failing(step: StepRun) -> None:
    raise RuntimeError(f"row {SECRET_DATE} was bad")


def lifecycle(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """pybatch's INFO and louder records from the thread that ran the job.

    Lease keepers log from threads of their own, and one left by an earlier test of the
    session (a run it abandoned on purpose) may log while this test runs.
    """
    here = threading.get_ident()
    return [
        r
        for r in caplog.records
        if r.name.startswith("pybatch") and r.levelno >= logging.INFO and r.thread == here
    ]


def test_job_and_step_start_and_end_are_info_lines_with_structured_fields(
    repository: JobRepository, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pybatch")
    with Job(repository, "logged_load", {"business_date": SECRET_DATE}).launch() as run:
        run.step("load", loader(3))
    records = lifecycle(caplog)
    messages = [r.getMessage() for r in records]
    assert len(records) == 4, messages  # job start, step start, step end, job end
    assert all(r.levelno == logging.INFO for r in records)
    assert "started" in messages[0] and "ended COMPLETED" in messages[-1]
    assert "step load started" in messages[1] and "step load ended COMPLETED" in messages[2]
    for record in records:
        fields = record.__dict__
        assert (fields["job"], fields["instance"], fields["execution"]) == (
            "logged_load",
            run.instance.id,
            run.execution.id,
        )
    assert [r.__dict__.get("step") for r in records] == [None, "load", "load", None]
    assert not [m for m in messages if SECRET_DATE in m]


def test_chunks_log_nothing_above_debug(
    repository: JobRepository, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pybatch")
    with Job(repository, "many_chunks", {}).launch() as run:
        run.step("load", loader(20))
    assert len(lifecycle(caplog)) == 4


def test_a_failed_step_logs_its_end_with_the_error_type_and_never_its_message(
    repository: JobRepository, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pybatch")
    with pytest.raises(RuntimeError), Job(repository, "failed_load", {}).launch() as run:
        run.step("load", failing)
    messages = [r.getMessage() for r in lifecycle(caplog)]
    assert "pybatch: step load ended FAILED (RuntimeError)" in messages
    assert messages[-1].endswith("ended FAILED")
    assert not [m for m in messages if SECRET_DATE in m]
    assert run.execution.status.value == "FAILED"
