"""OpenTelemetry spans and metrics, when the `otel` extra is installed (docs/operators.md).

The only module that imports opentelemetry; it uses the global providers. Without it `TRACER`
is None and the chunk path runs exactly as without this module. Errors are named by class and
SQLSTATE only, never by message, which may quote row values.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from pybatch.errors import ChunkCommitOutcomeUnknown, StopRequested

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from pybatch.values.chunks import FaultProgress

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # the `otel` extra is not installed: every hook is a no-op
    _trace = None  # type: ignore[assignment]

#: The scope name of pybatch's tracer and meter.
SCOPE = "pybatch"

#: pybatch's counters: (name, unit, description).
_COUNTERS = (
    ("pybatch.items.read", "{item}", "Items read by committed chunks"),
    ("pybatch.items.written", "{item}", "Items written by committed chunks"),
    ("pybatch.items.skipped", "{item}", "Items skipped by committed chunks"),
    ("pybatch.chunks.committed", "{chunk}", "Chunks committed"),
    ("pybatch.chunks.rolled_back", "{chunk}", "Chunks rolled back (nothing of them durable)"),
    ("pybatch.lease.renewals", "{renewal}", "Lease renewals"),
    ("pybatch.lease.losses", "{loss}", "Renewals that found the ownership gone"),
    ("pybatch.recoveries", "{recovery}", "Recovery decisions applied by this process"),
)
_COMMIT_DURATION = "pybatch.chunk.commit.duration"

#: pybatch's instruments by name, made once from the global meter provider; None without it.
INSTRUMENTS: dict[str, Any] | None = None
if _trace is None:
    TRACER: Any = None
else:
    try:
        _VERSION = metadata.version("pybatch")
    except metadata.PackageNotFoundError:  # run from a checkout
        _VERSION = ""
    # Proxies until the application sets its providers; they forward to them afterwards.
    TRACER = _trace.get_tracer(SCOPE, _VERSION)
    _meter = _metrics.get_meter(SCOPE, _VERSION)
    INSTRUMENTS = {name: _meter.create_counter(name, *spec) for name, *spec in _COUNTERS}
    INSTRUMENTS[_COMMIT_DURATION] = _meter.create_histogram(
        _COMMIT_DURATION, "s", "Time to commit one chunk (progress and COMMIT)"
    )


def _fail(span: Span, error: BaseException) -> None:
    """Mark `span` ERROR naming the error's type (and SQLSTATE), never its message."""
    name = type(error).__name__
    span.set_attribute("error.type", name)
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str):
        span.set_attribute("pybatch.sqlstate", sqlstate)
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, name))


def _is_failure(error: BaseException | None) -> bool:
    """A failure as the run records it: not a stop request, not an interrupt."""
    return isinstance(error, Exception) and not isinstance(error, StopRequested)


class JobProbe:
    """The span of one job execution, from launch to the run's end."""

    __slots__ = ("_token", "attributes", "context", "span", "span_attributes")

    def __init__(self, job_name: str, instance_id: int, execution_id: int) -> None:
        #: The metric attributes of the job's instruments.
        self.attributes = {"pybatch.job.name": job_name}
        self.span_attributes: dict[str, str | int] = {
            "pybatch.job.name": job_name,
            "pybatch.job.instance_id": instance_id,
            "pybatch.job.execution_id": execution_id,
        }
        self.span: Span = TRACER.start_span(
            f"pybatch job {job_name}", attributes=self.span_attributes
        )
        self.context: Context = _trace.set_span_in_context(self.span)
        self._token: object | None = None

    def enter(self) -> None:
        """Make the job span current for the run's `with` block (the user's spans nest in it)."""
        self._token = _context.attach(self.context)

    def ended(self, status: str, error: BaseException | None) -> None:
        """End the span with the status the run recorded."""
        span = self.span
        span.set_attribute("pybatch.job.status", status)
        if _is_failure(error):
            _fail(span, error)  # type: ignore[arg-type]
        span.end()
        token, self._token = self._token, None
        if token is not None:
            _context.detach(token)  # type: ignore[arg-type]


class StepProbe:
    """The span of one step execution (a child of its job's) and its chunks' instruments."""

    __slots__ = ("attributes", "chunk_attributes", "context", "span")

    def __init__(self, job: JobProbe, step_name: str, step_execution_id: int) -> None:
        self.attributes = {**job.attributes, "pybatch.step.name": step_name}
        self.chunk_attributes = {**self.attributes, "pybatch.step.execution_id": step_execution_id}
        self.span: Span = TRACER.start_span(
            f"pybatch step {step_name}",
            context=job.context,
            attributes={**job.span_attributes, **self.chunk_attributes},
        )
        self.context: Context = _trace.set_span_in_context(self.span)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The step span, current while the step runs, ended with the step's outcome."""
        token = _context.attach(self.context)
        span = self.span
        try:
            yield
        except BaseException as error:
            span.set_attribute("pybatch.step.status", "FAILED" if _is_failure(error) else "STOPPED")
            if _is_failure(error):
                _fail(span, error)
            raise
        else:
            span.set_attribute("pybatch.step.status", "COMPLETED")
        finally:
            span.end()
            _context.detach(token)


class ChunkProbe:
    """The span of one chunk (a child of its step's); ended once, committed or rolled back."""

    __slots__ = ("_step", "span")

    def __init__(self, step: StepProbe) -> None:
        self._step = step
        self.span: Span | None = TRACER.start_span(
            "pybatch chunk", context=step.context, attributes=step.chunk_attributes
        )

    def committed(
        self, read: int, written: int, skips: FaultProgress | None, seconds: float
    ) -> None:
        """Count a committed chunk and its items; end its span."""
        span, self.span = self.span, None
        if span is None:
            return
        attributes = self._step.attributes
        instruments: dict[str, Any] = INSTRUMENTS  # type: ignore[assignment]
        instruments["pybatch.items.read"].add(read, attributes)
        instruments["pybatch.items.written"].add(written, attributes)
        if skips is not None:
            skipped = skips.read_skips + skips.process_skips + skips.write_skips
            if skipped:
                instruments["pybatch.items.skipped"].add(skipped, attributes)
        instruments["pybatch.chunks.committed"].add(1, attributes)
        instruments[_COMMIT_DURATION].record(seconds, attributes)
        span.set_attributes(
            {"pybatch.chunk.items_read": read, "pybatch.chunk.items_written": written}
        )
        span.end()

    def ended(self, error: BaseException | None) -> None:
        """End a chunk that did not commit: rolled back, or (lost acknowledgement) unknown."""
        span, self.span = self.span, None
        if span is None:
            return
        unknown = isinstance(error, ChunkCommitOutcomeUnknown)
        span.set_attribute("pybatch.chunk.outcome", "unknown" if unknown else "rolled_back")
        if not unknown:
            _count("pybatch.chunks.rolled_back", self._step.attributes)
        if error is not None:
            _fail(span, error)
        span.end()


def job_started(job_name: str, instance_id: int, execution_id: int) -> JobProbe | None:
    """The started job's span; None without opentelemetry or a provider set (all no-ops)."""
    if TRACER is None or (
        isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)
        and type(_metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
    ):
        return None
    return JobProbe(job_name, instance_id, execution_id)


def _count(name: str, attributes: Mapping[str, str]) -> None:
    if INSTRUMENTS is not None:
        INSTRUMENTS[name].add(1, attributes)


#: One lease renewal (a background thread's, every third of the lease).
lease_renewed = functools.partial(_count, "pybatch.lease.renewals")
#: A renewal that found the ownership gone.
lease_lost = functools.partial(_count, "pybatch.lease.losses")


def recovered(reason: str, job_name: str | None = None) -> None:
    """Count one recovery decision applied (an orphaned execution, a lost partition worker)."""
    attributes = {"pybatch.recovery.reason": reason}
    if job_name is not None:
        attributes["pybatch.job.name"] = job_name
    _count("pybatch.recoveries", attributes)
