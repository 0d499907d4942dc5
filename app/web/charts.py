"""Line charts drawn on the server, as inline SVG (the pages' Content-Security-Policy allows no script library and no
`style=` attribute; the SVG's classes are styled by the page's own stylesheet).

`line_chart` computes the geometry only: where each point, tick and label goes, in the SVG's own coordinates (its
viewBox), and the chart's title and description for assistive technology. The template draws it (autoescaped, like
everything a page shows: a field's name is someone's metadata)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

# about the size a chart is drawn at (two side by side on a wide screen, one on a phone): its text stays readable
WIDTH, HEIGHT = 400, 200
# the plot area, inside the margins that hold the axes' labels
LEFT, RIGHT, TOP, BOTTOM = 48, WIDTH - 14, 12, HEIGHT - 32
Y_TICKS = 4
X_TICKS = 2  # intervals: a date label at each end and one between
DAY_MS = 86_400_000


def utc_text(millis: int) -> str:
    """A time as the pages show it: to the minute, in UTC (the server cannot know the reader's zone)."""
    return datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def utc_iso(millis: int) -> str:
    """A time for `<time datetime>`."""
    return datetime.fromtimestamp(millis / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Timed:
    """A row shown with its time, `at` (in ms): its text and its `<time datetime>`."""

    __slots__ = ()
    at: int

    @property
    def at_text(self) -> str:
        return utc_text(self.at)

    @property
    def at_iso(self) -> str:
        return utc_iso(self.at)


def compact(value: float) -> str:
    """An axis label: 950, 1.2k, 3.4M, 5B."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class Tick:
    at: float  # the coordinate on its axis
    label: str


@dataclass(frozen=True, slots=True)
class Mark:
    x: float
    y: float
    label: str  # the point's own `<title>`: its time and value


@dataclass(frozen=True, slots=True)
class LineChart:
    id: str  # unique in the page: the `<title>` and `<desc>` ids
    title: str
    description: str
    unit: str  # what the values count, for the y axis' label
    marks: list[Mark]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    width: ClassVar[int] = WIDTH
    height: ClassVar[int] = HEIGHT
    left: ClassVar[int] = LEFT
    right: ClassVar[int] = RIGHT
    top: ClassVar[int] = TOP
    bottom: ClassVar[int] = BOTTOM

    @property
    def line(self) -> str:
        """The polyline's `points`, in time order."""
        return " ".join(f"{m.x:.1f},{m.y:.1f}" for m in self.marks)


def _step(largest: float) -> float:
    """A round step (1, 2 or 5 × 10ⁿ, at least 1: the values are counts) giving about Y_TICKS ticks up to `largest`."""
    raw = largest / Y_TICKS
    if raw <= 1:
        return 1
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _time_format(span_ms: int) -> str:
    return "%Y-%m-%d" if span_ms >= 2 * DAY_MS else "%m-%d %H:%M"


def line_chart(chart_id: str, title: str, unit: str, points: Sequence[tuple[int, int]]) -> LineChart:
    """The chart of `points` ((time in ms, value), in any order): time along x, the value from 0 along y."""
    ordered = sorted(points)
    if not ordered:
        return LineChart(chart_id, title, f"No {unit} recorded.", unit, [], [], [])
    first, last = ordered[0][0], ordered[-1][0]
    span = last - first
    largest = max(value for _, value in ordered)
    step = _step(largest)
    top_value = max(step * math.ceil(largest / step), step)

    def x_of(millis: int) -> float:
        return (LEFT + RIGHT) / 2 if span == 0 else LEFT + (millis - first) / span * (RIGHT - LEFT)

    def y_of(value: float) -> float:
        return BOTTOM - value / top_value * (BOTTOM - TOP)

    marks = [Mark(x_of(t), y_of(v), f"{utc_text(t)}: {v:,} {unit}") for t, v in ordered]
    y_ticks = [Tick(y_of(i * step), compact(i * step)) for i in range(int(round(top_value / step)) + 1)]
    shown = _time_format(span)
    times = [first] if span == 0 else [first + span * i // X_TICKS for i in range(X_TICKS + 1)]
    x_ticks = [Tick(x_of(t), datetime.fromtimestamp(t / 1000, UTC).strftime(shown)) for t in times]
    values = [v for _, v in ordered]
    description = (
        f"{len(ordered)} point{'s' if len(ordered) != 1 else ''} from {utc_text(first)} to {utc_text(last)}; "
        f"{unit} from {min(values):,} to {max(values):,}, latest {values[-1]:,}."
    )
    return LineChart(chart_id, title, description, unit, marks, x_ticks, y_ticks)
