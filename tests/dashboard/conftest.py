"""A repository filled by real job runs (the ETL API) for the dashboard's tests.

Three runs of a nightly job (completed, failed in its second step, completed), a partitioned step
with one failing partition, an orphaned execution recovered by the next launch (a recovery
decision), a run left STARTED two hours ago (unresolved), and a job whose name, parameter name
and value and failure message are HTML that must come out escaped. The nightly job also takes a
non-identifying secret, which is never stored, so never shown.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import attrs
import pytest
from werkzeug.serving import BaseWSGIServer, make_server

from pybatch import ConnectionConfig, JobRepository
from pybatch._dashboard import create_app
from pybatch._explorer import JobExplorer
from pybatch.errors import PartitionsFailed
from pybatch.etl import Job, PartitionRun, StepRun
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameter, JobParameters, ParameterValue
from pybatch.values.status import BatchStatus
from tests.support.clock import ManualClock
from tests.support.statements import create_step

SECRET = "hunter2-Zq9"
#: Planted where an operator's browser would render it: a job name, a parameter name and value,
#: and a failure message.
HOSTILE_NAME = "<script>document.title='pwned-name'</script>"
HOSTILE_PARAMETER = "<script>document.title='pwned-parameter'</script>"
HOSTILE_VALUE = "<script>document.title='pwned-value'</script><img src=x onerror=alert(1)>"
HOSTILE_MESSAGE = "<script>document.title='pwned-message'</script> bad row"
#: Rows each step of the nightly job reads and writes, per chunk and in all.
CHUNK = 25
EXTRACT_ROWS = 100
TRANSFORM_ROWS = 60
PARTITIONS = 6
FAILING_PARTITION = "part-03"


@attrs.frozen
class Seeded:
    """What the runs left behind, by execution id."""

    nightly: tuple[int, ...]  # the three attempts of `nightly_orders`, oldest first
    partitioned: int
    orphan: int
    recovered_by: int
    stuck: int
    hostile: int


def _extract(step: StepRun) -> None:
    for offset in range(0, EXTRACT_ROWS, CHUNK):
        with step.chunk() as chunk:
            chunk.commit(read=CHUNK, written=CHUNK, checkpoint={"offset": offset + CHUNK})


def _transform(step: StepRun) -> None:
    for offset in range(0, TRANSFORM_ROWS, 20):
        with step.chunk() as chunk:
            chunk.commit(read=20, written=15, checkpoint={"offset": offset + 20})


def _failing(step: StepRun) -> None:
    with step.chunk() as chunk:
        chunk.commit(read=10, written=10, checkpoint={"offset": 10})
    raise RuntimeError("disk full while loading")


def _hostile(step: StepRun) -> None:
    raise ValueError(HOSTILE_MESSAGE)


def _partition(part: PartitionRun) -> None:
    with part.chunk() as chunk:
        chunk.commit(read=5, written=5, checkpoint={"done": True})
    if part.key == FAILING_PARTITION:
        raise RuntimeError("partition source missing")


def _started_without_owner(
    repository: JobRepository, clock: ManualClock, name: str, parameters: JobParameters
) -> int:
    """An execution STARTED at the manual clock's time by a process that never leased it."""
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(
            JobInstanceKey(JobName(name), parameters)
        ).instance
        execution = uow.executions.create(instance.id)
        execution = uow.executions.transition(
            execution.id,
            execution.version,
            LifecycleTransition.new(BatchStatus.STARTED, clock.advance()),
        )
        create_step(uow, execution.id, StepName("export"))
        uow.commit()
    return execution.id


def fill(config: ConnectionConfig) -> Seeded:
    """Run the jobs; the manual-clock repository stamps the two runs left behind two hours ago."""
    clock = ManualClock(datetime.now(UTC) - timedelta(hours=2))
    nightly = []
    with JobRepository.connect(config) as repository:
        for run_id, second in ((1, _transform), (2, _failing), (3, _transform)):
            job = Job(
                repository,
                "nightly_orders",
                JobParameters.of(
                    {
                        "business_date": "2026-12-01",
                        "token": JobParameter(ParameterValue.string(SECRET), identifying=False),
                    }
                ),
                run_id=run_id,
            )
            try:
                with job.launch() as run:
                    nightly.append(run.execution.id)
                    run.step("extract", _extract)
                    run.step("transform", second)
            except RuntimeError:
                pass
        plan = {f"part-{n:02d}": {"n": n} for n in range(PARTITIONS)}
        try:
            with Job(repository, "partitioned_load", {"region": "eu"}).launch() as run:
                partitioned = run.execution.id
                run.partitioned_step("load", plan, _partition, workers=0)
        except PartitionsFailed:
            pass
        hostile_job = Job(repository, HOSTILE_NAME, {HOSTILE_PARAMETER: HOSTILE_VALUE})
        try:
            with hostile_job.launch() as run:
                hostile = run.execution.id
                run.step("load", _hostile)
        except ValueError:
            pass
        with JobRepository.connect(config, clock=clock) as manual:
            orphan = _started_without_owner(
                manual, clock, "orphaned_export", JobParameters.of({"day": 1})
            )
            stuck = _started_without_owner(
                manual, clock, "stuck_export", JobParameters.of({"day": 2})
            )
        # No owner ever leased it, so the next launch records it FAILED (OWNER_LOST).
        with Job(repository, "orphaned_export", {"day": 1}).launch() as run:
            recovered_by = run.execution.id
            run.step("export", _extract)
    return Seeded(
        nightly=tuple(nightly),
        partitioned=partitioned,
        orphan=orphan,
        recovered_by=recovered_by,
        stuck=stuck,
        hostile=hostile,
    )


@pytest.fixture
def seeded(pg_config: ConnectionConfig) -> Seeded:
    return fill(pg_config)


@attrs.frozen
class Served:
    """A dashboard served on a free loopback port in a thread."""

    url: str
    server: BaseWSGIServer


@pytest.fixture
def served(pg_config: ConnectionConfig) -> Iterator[Served]:
    with JobRepository.connect(pg_config) as repository:
        app = create_app(JobExplorer(repository))
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield Served(url=f"http://127.0.0.1:{server.server_port}", server=server)
        finally:
            server.shutdown()
            thread.join(10)
            server.server_close()
