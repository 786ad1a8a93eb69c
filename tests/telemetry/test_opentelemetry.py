"""OpenTelemetry (the `otel` extra, docs/operators.md): spans and metrics of real jobs.

The SDK's in-memory exporter and reader sit on the global providers, which a process can set
only once: one module-scoped fixture sets them, and each test uses a job name of its own, so
the cumulative metrics of earlier tests never count in its assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pybatch import JobRepository
from pybatch.errors import ChunkNotEnded, Rejected
from pybatch.etl import Job, StepRun
from pybatch.testing import JobRunner
from tests.contract.test_etl_api import SHORT_LEASE, start_open_step, wait_for_lease_expiry
from tests.support.clock import ManualClock

DAY = {"business_date": "2026-11-30"}


class Telemetry:
    """The in-memory exporter and reader on the global providers."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]

    def points(self, metric: str, job: str) -> list[Any]:
        """The data points of `metric` whose attributes name `job`."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for instrument in scope.metrics:
                    if instrument.name != metric:
                        continue
                    for point in instrument.data.data_points:
                        if (point.attributes or {}).get("pybatch.job.name") == job:
                            found.append(point)
        return found

    def total(self, metric: str, job: str) -> int:
        return sum(point.value for point in self.points(metric, job))


@pytest.fixture(scope="module")
def installed() -> Telemetry:
    telemetry = Telemetry()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(telemetry.spans))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[telemetry.reader]))
    if trace.get_tracer_provider() is not tracer_provider:
        pytest.skip("another tracer provider was set in this process first")
    return telemetry


@pytest.fixture
def telemetry(installed: Telemetry) -> Iterator[Telemetry]:
    installed.spans.clear()
    yield installed
    installed.spans.clear()


@pytest.fixture
def orders(admin: psycopg.Connection[Any]) -> None:
    admin.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text NOT NULL)")


def loader(total: int, size: int, *, pause: float = 0.0) -> Any:
    """A step loading ids 1..total in chunks of `size`, resuming from its checkpoint."""

    def work(step: StepRun) -> None:
        offset = int(step.checkpoint.get("offset", 0))
        while offset < total:
            batch = list(range(offset + 1, min(offset + size, total) + 1))
            with step.chunk() as chunk:
                chunk.executemany(
                    "INSERT INTO public.orders (id, note) VALUES (%s, %s)",
                    [(item, "loaded") for item in batch],
                )
                offset += len(batch)
                chunk.commit(read=len(batch), written=len(batch), checkpoint={"offset": offset})
            time.sleep(pause)

    return work


def rows(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM public.orders").fetchone()
    assert row is not None
    return int(row[0])


def test_a_job_traces_job_step_and_chunk_spans_and_counts_what_it_loaded(
    telemetry: Telemetry, repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    with Job(repository, "traced_load", DAY).launch() as run:
        run.step("load", loader(5, 2))
    assert rows(admin) == 5

    [job] = telemetry.named("pybatch job traced_load")
    [step] = telemetry.named("pybatch step load")
    chunks = telemetry.named("pybatch chunk")
    assert len(chunks) == 3
    assert job.parent is None
    assert step.parent is not None and step.parent.span_id == job.context.span_id
    assert {chunk.parent.span_id for chunk in chunks if chunk.parent} == {step.context.span_id}
    assert {span.context.trace_id for span in [step, *chunks]} == {job.context.trace_id}

    assert dict(job.attributes or {}) == {
        "pybatch.job.name": "traced_load",
        "pybatch.job.instance_id": run.instance.id,
        "pybatch.job.execution_id": run.execution.id,
        "pybatch.job.status": "COMPLETED",
    }
    step_attributes = step.attributes or {}
    assert step_attributes["pybatch.step.name"] == "load"
    assert step_attributes["pybatch.step.status"] == "COMPLETED"
    assert step_attributes["pybatch.job.execution_id"] == run.execution.id
    step_id = step_attributes["pybatch.step.execution_id"]
    assert [
        (
            (chunk.attributes or {})["pybatch.step.execution_id"],
            (chunk.attributes or {})["pybatch.chunk.items_read"],
            (chunk.attributes or {})["pybatch.chunk.items_written"],
        )
        for chunk in sorted(chunks, key=lambda span: span.start_time or 0)
    ] == [(step_id, 2, 2), (step_id, 2, 2), (step_id, 1, 1)]
    assert {span.status.status_code for span in [job, step, *chunks]} == {StatusCode.UNSET}

    assert telemetry.total("pybatch.items.written", "traced_load") == rows(admin)
    assert telemetry.total("pybatch.items.read", "traced_load") == 5
    assert telemetry.total("pybatch.chunks.committed", "traced_load") == 3
    assert telemetry.total("pybatch.chunks.rolled_back", "traced_load") == 0
    [duration] = telemetry.points("pybatch.chunk.commit.duration", "traced_load")
    assert duration.count == 3 and duration.sum > 0
    assert duration.attributes["pybatch.step.name"] == "load"


def test_a_failed_chunk_is_an_error_span_named_by_type_and_sqlstate_and_counts_a_rollback(
    telemetry: Telemetry, repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    admin.execute("INSERT INTO public.orders VALUES (3, 'already there')")

    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'one')")
            chunk.commit(read=1, written=1, checkpoint={"offset": 1})
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (2, 'two'), (3, 'secret row value')")
            chunk.commit(read=2, written=2, checkpoint={"offset": 3})

    with pytest.raises(Rejected), Job(repository, "failing_load", DAY).launch() as run:
        run.step("load", work)

    [job] = telemetry.named("pybatch job failing_load")
    [step] = telemetry.named("pybatch step load")
    committed, failed = sorted(telemetry.named("pybatch chunk"), key=lambda s: s.start_time or 0)
    assert committed.status.status_code is StatusCode.UNSET
    for span in (failed, step, job):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "Rejected"
        assert (span.attributes or {})["error.type"] == "Rejected"
        assert (span.attributes or {})["pybatch.sqlstate"] == "23505"
        assert "secret" not in repr(dict(span.attributes or {}))
        assert not span.events  # no exception event: its message may quote rows
    assert (failed.attributes or {})["pybatch.chunk.outcome"] == "rolled_back"
    assert "pybatch.chunk.items_written" not in (failed.attributes or {})
    assert (job.attributes or {})["pybatch.job.status"] == "FAILED"
    assert (step.attributes or {})["pybatch.step.status"] == "FAILED"

    assert rows(admin) == 2  # the row arranged, and the first chunk's
    assert telemetry.total("pybatch.chunks.committed", "failing_load") == 1
    assert telemetry.total("pybatch.chunks.rolled_back", "failing_load") == 1
    assert telemetry.total("pybatch.items.written", "failing_load") == 1
    assert run.execution.status.value == "FAILED"


def test_a_chunk_rolled_back_on_purpose_counts_a_rollback_without_an_error(
    telemetry: Telemetry, repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'discarded')")
            chunk.rollback()

    with Job(repository, "discarding_load", DAY).launch() as run:
        run.step("load", work)

    [chunk] = telemetry.named("pybatch chunk")
    assert chunk.status.status_code is StatusCode.UNSET
    assert (chunk.attributes or {})["pybatch.chunk.outcome"] == "rolled_back"
    assert rows(admin) == 0
    assert telemetry.total("pybatch.chunks.rolled_back", "discarding_load") == 1
    assert telemetry.total("pybatch.chunks.committed", "discarding_load") == 0


def test_a_chunk_left_without_commit_or_rollback_is_an_error_span_and_a_rollback(
    telemetry: Telemetry, repository: JobRepository, admin: psycopg.Connection[Any], orders: None
) -> None:
    def work(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.execute("INSERT INTO public.orders VALUES (1, 'never committed')")

    with pytest.raises(ChunkNotEnded), Job(repository, "unended_load", DAY).launch() as run:
        run.step("load", work)

    [chunk] = telemetry.named("pybatch chunk")
    assert chunk.status.status_code is StatusCode.ERROR
    assert chunk.status.description == "ChunkNotEnded"
    assert rows(admin) == 0
    assert telemetry.total("pybatch.chunks.rolled_back", "unended_load") == 1
    assert run.execution.status.value == "FAILED"


def test_a_dead_run_recovered_and_resumed_counts_the_recovery_renewals_and_every_row_once(
    telemetry: Telemetry,
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    orders: None,
) -> None:
    job = Job(repository, "recovered_load", DAY, lease=SHORT_LEASE)
    dead = job.launch()
    open_step = start_open_step(repository, dead, "load")
    with open_step.chunk() as chunk:
        chunk.execute("INSERT INTO public.orders VALUES (1, 'before the crash')")
        chunk.commit(read=1, written=1, checkpoint={"offset": 1})
    time.sleep(0.8)  # the keeper renews a 1 s lease every third of a second
    dead._stop_renewing()  # as a killed process would
    wait_for_lease_expiry(admin, dead.execution.id)
    renewals = telemetry.total("pybatch.lease.renewals", "recovered_load")
    assert renewals >= 1

    clock.advance()
    with job.launch() as run:
        run.step("load", loader(4, 2))
    assert rows(admin) == 4
    assert telemetry.total("pybatch.recoveries", "recovered_load") == 1
    [recovery] = telemetry.points("pybatch.recoveries", "recovered_load")
    assert recovery.attributes["pybatch.recovery.reason"] == "OWNER_LOST"
    assert telemetry.total("pybatch.lease.losses", "recovered_load") == 0
    # The dead run's committed chunk and the resumed run's two: every row once.
    assert telemetry.total("pybatch.items.written", "recovered_load") == rows(admin)
    assert telemetry.total("pybatch.chunks.committed", "recovered_load") == 3
    [span] = telemetry.named("pybatch job recovered_load")  # the dead run's never ended
    assert (span.attributes or {})["pybatch.job.execution_id"] == run.execution.id


def test_without_opentelemetry_a_job_runs_with_the_plain_chunk_and_no_hooks(
    db_dsn: str, orders: None, admin: psycopg.Connection[Any]
) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # not importable, as without the extra
        from pybatch import _telemetry
        from pybatch.etl import Chunk, Job
        from pybatch import JobRepository
        from tests.conftest import plaintext_config

        assert _telemetry.TRACER is None and _telemetry.INSTRUMENTS is None
        chunk_types = []

        def work(step):
            with step.chunk() as chunk:
                chunk_types.append(type(chunk))
                chunk.execute("INSERT INTO public.orders VALUES (1, 'one')")
                chunk.commit(read=1, written=1, checkpoint={"offset": 1})

        with JobRepository.connect(plaintext_config(sys.argv[1])) as repository:
            with Job(repository, "untraced_load", {}).launch() as run:
                assert run._probe is None
                run.step("load", work)
        assert chunk_types == [Chunk], chunk_types
        loaded = [name for name, module in sys.modules.items() if module is not None]
        assert not [name for name in loaded if name.startswith("opentelemetry")], loaded
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", script, db_dsn],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert rows(admin) == 1


#: A job script with the SDK configured: finished spans go to a JSON-lines file as they end
#: (so a SIGKILLed run leaves those it finished), its metrics at the end of a run.
TRACED_SCRIPT = """
import json
import sys

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from pybatch import ConnectionConfig, Job, JobRepository

SPANS, METRICS = sys.argv[1], sys.argv[2]


class ToFile(SpanExporter):
    def export(self, spans):
        with open(SPANS, "a") as out:
            for span in spans:
                record = {"name": span.name, "attributes": dict(span.attributes)}
                out.write(json.dumps(record) + "\\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ToFile()))
trace.set_tracer_provider(provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


def load(step):
    offset = step.checkpoint.get("offset", 0)
    while offset < 10:
        with step.chunk() as chunk:
            chunk.executemany(
                "INSERT INTO public.orders (id, note) VALUES (%s, 'x')",
                [(offset + 1,), (offset + 2,)],
            )
            offset += 2
            chunk.commit(read=2, written=2, checkpoint={"offset": offset})


with JobRepository.connect(ConnectionConfig.from_env()) as repository:
    with Job(repository, "killed_load", {}).launch() as run:
        run.step("load", load)
totals = {}
for resource in reader.get_metrics_data().resource_metrics:
    for scope in resource.scope_metrics:
        for metric in scope.metrics:
            for point in metric.data.data_points:
                if hasattr(point, "value"):
                    key = metric.name + json.dumps(dict(point.attributes), sort_keys=True)
                    totals[key] = point.value
with open(METRICS, "w") as out:
    json.dump(totals, out)
"""


def test_a_killed_run_leaves_the_spans_it_finished_and_its_resume_counts_the_recovery(
    db_dsn: str, orders: None, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    script = tmp_path / "traced_load.py"
    script.write_text(TRACED_SCRIPT)
    spans, totals = tmp_path / "spans.jsonl", tmp_path / "metrics.json"
    runner = JobRunner(db_dsn, python=sys.executable, lease=1)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    killed = runner.run(script, str(spans), str(totals), kill_at_chunk=3, env=env)
    assert killed.killed, killed.stderr
    assert rows(admin) == 6  # the third chunk committed, then the process died
    finished = [json.loads(line) for line in spans.read_text().splitlines()]
    # The dead run's job and step never ended; its third chunk died inside its commit.
    assert [span["name"] for span in finished] == ["pybatch chunk", "pybatch chunk"]
    assert not totals.exists()

    spans.unlink()
    resumed = runner.run(script, str(spans), str(totals), env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert rows(admin) == 10
    finished = [json.loads(line) for line in spans.read_text().splitlines()]
    assert [span["name"] for span in finished] == [
        "pybatch chunk",
        "pybatch chunk",
        "pybatch step load",
        "pybatch job killed_load",
    ]
    assert finished[-1]["attributes"]["pybatch.job.status"] == "COMPLETED"
    counted = json.loads(totals.read_text())
    job, step = '"pybatch.job.name": "killed_load"', '"pybatch.step.name": "load"'
    assert counted[f"pybatch.items.written{{{job}, {step}}}"] == 4
    assert counted[f"pybatch.chunks.committed{{{job}, {step}}}"] == 2
    assert counted[f'pybatch.recoveries{{{job}, "pybatch.recovery.reason": "OWNER_LOST"}}'] == 1
