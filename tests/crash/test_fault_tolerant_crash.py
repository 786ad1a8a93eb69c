"""Crash proof of `StepRun.load`: a load SIGKILLed while isolating rejected rows resumes exactly.

A child process (tests/crash/skip_worker.py) loads a 3,000-row source with about one bad row
in 60 in chunks of 200, by COPY (each rejected row found from the line the server names) and
by executemany (found by bisection), and is SIGKILLed six times while a chunk's rejected rows
are being isolated: some of the chunk's good rows are written in its transaction, nothing of
it is committed.
After each kill, the durable state must be exactly the chunks committed before it: the
target holds the good source rows before the checkpoint's position and nothing else, the
skip records name exactly the bad rows before it, once each, and the step's counters agree.
The restart redoes the killed chunk's isolation from scratch; the last run completes with
the target equal to the source minus the bad rows and one skip record per bad row.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.crash import skip_worker as w
from tests.crash.test_etl_crash import ROOT, Worker, wait_for_worker_sessions_to_end

pytestmark = pytest.mark.crash

SEED = int(os.environ.get("PYBATCH_CRASH_SEED", "20261204"))
KILLS = 6
MODULE = "tests.crash.skip_worker"


def durable(admin: psycopg.Connection[Any]) -> dict[str, Any]:
    """The newest step's progress, the target's ids and the skip records' positions."""
    wait_for_worker_sessions_to_end(admin)
    step = admin.execute(
        "SELECT checkpoint_payload, read_count, write_count, write_skip_count"
        " FROM pybatch.step_execution ORDER BY id DESC LIMIT 1"
    ).fetchone()
    assert step is not None
    return {
        "position": step[0].get("position", 0),
        "read": step[1],
        "written": step[2],
        "skips": step[3],
        "ids": [row[0] for row in admin.execute(f"SELECT id FROM {w.TABLE} ORDER BY id")],
        "skipped": admin.execute(
            "SELECT item_position, item_key FROM pybatch.step_skip ORDER BY item_position"
        ).fetchall(),
    }


def check_exact(state: dict[str, Any], context: str) -> None:
    position = state["position"]
    bad = w.bad_positions(position)
    good = [p + 1 for p in range(position) if not w.is_bad(p)]
    assert state["ids"] == good, f"{context}: the target is not the good rows before {position}"
    assert state["skipped"] == [(p, f"id {p + 1}") for p in bad], f"{context}: skip records"
    assert (state["read"], state["written"], state["skips"]) == (position, len(good), len(bad)), (
        f"{context}: counters {state['read']}, {state['written']}, {state['skips']}"
    )


@pytest.mark.parametrize("write", ["copy", "executemany"])
def test_a_load_sigkilled_while_isolating_rejected_rows_resumes_exactly(
    db_dsn: str, admin: psycopg.Connection[Any], tmp_path: Path, write: str
) -> None:
    rng = random.Random(SEED)
    admin.execute(w.CREATE_TABLE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBATCH_", "CRASH_"))}
    env.update(
        PYBATCH_DSN=db_dsn,
        PYBATCH_TLS="plaintext",
        CRASH_RUN=f"skip-crash-{SEED}",
        CRASH_WRITE=write,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    previous = 0
    workers: list[Worker] = []
    try:
        for number in range(1, KILLS + 1):
            call = rng.randint(1, 30)
            context = f"seed {SEED}, {write}, kill {number}/{KILLS} (isolating write {call})"
            worker = Worker(
                env | {"CRASH_PAUSE_CALL": str(call)}, tmp_path / f"w{number}.log", MODULE
            )
            workers.append(worker)
            begin: int | None = None
            while True:
                words = worker.next_line()[1]
                assert words is not None, f"{context}: the worker ended before the kill"
                if words[0] == "begin":
                    begin = int(words[1])
                elif words[0] == "ready":
                    start = int(words[1]) // w.CHUNK * w.CHUNK  # the isolating chunk
                    break
            worker.kill()
            assert worker.wait() == -signal.SIGKILL, f"{context}: the worker ended first"
            state = durable(admin)
            assert begin == previous, f"{context}: resumed at {begin}, not {previous}"
            assert state["position"] == start, f"{context}: the isolating chunk is not undone"
            check_exact(state, context)
            previous = state["position"]
            assert previous < w.ROWS, f"{context}: the load finished before all kills"

        final = Worker(env | {"CRASH_PAUSE_CALL": "0"}, tmp_path / "final.log", MODULE)
        workers.append(final)
        said: list[list[str]] = []
        while (words := final.next_line()[1]) is not None:
            said.append(words)
        assert final.wait() == 0, f"seed {SEED}: the last run failed: {said}"
        assert said[-1] == ["done"] and ["begin", str(previous)] in said, said
    except BaseException:
        print(f"crash test seed {SEED} (rerun with PYBATCH_CRASH_SEED={SEED})")
        for worker in workers:
            print(f"--- {worker._log.name}\n{Path(worker._log.name).read_text()[-3000:]}")
        raise
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.kill()
                worker.process.wait()

    state = durable(admin)
    assert state["position"] == w.ROWS
    check_exact(state, "after the last run")
    assert len(state["skipped"]) == len(w.bad_positions()) > KILLS
