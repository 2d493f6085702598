"""Who held a lock when: audit events in, drawing geometry out.

A pure function of the events and "now" (no Flask, no database), so it is tested
on its own; ``templates/dashboard/_timeline.html`` turns the geometry into SVG.

The tenures (grants of ownership) come from ``app.audit.tenures``, the rules the
audit page uses too; this module only lays them out. Each holder (owner and
token) gets a lane (a row), so the holders of a semaphore or a shared lock are
drawn in parallel lanes, one owner's holders under two tokens too;
take-overs and operator force actions are marked where they happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lockkeeper_core.results import Event
from lockkeeper_core.state import Action

from app.audit.tenures import EXPIRED, EXPIRED_UNKNOWN, Tenure, derive

MARKED = {
    Action.TOOK_OVER,
    Action.CLAIMED,
    Action.FORCE_CLAIMED,
    Action.FORCE_RELEASED,
}

WIDTH = 960
LABEL_WIDTH = 180
RIGHT_PAD = 16
TOP = 28
LANE_HEIGHT = 28
BAR_HEIGHT = 16
AXIS_HEIGHT = 26
MAX_LANES = 12
# At most this many ticks; their step is the smallest round one that fits.
MAX_TICKS = 7
# A fresh lock still gets an axis a person can read (not a 28 ms one).
MIN_SPAN = timedelta(minutes=1)
# Zoomed to one tenure: it fills most of the plot, with this share of its
# length on each side (at least ZOOM_MIN_PAD), so where it began and ended is
# seen against what came before and after.
ZOOM_PAD_SHARE = 0.1
ZOOM_MIN_PAD = timedelta(seconds=1)
# Lane labels are cut to what fits left of the plot at 12 px (about 7 px a
# character); the full owner is in the label's <title>.
LABEL_CHARS = (LABEL_WIDTH - 16) // 7
ROUND_STEPS = (
    [timedelta(seconds=n) for n in (1, 2, 5, 10, 15, 30)]
    + [timedelta(minutes=n) for n in (1, 2, 5, 10, 15, 30)]
    + [timedelta(hours=n) for n in (1, 2, 3, 6, 12)]
    + [timedelta(days=n) for n in (1, 2, 7, 14, 30)]
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    tenure: Tenure
    css_class: str


@dataclass(frozen=True, slots=True)
class Marker:
    x: float
    y: float
    action: str
    label: str


@dataclass(frozen=True, slots=True)
class Lane:
    owner: str
    y: float
    label_y: float
    label: str = ""
    token: str | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


@dataclass(slots=True)
class Timeline:
    width: int
    height: int
    start: datetime | None
    end: datetime | None
    lanes: list[Lane] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    now_x: float | None = None
    axis_y: float = TOP
    hidden_owners: int = 0
    # The fence whose tenure the drawing is zoomed to, or None (every event).
    zoomed_to: int | None = None

    @property
    def empty(self) -> bool:
        return not self.bars


def build(
    events: Sequence[Event],
    now: datetime,
    *,
    parallel: bool | None = None,
    sessions: Mapping[str, datetime] | None = None,
    zoom: int | None = None,
) -> Timeline:
    """Lay out ``events`` between the first of them and ``now``, or around the
    tenure of fence ``zoom`` (when one has it): a 2 px sliver of a week's
    drawing becomes most of the plot, the others clipped to that range.

    Holders at once (a semaphore's holders, shared grants; ``parallel``, as
    ``derive`` takes it) get a lane each, so their bars run side by side.
    ``sessions``: the expiries of the sessions grants are bound to, as
    ``derive`` takes them."""
    spans = derive(events, now, parallel=parallel, sessions=sessions)
    if not spans:
        return Timeline(width=WIDTH, height=TOP + AXIS_HEIGHT, start=None, end=None)
    zoomed = [t for t in spans if zoom is not None and t.fence == zoom]
    if zoomed:
        first = min(t.held_from for t in zoomed)
        last = max(t.held_until for t in zoomed)
        pad = max((last - first) * ZOOM_PAD_SHARE, ZOOM_MIN_PAD)
        start, end = first - pad, last + pad
        spans = [t for t in spans if t.held_until >= start and t.held_from <= end]
        events = [e for e in events if start <= e.occurred_at <= end]
    else:
        start = min(min(t.held_from for t in spans), min(e.occurred_at for e in events))
        end = max(now, max(t.held_until for t in spans))
        if end - start < MIN_SPAN:
            start = end - MIN_SPAN
    total = (end - start).total_seconds()
    plot = WIDTH - LABEL_WIDTH - RIGHT_PAD

    def x_of(moment: datetime) -> float:
        moment = min(max(moment, start), end)  # a zoomed drawing clips the rest
        return round(LABEL_WIDTH + plot * (moment - start).total_seconds() / total, 2)

    holders: list[tuple[str, str | None]] = []
    for tenure in spans:
        if lane_of(tenure) not in holders:
            holders.append(lane_of(tenure))
    # The most recent holders matter most: keep the last MAX_LANES holders.
    recent = holders[-MAX_LANES:]
    hidden = len(holders) - len(recent)
    lane_y = {holder: TOP + index * LANE_HEIGHT for index, holder in enumerate(recent)}
    timeline = Timeline(
        width=WIDTH,
        height=TOP + len(recent) * LANE_HEIGHT + AXIS_HEIGHT,
        start=start,
        end=end,
        hidden_owners=hidden,
        now_x=x_of(now) if start <= now <= end else None,
        zoomed_to=zoom if zoomed else None,
    )
    for holder in recent:
        owner, token = holder
        y = lane_y[holder]
        timeline.lanes.append(
            Lane(
                owner=owner,
                y=y,
                label_y=y + LANE_HEIGHT / 2 + 4,
                label=truncate_label(owner),
                token=token,
            )
        )
    pad = (LANE_HEIGHT - BAR_HEIGHT) / 2
    for tenure in spans:
        if lane_of(tenure) not in lane_y:
            continue
        # A bar that starts at the very end still shows its minimum width.
        x = min(x_of(tenure.held_from), LABEL_WIDTH + plot - 2.0)
        css = "tenure"
        if tenure.forced:
            css += " tenure-forced"
        elif tenure.ended_by in (EXPIRED, EXPIRED_UNKNOWN):
            css += " tenure-expired"
        timeline.bars.append(
            Bar(
                x=x,
                y=lane_y[lane_of(tenure)] + pad,
                # At least 2 units wide so a short tenure is still visible.
                width=max(x_of(tenure.held_until) - x, 2.0),
                height=BAR_HEIGHT,
                tenure=tenure,
                css_class=css,
            )
        )
    for event in sorted(events, key=lambda e: e.id):
        if event.action not in MARKED:
            continue
        owner = (
            event.previous_owner
            if event.action is Action.FORCE_RELEASED
            else event.owner
        )
        holder = (owner or "?", event.token)
        if holder not in lane_y:
            continue
        label = f"{event.action.value} by {event.actor or 'unknown'}"
        if event.previous_owner and event.action is not Action.FORCE_RELEASED:
            label += f" (from {event.previous_owner})"
        timeline.markers.append(
            Marker(
                x=x_of(event.occurred_at),
                y=lane_y[holder] + LANE_HEIGHT / 2,
                action=event.action.value,
                label=label,
            )
        )
    timeline.axis_y = TOP + len(recent) * LANE_HEIGHT
    for moment, label in ticks(start, end):
        timeline.ticks.append(Tick(x=x_of(moment), label=label))
    return timeline


def lane_of(tenure: Tenure) -> tuple[str, str | None]:
    """The lane of ``tenure``'s holder: its owner and token."""
    return tenure.owner or "?", tenure.token


def tick_step(span: timedelta) -> timedelta:
    """The smallest round step that puts at most ``MAX_TICKS`` ticks on ``span``."""
    for step in ROUND_STEPS:
        if span / step <= MAX_TICKS - 1:
            return step
    return ROUND_STEPS[-1] * (span // (ROUND_STEPS[-1] * (MAX_TICKS - 1)) + 1)


def ticks(start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Ticks on round instants (whole multiples of the step, in UTC) between
    ``start`` and ``end``, labelled as precisely as the step needs."""
    step = tick_step(end - start)
    first = EPOCH + -((EPOCH - start) // step) * step
    if first < start:
        first += step
    if step < timedelta(minutes=1):
        fmt = "%H:%M:%SZ"
    elif step < timedelta(days=1):
        fmt = "%H:%MZ" if end - start < timedelta(days=1) else "%m-%d %H:%MZ"
    else:
        fmt = "%Y-%m-%d"
    result = []
    moment = first
    while moment <= end:
        result.append((moment, moment.astimezone(UTC).strftime(fmt)))
        moment += step
    return result


def truncate_label(owner: str, limit: int = LABEL_CHARS) -> str:
    return owner if len(owner) <= limit else owner[: limit - 1] + "…"
