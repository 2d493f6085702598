"""The last hour, day or week in two small charts: locks held / expiring / stale
per bucket, and audit events per bucket (a minute for the hour, wider for longer
ranges). The database counts (``app.audit.activity``, bucketed ``GROUP BY``
queries), and keeps the counts of closed buckets (``app.audit.rollup``); this
module only turns the counts into SVG geometry, a pure function like
``timeline.py``, drawn by ``templates/dashboard/_activity.html``.

The moments are whole steps from the epoch (so a past bucket is the same bucket
in every drawing), the last one ``now``: the open bucket, drawn narrower.

A request counts at most ``rollup.EVENTS_PER_DRAWING`` events: with nothing
stored (a fresh deploy, a new ``expiring_within``) the older part of a range
is drawn as not counted yet, and counted in a background thread of the process
(one per range and ``expiring_within``), stored for the next drawing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flask import current_app

from app.audit import activity as counts_of
from app.audit import refusals, rollup
from app.dashboard.timeline import tick_step

log = logging.getLogger(__name__)

WINDOW = timedelta(hours=1)
STEP = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Span:
    """A range the charts can show: its window, cut into buckets of ``step``
    (wider for longer ranges, so every range is 60-84 buckets)."""

    name: str
    title: str
    window: timedelta
    step: timedelta
    per: str  # the bucket, in words: "minute", "20 min", "2 h"


SPANS = {
    span.name: span
    for span in (
        Span("1h", "The last hour", WINDOW, STEP, "minute"),
        Span(
            "24h",
            "The last 24 hours",
            timedelta(hours=24),
            timedelta(minutes=20),
            "20 min",
        ),
        Span("7d", "The last 7 days", timedelta(days=7), timedelta(hours=2), "2 h"),
    )
}
DEFAULT_SPAN = SPANS["1h"]
# A value above this many times the 90th percentile is drawn at the top of the
# plot and marked, so one spike does not flatten the rest.
CLIP_FACTOR = 3
CLIP_AFTER = 5
WIDTH = 480
HEIGHT = 140
LEFT = 36
RIGHT = 12
TOP = 12
BOTTOM = 24
STATES = counts_of.STATES
REFUSALS = refusals.OUTCOMES
EPOCH = counts_of.EPOCH


@dataclass(frozen=True, slots=True)
class Sample:
    at: datetime
    held: int = 0
    expiring: int = 0
    stale: int = 0
    counted: bool = True  # False: not counted yet (drawn as a gap, zeros here)


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
    peak: int = 0  # the largest value, shown in words
    peak_at: datetime | None = None
    clipped: bool = False  # the peak is above y_max, drawn at the top
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    # series -> the points of its polylines (one per run of counted samples)
    lines: dict[str, list[str]] = field(default_factory=dict)
    bars: list[tuple[float, float, float, float, str]] = field(default_factory=list)
    # The plot's parts not counted yet, as (left, width), drawn hatched.
    uncounted: list[tuple[float, float]] = field(default_factory=list)


@dataclass(slots=True)
class Activity:
    start: datetime
    end: datetime
    samples: list[Sample]
    per_minute: list[tuple[datetime, int]]  # events per bucket (0: not counted)
    states: Chart
    events: Chart
    refused: list[tuple[datetime, dict[str, int]]]  # refusals per outcome, bucket
    refusals: Chart
    span: Span = DEFAULT_SPAN
    # The spans of the range (from, to) whose states or events are not counted
    # yet (a drawing in a request reads a bounded number of events; the rest
    # is being counted). Nothing else is left out: a stored bucket is drawn
    # whatever is missing before or after it.
    uncounted: list[tuple[datetime, datetime]] = field(default_factory=list)
    bucket_counted: list[bool] = field(default_factory=list)  # per bucket

    @property
    def now(self) -> Sample:
        return self.samples[-1]

    @property
    def uncounted_events(self) -> bool:
        """Some bucket's events are not counted yet: the range's total is only
        that of the counted buckets."""
        return not all(self.bucket_counted)

    @property
    def total_events(self) -> int:
        return sum(count for _, count in self.per_minute)

    @property
    def total_refused(self) -> dict[str, int]:
        return {o: sum(c[o] for _, c in self.refused) for o in REFUSALS}


def window(now: datetime, span: Span = DEFAULT_SPAN) -> counts_of.Window:
    return counts_of.Window.ending(now, span.step, int(span.window / span.step))


def samples(
    now: datetime,
    expiring_within: float,
    span: Span = DEFAULT_SPAN,
    budget: int | None = None,
) -> list[Sample]:
    """How many locks were held / expiring / stale at each bucket boundary of
    the span up to ``now``, as the database counts them (``counted`` False
    where counting would read more than ``budget`` events)."""
    moments = window(now, span)
    counted = rollup.states(moments, expiring_within, budget)
    return [
        Sample(at, **c) if c is not None else Sample(at, counted=False)
        for at, c in zip(moments.moments, counted, strict=True)
    ]


def per_minute(
    now: datetime,
    span: Span = DEFAULT_SPAN,
    budget: int | None = None,
) -> list[tuple[datetime, int | None]]:
    """Events in each bucket of the span ending at ``now``, oldest first (None
    where counting would read more than ``budget`` events)."""
    moments = window(now, span)
    per_action = rollup.events(moments, budget)
    return [
        (at, None if counts is None else counts[rollup.EVERY_ACTION])
        for at, counts in zip(moments.moments, per_action, strict=False)
    ]


def refused(now: datetime, span: Span = DEFAULT_SPAN) -> list[tuple[datetime, dict]]:
    """Refused acquires per outcome in each bucket of the span, oldest first."""
    moments = window(now, span)
    return list(zip(moments.moments, refusals.per_bucket(moments), strict=False))


def _scale(values: list[int]) -> int:
    """The top of the y axis: the largest value, unless it is a spike (above
    ``CLIP_FACTOR`` times the 90th percentile of the non-zero values, with at
    least ``CLIP_AFTER`` of them to keep readable), then that bound."""
    peak = max(values, default=0)
    ordered = sorted(v for v in values if v > 0)
    if len(ordered) < CLIP_AFTER:
        return peak
    bound = CLIP_FACTOR * ordered[int(0.9 * (len(ordered) - 1))]
    return peak if peak <= bound else bound


def _nice_max(value: int) -> int:
    for nice in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if value <= nice:
            return nice
    magnitude = 10 ** (len(str(value)) - 1)
    return (value // magnitude + 1) * magnitude


def _relative(offset: timedelta) -> str:
    if not offset:
        return "now"
    minutes = int(offset.total_seconds() // 60)
    if minutes < 60:
        return f"{minutes} min ago"
    if minutes < 48 * 60 or minutes % (24 * 60):
        return f"{minutes // 60} h ago"
    return f"{minutes // (24 * 60)} d ago"


def _frame(start: datetime, end: datetime, y_max: int, window: timedelta) -> Chart:
    """Axes whose ticks say how long ago ("45 min ago" … "now"), at round
    offsets back from ``end``: a quiet range draws the same a minute later, so
    its poll is answered 204 (``views.activity``) and its labels stay true.
    The instants are on the bars' and the peak's hover."""
    chart = Chart(y_max=_nice_max(y_max))
    span = (end - start).total_seconds()
    step = tick_step(window)  # of the range, not of this drawing's few seconds more
    offset = timedelta(0)
    while offset <= end - start:
        x = chart.plot_left + (chart.plot_right - chart.plot_left) * (
            (span - offset.total_seconds()) / span
        )
        chart.x_ticks.append((round(x, 1), _relative(offset)))
        offset += step
    chart.x_ticks.reverse()
    return chart


def _polyline(points: list[tuple[float, float]]) -> str:
    """SVG points, leaving out a point level with both its neighbours: a quiet
    series is two points, not one per bucket (the fragment is polled every
    minute; a quiet hour was 4.7 KB of flat lines)."""
    kept = [
        (x, y)
        for i, (x, y) in enumerate(points)
        if i in (0, len(points) - 1) or not (points[i - 1][1] == y == points[i + 1][1])
    ]
    return " ".join(f"{x:.1f},{y}" for x, y in kept)


def _peak(chart: Chart, series: list[tuple[datetime, int]]) -> None:
    for at, value in series:
        if value > chart.peak:
            chart.peak, chart.peak_at = value, at
    # A peak that lasts until now has no moment of its own (a flat series would
    # otherwise name the window's first bucket, a new one every minute).
    last = max((at for at, _ in series), default=None)
    if any(at == last and value == chart.peak for at, value in series):
        chart.peak_at = None
    chart.clipped = chart.peak > chart.y_max


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """The runs ``[first, last]`` of consecutive true flags."""
    runs: list[tuple[int, int]] = []
    for i, flag in enumerate(flags):
        if not flag:
            continue
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _merged(spans: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    merged: list[tuple[datetime, datetime]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((begin, end))
    return merged


def build(
    now: datetime,
    expiring_within: float,
    shown: Span = DEFAULT_SPAN,
    budget: int | None = None,
) -> Activity:
    sampled = samples(now, expiring_within, shown, budget)
    counted_minutes = per_minute(now, shown, budget)
    moments = [s.at for s in sampled]
    # What is not counted is drawn as a gap, hatched: a sample's line stops at
    # the counted samples either side of it, a bucket has no bar. Everything
    # counted or stored is drawn, on either side of a gap.
    bucket_counted = [n is not None for _, n in counted_minutes]
    state_gaps = [
        (moments[max(lo - 1, 0)], moments[min(hi + 1, len(moments) - 1)])
        for lo, hi in _runs([not s.counted for s in sampled])
    ]
    event_gaps = [
        (moments[lo], moments[hi + 1])
        for lo, hi in _runs([not counted for counted in bucket_counted])
    ]
    minutes = [(at, n or 0) for at, n in counted_minutes]
    start = sampled[0].at  # on the grid: up to a step before now - window
    span = (now - start).total_seconds()

    states = _frame(
        start,
        now,
        _scale([getattr(s, k) for s in sampled if s.counted for k in STATES]),
        shown.window,
    )
    _peak(states, [(s.at, getattr(s, k)) for s in sampled if s.counted for k in STATES])
    width = states.plot_right - states.plot_left
    height = states.plot_bottom - states.plot_top

    def x_of(chart: Chart, at: datetime) -> float:
        return chart.plot_left + width * (at - start).total_seconds() / span

    def y_of(chart: Chart, value: int) -> float:
        # Off the scale: at the top (the chart says so in words).
        return round(
            chart.plot_bottom - height * min(value, chart.y_max) / chart.y_max, 1
        )

    def hatched(chart: Chart, gaps: list[tuple[datetime, datetime]]) -> None:
        chart.uncounted = [
            (round(x_of(chart, a), 1), round(x_of(chart, b) - x_of(chart, a), 1))
            for a, b in gaps
        ]

    segments = _runs([s.counted for s in sampled])
    for state in STATES:
        # A polyline per run of counted samples: none crosses a gap.
        states.lines[state] = [
            _polyline(
                [
                    (x_of(states, sample.at), y_of(states, getattr(sample, state)))
                    for sample in sampled[lo : hi + 1]
                ]
            )
            for lo, hi in segments
        ]
    hatched(states, state_gaps)

    when = "%H:%MZ" if shown.window <= WINDOW else "%Y-%m-%d %H:%MZ"
    counts = _frame(start, now, _scale([count for _, count in minutes]), shown.window)
    _peak(counts, minutes)
    hatched(counts, event_gaps)
    ends = [sample.at for sample in sampled[1:]]
    for (moment, count), ends_at in zip(minutes, ends, strict=True):
        if not count:
            continue
        x = counts.plot_left + width * (moment - start).total_seconds() / span
        slot_width = width * (ends_at - moment).total_seconds() / span
        top = y_of(counts, count)
        counts.bars.append(
            (
                round(x + 0.5, 1),
                top,
                round(max(slot_width - 1, 1), 1),
                round(counts.plot_bottom - top, 1),
                f"{count} event{'s' if count != 1 else ''} at {moment.strftime(when)}",
            )
        )
    refused_per_bucket = refused(now, shown)
    refusal_counts = [(at, c[o]) for at, c in refused_per_bucket for o in REFUSALS]
    refusal_chart = _frame(
        start, now, _scale([n for _, n in refusal_counts]), shown.window
    )
    _peak(refusal_chart, refusal_counts)
    for outcome in REFUSALS:
        points = []
        for (moment, per_outcome), ends_at in zip(
            refused_per_bucket, ends, strict=True
        ):
            # Each bucket's count at its middle.
            middle = moment + (ends_at - moment) / 2
            x = (
                refusal_chart.plot_left
                + width * (middle - start).total_seconds() / span
            )
            points.append((x, y_of(refusal_chart, per_outcome[outcome])))
        refusal_chart.lines[outcome] = [_polyline(points)]
    return Activity(
        start=start,
        end=now,
        samples=sampled,
        per_minute=minutes,
        states=states,
        events=counts,
        refused=refused_per_bucket,
        refusals=refusal_chart,
        span=shown,
        uncounted=_merged(state_gaps + event_gaps),
        bucket_counted=bucket_counted,
    )


_cache_lock = threading.Lock()


class _Flight:
    """One drawing of one minute: the request that starts it holds ``drawing``
    until it is done; the others wait on it instead of drawing again."""

    __slots__ = ("drawing", "result")

    def __init__(self) -> None:
        self.drawing = threading.Lock()
        self.result: Activity | None = None


def cached(
    now: datetime, expiring_within: float, shown: Span = DEFAULT_SPAN
) -> Activity:
    """The charts, drawn at most once a minute per process and app.

    The charts are per minute: a minute's samples are history once the minute
    is over, and even counting only the open bucket reads every held lock (tens
    of milliseconds at 100,000 locks). Every open overview polls them
    once a minute; the first poll of a minute draws them (ending at its
    ``now``), and the polls that arrive while it draws wait for that drawing
    (a single flight: at a new minute, N open overviews cost one count, not N
    concurrent ones). A drawing that fails is not kept; the next request draws.
    """
    # Every range once a minute: a drawing counts only what the stored closed
    # buckets lack (``rollup``), the open bucket and the last minute.
    drawn_in = now - (now - EPOCH) % STEP
    key = (shown.name, drawn_in, expiring_within)
    store = current_app.extensions.setdefault("lockkeeper.activity", {})
    with _cache_lock:
        flight = store.get(key)
        mine = flight is None
        if mine:
            flight = _Flight()
            flight.drawing.acquire()
            for old in [k for k in store if k[0] == shown.name and k[1] != drawn_in]:
                del store[old]  # this range's drawing of a past period
            store[key] = flight
    if not mine:
        with flight.drawing:  # wait for the drawing in flight
            pass
        if flight.result is not None:
            return flight.result
        # It failed: draw for this request.
        return build(now, expiring_within, shown, rollup.EVENTS_PER_DRAWING)
    try:
        flight.result = build(now, expiring_within, shown, rollup.EVENTS_PER_DRAWING)
        if flight.result.uncounted:
            _count_the_rest(now, expiring_within, shown)
        return flight.result
    finally:
        if flight.result is None:
            with _cache_lock:
                if store.get(key) is flight:
                    del store[key]
        flight.drawing.release()


def _count_the_rest(now: datetime, expiring_within: float, shown: Span) -> None:
    """Count and store in a background thread what a drawing left uncounted
    (its budget of events spent), at most one thread per range and
    ``expiring_within`` in this process; the range is drawn afresh once it is
    done. A failure is logged: the next drawing starts another."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    fills = app.extensions.setdefault("lockkeeper.activity_fills", {})
    key = (shown.name, expiring_within)
    with _cache_lock:
        running = fills.get(key)
        if running is not None and running.is_alive():
            return
        thread = threading.Thread(
            target=_count_in_background,
            args=(app, now, expiring_within, shown),
            name=f"activity-fill-{shown.name}",
            daemon=True,
        )
        fills[key] = thread
        thread.start()


def _count_in_background(app, now: datetime, expiring_within: float, shown: Span):
    with app.app_context():
        try:
            # No budget. Twice: over a range wider than ``BY_MINUTE_UP_TO``
            # the first pass counts and stores bucket by bucket; the second
            # counts the open bucket minute by minute and stores its closed
            # minutes, so the next drawing's budget need not cover them.
            for _ in range(2):
                samples(now, expiring_within, shown)
                per_minute(now, shown)
        except Exception:
            log.exception("counting the %s charts in the background failed", shown.name)
            return
        store = app.extensions.get("lockkeeper.activity", {})
        with _cache_lock:
            for key in [k for k in store if k[0] == shown.name]:
                del store[key]  # drawn afresh from what is now stored


def counting_in_background(app) -> list[threading.Thread]:
    """The background counts still running in ``app`` (to wait for them)."""
    fills = app.extensions.get("lockkeeper.activity_fills", {})
    with _cache_lock:
        return [thread for thread in fills.values() if thread.is_alive()]
