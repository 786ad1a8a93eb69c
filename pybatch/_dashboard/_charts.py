"""Geometry of the server-rendered SVG charts (step timeline, read/written per step).

Numbers only, computed here: a template does no arithmetic and the browser runs no script.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence

import attrs

from pybatch.values.explorer import StepExecutionProjection

#: The drawing area of both charts, in SVG user units.
WIDTH = 640
ROW_HEIGHT = 22
CHART_HEIGHT = 200
MARGIN = 40
#: Room left of the timeline's bars for the step names.
LABEL_WIDTH = 110


@attrs.frozen
class TimelineBar:
    """One step on the timeline: where its bar starts and how wide it is."""

    step: StepExecutionProjection
    x: float
    y: float
    width: float
    seconds: float


@attrs.frozen
class Timeline:
    """Bars of an execution's steps on one time axis starting at the first step's start."""

    bars: tuple[TimelineBar, ...]
    height: float
    total_seconds: float


def _end(step: StepExecutionProjection) -> _dt.datetime:
    return step.ended_at or step.updated_at


def timeline(steps: Sequence[StepExecutionProjection]) -> Timeline:
    """Place each step's [start, end] on a shared axis (a step not started yet has no width)."""
    starts = [step.started_at or step.created_at for step in steps]
    if not steps:
        return Timeline(bars=(), height=ROW_HEIGHT, total_seconds=0.0)
    origin = min(starts)
    span = max((_end(step) - origin).total_seconds() for step in steps) or 1.0
    scale = (WIDTH - LABEL_WIDTH - MARGIN) / span
    bars = []
    for row, (step, start) in enumerate(zip(steps, starts, strict=True)):
        seconds = max((_end(step) - start).total_seconds(), 0.0)
        x = round(LABEL_WIDTH + (start - origin).total_seconds() * scale, 2)
        width = round(max(seconds * scale, 2.0), 2)
        bars.append(TimelineBar(step, x, y=row * ROW_HEIGHT + 4, width=width, seconds=seconds))
    return Timeline(bars=tuple(bars), height=len(steps) * ROW_HEIGHT + 8, total_seconds=span)


@attrs.frozen
class ProgressPoint:
    """One step's committed counters and where they sit on the chart."""

    step: StepExecutionProjection
    x: float
    read_y: float
    written_y: float


@attrs.frozen
class Progress:
    """Items read and written per step, in step order, scaled to the largest count."""

    points: tuple[ProgressPoint, ...]
    maximum: int

    @property
    def read_line(self) -> str:
        """The `points` attribute of the read polyline."""
        return " ".join(f"{p.x},{p.read_y}" for p in self.points)

    @property
    def written_line(self) -> str:
        """The `points` attribute of the written polyline."""
        return " ".join(f"{p.x},{p.written_y}" for p in self.points)


def progress(steps: Sequence[StepExecutionProjection]) -> Progress:
    """Scale each step's read and written counts into the chart (0 at the bottom)."""
    maximum = max([1, *(max(s.counts.read, s.counts.written) for s in steps)])
    usable = CHART_HEIGHT - 2 * MARGIN
    step_width = (WIDTH - 2 * MARGIN) / max(len(steps) - 1, 1)

    def y(count: int) -> float:
        return round(CHART_HEIGHT - MARGIN - count * usable / maximum, 2)

    points = tuple(
        ProgressPoint(s, round(MARGIN + i * step_width, 2), y(s.counts.read), y(s.counts.written))
        for i, s in enumerate(steps)
    )
    return Progress(points=points, maximum=maximum)
