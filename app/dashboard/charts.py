"""The last hour in two small charts: locks held / expiring / stale, minute by
minute, and audit events per minute. Both are derived from the audit events (and
the current lock rows, for locks that did not change in the hour); a pure
function of its inputs, like ``timeline.py``, drawn as SVG by
``templates/dashboard/_activity.html``.

Each event says what a resource looked like after it (owner and expiry, or
free). Before a resource's first event of the hour its state is inferred from
that event: a renewal or release means it was validly held (counted as held), a
take-over or a claim with a previous owner means it was stale, a first acquire
means it was free. A resource without events in the hour kept its current row
all hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.audit import tenures
from app.dashboard.timeline import ticks
from app.locks.results import Event, Lock
from app.locks.state import Action

WINDOW = timedelta(hours=1)
STEP = timedelta(minutes=1)
WIDTH = 480
HEIGHT = 140
LEFT = 36
RIGHT = 12
TOP = 12
BOTTOM = 24
STATES = ("held", "expiring", "stale")

# The actions as the tenure rules sort them (``app.audit.tenures``): after a
# grant or an extension the event names the holder and its expiry.
HOLDING = {*tenures.GRANTS, *tenures.EXTENSIONS}
# Before one of these, the resource was validly held (expiry unknown).
VALID_BEFORE = {*tenures.EXTENSIONS, *tenures.ENDINGS, Action.FORCE_CLAIMED}
# Holders whose expiry is unknown (before the first event of the hour).
VALID_UNKNOWN = object()
STALE_UNKNOWN = object()


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
    truncated: bool = False

    @property
    def now(self) -> Sample:
        return self.samples[-1]

    @property
    def total_events(self) -> int:
        return sum(count for _, count in self.per_minute)


def _state_before(first: Event) -> tuple[object, datetime | None]:
    if first.action in VALID_BEFORE:
        return VALID_UNKNOWN, None
    if first.previous_owner is not None:  # took_over, or claimed a stale lock
        return STALE_UNKNOWN, None
    return None, None


def _classify(
    holder: object, expires_at: datetime | None, at: datetime, within: float
) -> str | None:
    if holder is None:
        return None
    if holder is VALID_UNKNOWN:
        return "held"
    if holder is STALE_UNKNOWN or expires_at is None:
        return "stale"
    left = (expires_at - at).total_seconds()
    if left <= 0:
        return "stale"
    return "expiring" if left <= within else "held"


def samples(
    events: Sequence[Event],
    current: Sequence[Lock],
    now: datetime,
    expiring_within: float,
    window: timedelta = WINDOW,
) -> list[Sample]:
    """How many locks were held / expiring / stale at each minute of ``window``
    up to ``now`` (``events`` oldest first)."""
    start = now - window
    moments = [start + STEP * i for i in range(int(window / STEP) + 1)]
    by_resource: dict[str, list[Event]] = {}
    for event in events:
        by_resource.setdefault(event.resource, []).append(event)
    counts = [dict.fromkeys(STATES, 0) for _ in moments]

    def add(changes: list[tuple[datetime, object, datetime | None]]) -> None:
        index = 0
        for slot, moment in enumerate(moments):
            while index + 1 < len(changes) and changes[index + 1][0] <= moment:
                index += 1
            _, holder, expires = changes[index]
            state = _classify(holder, expires, moment, expiring_within)
            if state:
                counts[slot][state] += 1

    for resource_events in by_resource.values():
        before = _state_before(resource_events[0])
        changes: list[tuple[datetime, object, datetime | None]] = [(start, *before)]
        for event in resource_events:
            if event.action in HOLDING:
                changes.append((event.occurred_at, event.owner, event.expires_at))
            elif event.action in tenures.ENDINGS:
                changes.append((event.occurred_at, None, None))
        add(changes)
    for lock in current:
        if lock.resource not in by_resource:
            add([(start, lock.owner, lock.expires_at)])
    return [Sample(at, **count) for at, count in zip(moments, counts, strict=True)]


def per_minute(
    events: Sequence[Event], now: datetime, window: timedelta = WINDOW
) -> list[tuple[datetime, int]]:
    """Events in each minute of ``window`` ending at ``now``, oldest first."""
    start = now - window
    slots = int(window / STEP)
    counts = [0] * slots
    for event in events:
        slot = int((event.occurred_at - start) / STEP)
        if 0 <= slot < slots:
            counts[slot] += 1
    return [(start + STEP * i, counts[i]) for i in range(slots)]


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


def build(
    events: Sequence[Event],
    current: Sequence[Lock],
    now: datetime,
    expiring_within: float,
    truncated: bool = False,
) -> Activity:
    start = now - WINDOW
    sampled = samples(events, current, now, expiring_within)
    minutes = per_minute(events, now)
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
        truncated=truncated,
    )
