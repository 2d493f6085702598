"""The last hour in two small charts: locks held / expiring / stale, minute by
minute, and audit events per minute. The database counts (``app.audit.activity``,
bucketed ``GROUP BY`` queries); this module only turns the counts into SVG
geometry, a pure function like ``timeline.py``, drawn by
``templates/dashboard/_activity.html``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flask import current_app

from app.audit import activity as counts_of
from app.dashboard.timeline import ticks

WINDOW = timedelta(hours=1)
STEP = timedelta(minutes=1)
WIDTH = 480
HEIGHT = 140
LEFT = 36
RIGHT = 12
TOP = 12
BOTTOM = 24
STATES = counts_of.STATES


@dataclass(frozen=True, slots=True)
class Sample:
    at: datetime
    held: int = 0
    expiring: int = 0
    stale: int = 0


@dataclass(slots=True)
class Chart:
    """Axes and shapes of one chart, in SVG user units."""

    width: int = WIDTH
    height: int = HEIGHT
    plot_left: int = LEFT
    plot_right: int = WIDTH - RIGHT
    plot_top: int = TOP
    plot_bottom: int = HEIGHT - BOTTOM
    y_max: int = 1
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    lines: dict[str, str] = field(default_factory=dict)  # state -> polyline points
    bars: list[tuple[float, float, float, float, str]] = field(default_factory=list)


@dataclass(slots=True)
class Activity:
    start: datetime
    end: datetime
    samples: list[Sample]
    per_minute: list[tuple[datetime, int]]
    states: Chart
    events: Chart

    @property
    def now(self) -> Sample:
        return self.samples[-1]

    @property
    def total_events(self) -> int:
        return sum(count for _, count in self.per_minute)


def window(now: datetime) -> counts_of.Window:
    return counts_of.Window(end=now, step=STEP, slots=int(WINDOW / STEP))


def samples(now: datetime, expiring_within: float) -> list[Sample]:
    """How many locks were held / expiring / stale at each minute of the last
    hour up to ``now``, as the database counts them."""
    span = window(now)
    counted = counts_of.states(span, expiring_within)
    return [Sample(at, **c) for at, c in zip(span.moments, counted, strict=True)]


def per_minute(now: datetime) -> list[tuple[datetime, int]]:
    """Events in each minute of the last hour ending at ``now``, oldest first."""
    span = window(now)
    return list(zip(span.moments, counts_of.per_bucket(span), strict=False))


def _nice_max(value: int) -> int:
    for nice in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if value <= nice:
            return nice
    magnitude = 10 ** (len(str(value)) - 1)
    return (value // magnitude + 1) * magnitude


def _frame(start: datetime, end: datetime, y_max: int) -> Chart:
    chart = Chart(y_max=_nice_max(y_max))
    span = (end - start).total_seconds()
    for moment, label in ticks(start, end):
        x = chart.plot_left + (chart.plot_right - chart.plot_left) * (
            (moment - start).total_seconds() / span
        )
        chart.x_ticks.append((round(x, 1), label))
    return chart


def build(now: datetime, expiring_within: float) -> Activity:
    start = now - WINDOW
    sampled = samples(now, expiring_within)
    minutes = per_minute(now)
    span = WINDOW.total_seconds()

    states = _frame(
        start, now, max(max(getattr(s, k) for k in STATES) for s in sampled)
    )
    width = states.plot_right - states.plot_left
    height = states.plot_bottom - states.plot_top

    def y_of(chart: Chart, value: int) -> float:
        return round(chart.plot_bottom - height * value / chart.y_max, 1)

    for state in STATES:
        points = []
        for sample in sampled:
            x = states.plot_left + width * (sample.at - start).total_seconds() / span
            points.append(f"{x:.1f},{y_of(states, getattr(sample, state))}")
        states.lines[state] = " ".join(points)

    counts = _frame(start, now, max((count for _, count in minutes), default=0))
    slot_width = width / len(minutes)
    for moment, count in minutes:
        if not count:
            continue
        x = counts.plot_left + width * (moment - start).total_seconds() / span
        top = y_of(counts, count)
        counts.bars.append(
            (
                round(x + 0.5, 1),
                top,
                round(max(slot_width - 1, 1), 1),
                round(counts.plot_bottom - top, 1),
                f"{count} event{'s' if count != 1 else ''} at {moment:%H:%MZ}",
            )
        )
    return Activity(
        start=start,
        end=now,
        samples=sampled,
        per_minute=minutes,
        states=states,
        events=counts,
    )


_cache_lock = threading.Lock()


class _Flight:
    """One drawing of one minute: the request that starts it holds ``drawing``
    until it is done; the others wait on it instead of drawing again."""

    __slots__ = ("drawing", "result")

    def __init__(self) -> None:
        self.drawing = threading.Lock()
        self.result: Activity | None = None


def cached(now: datetime, expiring_within: float) -> Activity:
    """The charts, drawn at most once a minute per process and app.

    The charts are per minute: a minute's samples are history once the minute
    is over, and counting the hour's events takes the database about a second
    at 100,000 locks and 72,000 events an hour. Every open overview polls them
    once a minute; the first poll of a minute draws them (ending at its
    ``now``), and the polls that arrive while it draws wait for that drawing
    (a single flight: at a new minute, N open overviews cost one count, not N
    concurrent ones). A drawing that fails is not kept; the next request draws.
    """
    minute = now.replace(second=0, microsecond=0)
    key = (minute, expiring_within)
    store = current_app.extensions.setdefault("lockkeeper.activity", {})
    with _cache_lock:
        flight = store.get(key)
        mine = flight is None
        if mine:
            flight = _Flight()
            flight.drawing.acquire()
            store.clear()
            store[key] = flight
    if not mine:
        with flight.drawing:  # wait for the drawing in flight
            pass
        if flight.result is not None:
            return flight.result
        return build(now, expiring_within)  # it failed: draw for this request
    try:
        flight.result = build(now, expiring_within)
        return flight.result
    finally:
        if flight.result is None:
            with _cache_lock:
                if store.get(key) is flight:
                    del store[key]
        flight.drawing.release()
