"""A run handles SIGTERM only while it is active, and gives the previous handler back."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from pybatch import JobRepository
from pybatch.etl import Job, StepRun

DAY = {"business_date": "2026-11-30"}


def _mine(signum: int, frame: Any) -> None:
    raise AssertionError("the script's own handler ran during the run")


@pytest.fixture
def own_handler() -> Any:
    previous = signal.signal(signal.SIGTERM, _mine)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_the_run_replaces_sigterm_only_while_active_and_stops_on_it(
    repository: JobRepository, own_handler: None
) -> None:
    seen: list[Any] = []

    def work(step: StepRun) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        signal.raise_signal(signal.SIGTERM)  # delivered to the run's handler, not `_mine`
        step.chunk()  # the next chunk boundary: StopRequested

    with Job(repository, "sigterm", DAY).launch() as run:
        run.step("load", work)
    assert run.stopped
    assert seen[0] is not _mine
    assert signal.getsignal(signal.SIGTERM) is _mine


def test_a_run_that_dies_unentered_gives_the_handler_back(
    repository: JobRepository, own_handler: None
) -> None:
    run = Job(repository, "sigterm", DAY).launch()
    assert signal.getsignal(signal.SIGTERM) is not _mine
    run._stop_renewing()
    assert signal.getsignal(signal.SIGTERM) is _mine


def test_a_run_in_another_thread_leaves_sigterm_alone(
    repository: JobRepository, own_handler: None
) -> None:
    seen: list[Any] = []

    def launch() -> None:
        with Job(repository, "sigterm", DAY).launch() as run:
            seen.append(signal.getsignal(signal.SIGTERM))
            run.step("load", lambda step: None)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join(30)
    assert seen == [_mine]
