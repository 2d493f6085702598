"""The last hour's charts: states per minute and events per minute, counted by
the database from the events and lock rows (each test on every backend)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core.models import SHARED, DistributedLock, LockEvent, LockHolder
from lockkeeper_core.state import LockState, classify
from sqlalchemy import func, select

from app.audit import activity, rollup
from app.audit.models import EVERY_ACTION, ActivityEvents, ActivitySample
from app.dashboard import charts
from app.extensions import db
from tests.dashboard_helpers import poller_version, soup

NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)


def minutes_ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def event(action, minutes, resource="job:1", owner="w", ttl_minutes=10.0, prev=None):
    at = minutes_ago(minutes)
    return LockEvent(
        resource=resource,
        action=action,
        owner=owner,
        previous_owner=prev,
        fence=1,
        acquired_at=at,
        expires_at=at + timedelta(minutes=ttl_minutes) if owner else at,
        occurred_at=at,
    )


def row(resource, owner, acquired_minutes, expires_minutes):
    return DistributedLock(
        resource=resource,
        owner=owner,
        fence=1,
        acquired_at=minutes_ago(acquired_minutes),
        expires_at=minutes_ago(expires_minutes),
    )


@pytest.fixture
def stored(app, backend):
    """Stores events (in order: ids follow) and lock rows, then answers the
    samples as the overview's chart counts them."""

    def store(events=(), rows=(), within=15):
        with app.app_context():
            for item in [*events, *rows]:
                db.session.add(item)
                db.session.flush()
            db.session.commit()
            return charts.samples(NOW, within)

    return store


def at_minute(samples, minutes):
    [sample] = [s for s in samples if s.at == minutes_ago(minutes)]
    return (sample.held, sample.expiring, sample.stale)


def test_a_lock_that_runs_out_goes_held_expiring_stale(stored):
    sampled = stored(
        [event("acquired", 30, ttl_minutes=10)], [row("job:1", "w", 30, 20)], 120
    )
    assert len(sampled) == 61
    assert at_minute(sampled, 40) == (0, 0, 0)  # before the acquire: free
    assert at_minute(sampled, 30) == (1, 0, 0)
    assert at_minute(sampled, 21) == (0, 1, 0)  # 1 min left, within 2 min
    assert at_minute(sampled, 20) == (0, 0, 1)
    assert at_minute(sampled, 0) == (0, 0, 1)


def test_renewals_and_a_release_within_the_hour(stored):
    sampled = stored(
        [
            event("renewed", 50, ttl_minutes=5),  # held since before the hour
            event("renewed", 46, ttl_minutes=5),
            event("released", 44),
        ]
    )
    assert at_minute(sampled, 60) == (1, 0, 0)
    assert at_minute(sampled, 45) == (1, 0, 0)
    assert at_minute(sampled, 44) == (0, 0, 0)


def test_a_take_over_was_stale_before_it(stored):
    sampled = stored([event("took_over", 10, owner="w2", prev="w1")])
    assert at_minute(sampled, 60) == (0, 0, 1)
    assert at_minute(sampled, 10) == (1, 0, 0)


def test_the_charts_and_the_tenures_agree_on_a_stale_lock_ended_later(stored):
    """A lock that ran out and was force-released later: its tenure ended
    ("expired") at its expiry, so the chart counts it stale, not held, between."""
    sampled = stored(
        [
            event("acquired", 40, ttl_minutes=5),
            event("force_released", 20, prev="w"),
        ],
        within=0,
    )
    assert at_minute(sampled, 36) == (1, 0, 0)
    assert at_minute(sampled, 30) == (0, 0, 1)
    assert at_minute(sampled, 20) == (0, 0, 0)


def test_a_lock_untouched_all_hour_counts_from_its_row(stored):
    rows = [row("job:long", "w", 180, -120), row("job:dead", "w", 300, 200)]
    rows.append(row("job:free", None, 300, 200))  # a released row counts as nothing
    sampled = stored(rows=rows)
    assert {at_minute(sampled, m) for m in range(61)} == {(1, 0, 1)}


def test_a_row_that_changed_in_the_hour_counts_from_its_events_not_its_row(stored):
    events = [event("acquired", 30, resource="job:2", ttl_minutes=60)]
    sampled = stored(events, [row("job:2", "w", 30, -30)])
    assert at_minute(sampled, 31) == (0, 0, 0)
    assert at_minute(sampled, 0) == (1, 0, 0)


def test_expiries_on_the_minute_count_as_the_python_rule_does(stored):
    """Held while more than ``within`` is left, expiring up to the expiry
    itself, stale from the expiry on: boundaries fall on sample moments."""
    sampled = stored(rows=[row("job:3", "w", 90, 10)], within=300)
    assert at_minute(sampled, 16) == (1, 0, 0)
    assert at_minute(sampled, 15) == (0, 1, 0)  # exactly 5 min left
    assert at_minute(sampled, 11) == (0, 1, 0)
    assert at_minute(sampled, 10) == (0, 0, 1)  # expires now


# Expiries (minutes before NOW) on both sides of each edge the untouched rows'
# count splits at: the window's start, its start plus ``within`` (2 min), now,
# and now plus ``within``; a row expiring between them is placed per moment,
# one outside them is counted stale or held all along.
EDGE_EXPIRIES = (90, 61, 60, 59.5, 58, 57, 30, 0.5, 0, -1, -2, -2.5, -30)


def test_untouched_rows_on_each_side_of_the_windows_edges_count_as_classify(stored):
    rows = [
        row(f"job:edge{n}", "w", 300, minutes)
        for n, minutes in enumerate(EDGE_EXPIRIES)
    ]
    sampled = stored(rows=rows, within=120)
    for sample in sampled:
        expected = {state: 0 for state in LockState}
        for minutes in EDGE_EXPIRIES:
            left = (minutes_ago(minutes) - sample.at).total_seconds()
            # No event left: granted for its whole span (acquired to expiry).
            ttl = (300 - minutes) * 60
            expected[classify(left, 120, ttl=ttl)] += 1
        found = (sample.held, sample.expiring, sample.stale)
        assert found == tuple(expected.values()), sample.at


def test_a_short_ttl_renewed_on_time_is_held_at_every_past_moment(stored):
    """Expiring in the past as in the table: against each grant's own ttl. A
    15 s lock renewed every 5 s has 10-15 s left at every moment, within the
    15 s window but never past half its ttl: held, not expiring (the window
    alone said expiring, all hour). Renewed last 10 s after minute 10, it has
    5 s left then: expiring."""
    renewals = [
        event("renewed", 30 - k * 5 / 60, ttl_minutes=0.25) for k in range(1, 238)
    ]
    last = event("renewed", 10 + 10 / 60, ttl_minutes=0.25)
    sampled = stored(
        [event("acquired", 30, ttl_minutes=0.25), *renewals, last], within=15
    )
    assert at_minute(sampled, 31) == (0, 0, 0)
    for minute in range(30, 11, -1):
        assert at_minute(sampled, minute) == (1, 0, 0), minute
    assert at_minute(sampled, 10) == (0, 1, 0)
    assert at_minute(sampled, 9) == (0, 0, 1)


def test_an_untouched_row_near_the_windows_start_is_judged_by_its_ttl(stored):
    """A row no event of the hour touched, renewed for 15 s just before the
    hour: 12 s left at its first moment, held (more than half its ttl); a row
    on a long ttl with as little left is expiring."""
    short = event("renewed", 60 + 3 / 60, resource="job:short", ttl_minutes=0.25)
    rows = [
        row("job:short", "w", 90, 60 - 12 / 60),
        row("job:long", "w", 90, 60 - 12 / 60),  # no event: 30 min ttl
    ]
    sampled = stored([short], rows, within=15)
    assert at_minute(sampled, 60) == (1, 1, 0)
    assert at_minute(sampled, 59) == (0, 0, 2)


def test_rows_touched_in_the_hour_count_once_from_their_events_on_every_side(stored):
    """A resource with an event in the hour counts from its events, never also
    from its row, wherever its row's expiry falls: acquired 30 min ago, each is
    free before and held after (its events say so), whatever its row says."""
    events = [
        event("acquired", 30, resource=f"job:edge{n}", ttl_minutes=600)
        for n in range(len(EDGE_EXPIRIES))
    ]
    rows = [
        row(f"job:edge{n}", "w", 30, minutes) for n, minutes in enumerate(EDGE_EXPIRIES)
    ]
    sampled = stored(events, rows, within=120)
    assert at_minute(sampled, 31) == (0, 0, 0)
    assert at_minute(sampled, 30) == (len(EDGE_EXPIRIES), 0, 0)
    assert at_minute(sampled, 0) == (len(EDGE_EXPIRIES), 0, 0)


def test_events_per_minute_and_the_drawing(app, backend):
    with app.app_context():
        for n in range(3):
            db.session.add(event("acquired", 5.5, resource=f"job:{n}"))
        db.session.add(event("acquired", 0.5, resource="job:x"))
        db.session.add(event("acquired", 61, resource="job:old"))  # outside
        db.session.commit()
        minutes = charts.per_minute(NOW)
        drawn = charts.build(NOW, 15)
    assert len(minutes) == 60
    assert dict(minutes)[minutes_ago(6)] == 3
    assert dict(minutes)[minutes_ago(1)] == 1
    assert sum(count for _, count in minutes) == 4

    assert drawn.total_events == 4
    assert [bar[4] for bar in drawn.events.bars] == [
        "3 events at 09:54Z",
        "1 event at 09:59Z",
    ]
    assert drawn.events.y_max == 5
    ticks = drawn.states.x_ticks
    assert [label for _, label in ticks] == [
        "1 h ago",
        "50 min ago",
        "40 min ago",
        "30 min ago",
        "20 min ago",
        "10 min ago",
        "now",
    ]
    assert (ticks[0][0], ticks[-1][0]) == (
        drawn.states.plot_left,
        drawn.states.plot_right,
    )
    chart = drawn.states
    for runs in chart.lines.values():
        [points] = runs  # everything counted: one line
        xs = [float(point.split(",")[0]) for point in points.split()]
        assert (xs[0], xs[-1]) == (chart.plot_left, chart.plot_right)
        assert xs == sorted(xs)


def test_a_flat_stretch_of_a_series_is_drawn_by_its_ends(app, backend):
    """A quiet hour: each line is two points, not 61 (the fragment is polled
    every minute); a change keeps the points where the line bends."""
    with app.app_context():
        quiet = charts.build(NOW, 15)
        db.session.add(event("acquired", 30, ttl_minutes=60))
        db.session.add(row("job:1", "w", 30, -30))
        db.session.commit()
        app.extensions.get("lockkeeper.activity", {}).clear()
        changed = charts.build(NOW + timedelta(seconds=1), 15)
    for runs in [*quiet.states.lines.values(), *quiet.refusals.lines.values()]:
        [points] = runs  # everything counted: one line
        assert len(points.split()) == 2
    [held] = changed.states.lines["held"]
    held = held.split()
    # Flat at 0, up at the acquire (the point before it and the point at it),
    # flat after: four points.
    assert len(held) == 4
    assert held[1].split(",")[1] == held[0].split(",")[1]
    assert held[2].split(",")[1] == held[3].split(",")[1] != held[0].split(",")[1]


def test_overview_loads_the_last_hour_after_its_table_and_polls_it_once_a_minute(
    operator, fake_app, clock
):
    from app.extensions import lock_service

    with fake_app.app_context():
        lock_service().acquire("job:1", "w", ttl=600)
    page = soup(operator.get("/"))
    placeholder = page.select_one("#activity")
    assert placeholder.select_one(".poller")["hx-trigger"] == "load"
    assert placeholder.select_one("a")["href"].startswith("/activity")
    headers = {"HX-Request": "true", "HX-Target": "section#activity"}
    section = soup(
        operator.get(placeholder.select_one(".poller")["hx-get"], headers=headers)
    )
    assert section.body is None
    assert "Now 1 held, 0 expiring, 0 stale" in section.select_one("desc").get_text()
    poller = section.select_one(".poller")
    assert poller["hx-trigger"].startswith("every 60s")
    headers["Lockkeeper-Shown"] = poller_version(poller)
    assert operator.get(poller["hx-get"], headers=headers).status_code == 204
    clock.advance(60)
    again = operator.get(poller["hx-get"], headers=headers)
    assert again.status_code == 200
    assert soup(again).body is None
    assert soup(operator.get("/activity")).body is not None


def test_a_quiet_hours_chart_poll_is_a_204_and_a_new_event_redraws_it(
    operator, fake_app, clock
):
    """Nothing happened for an hour: a minute later the charts would draw the
    same (axes say how long ago), so the poll gets no body. An event in that
    minute changes them: the poll gets the new drawing."""
    from app.extensions import lock_service

    with fake_app.app_context():
        lock_service().acquire("job:1", "w", ttl=3 * 3600)
    clock.advance(61 * 60)
    headers = {"HX-Request": "true", "HX-Target": "section#activity"}
    first = operator.get("/activity?live=1", headers=headers)
    assert first.status_code == 200
    drawn = soup(first).select_one(".charts")
    headers["Lockkeeper-Shown"] = poller_version(soup(first).select_one(".poller"))

    clock.advance(60)
    quiet = operator.get("/activity?live=1", headers=headers)
    assert (quiet.status_code, quiet.data) == (204, b"")
    # No body is right: drawn afresh, the charts are the same.
    fresh = soup(
        operator.get("/activity?live=1", headers={**headers, "Lockkeeper-Shown": ""})
    )
    assert fresh.select_one(".charts") == drawn

    with fake_app.app_context():
        lock_service().acquire("job:2", "w", ttl=600)
    clock.advance(60)
    changed = operator.get("/activity?live=1", headers=headers)
    assert changed.status_code == 200
    section = soup(changed)
    assert "Now 2 held" in section.select_one("#states-desc").get_text()
    assert [bar["height"] for bar in section.select("rect.event-bar")]
    assert section.select_one(".charts") != drawn


def test_a_steady_rate_redraws_the_charts_as_their_bars_name_new_minutes(
    operator, fake_app, clock
):
    """One renewal a minute for an hour: a minute later every bucket counts the
    same, but each bar is another minute (its hover names it), so the poll
    gets the new drawing."""
    from app.extensions import lock_service

    def a_minute_and_a_renewal():
        clock.advance(60)
        with fake_app.app_context():
            lock_service().renew("job:1", "w", ttl=3 * 3600)

    with fake_app.app_context():
        lock_service().acquire("job:1", "w", ttl=3 * 3600)
    for _ in range(61):
        a_minute_and_a_renewal()
    headers = {"HX-Request": "true", "HX-Target": "section#activity"}
    first = soup(operator.get("/activity?live=1", headers=headers))
    headers["Lockkeeper-Shown"] = poller_version(first.select_one(".poller"))

    a_minute_and_a_renewal()
    again = operator.get("/activity?live=1", headers=headers)
    assert again.status_code == 200
    titles = [t.get_text() for t in soup(again).select("rect.event-bar title")]
    assert titles != [t.get_text() for t in first.select("rect.event-bar title")]


def test_the_charts_are_drawn_once_a_minute(operator, fake_app, clock):
    """Within a minute a poll reuses the minute's drawing; the next minute
    counts again."""
    from app.extensions import lock_service

    def held_now():
        page = soup(operator.get("/activity"))
        return page.select_one("#activity desc").get_text()

    clock.advance(5)
    assert "Now 0 held" in held_now()
    with fake_app.app_context():
        lock_service().acquire("job:1", "w", ttl=600)
    assert "Now 0 held" in held_now()
    clock.advance(60)
    assert "Now 1 held" in held_now()


def test_concurrent_requests_at_a_new_minute_draw_the_charts_once(
    fake_app, monkeypatch
):
    """Eight threads ask for the charts of a minute nobody drew yet: one draws,
    the others wait for its drawing and get it."""
    import threading

    drawn = []
    started = threading.Event()
    release = threading.Event()
    real_build = charts.build

    def slow_build(now, *args):
        drawn.append(now)
        started.set()
        assert release.wait(10)
        return real_build(now, *args)

    waiting = []

    class Counted:
        """The flight's lock, counting who waits on it."""

        def __init__(self):
            self.lock = threading.Lock()
            self.acquire, self.release = self.lock.acquire, self.lock.release

        def __enter__(self):
            waiting.append(threading.get_ident())
            self.lock.acquire()

        def __exit__(self, *exc):
            self.lock.release()

    class Flight(charts._Flight):
        def __init__(self):
            super().__init__()
            self.drawing = Counted()

    monkeypatch.setattr(charts, "build", slow_build)
    monkeypatch.setattr(charts, "_Flight", Flight)
    results = []

    def ask():
        with fake_app.app_context():
            results.append(charts.cached(NOW + timedelta(seconds=7), 15))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    threads[0].start()
    assert started.wait(10)
    for thread in threads[1:]:
        thread.start()
    # The others are in flight (each past its cache look-up) before the drawing ends.
    deadline = time.monotonic() + 10
    while len(waiting) < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(waiting) == 7, "the other requests never reached the flight"
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(drawn) == 1
    assert len(results) == 8
    assert all(result is results[0] for result in results)


def test_a_failed_drawing_is_not_kept(fake_app, monkeypatch):
    calls = []
    real_build = charts.build

    def flaky(now, *args):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("database went away")
        return real_build(now, *args)

    monkeypatch.setattr(charts, "build", flaky)
    with fake_app.app_context():
        with pytest.raises(RuntimeError):
            charts.cached(NOW, 15)
        assert charts.cached(NOW, 15) is charts.cached(NOW, 15)
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("name", "title", "per", "bars"),
    [
        ("1h", "The last hour", "minute", 60),
        ("24h", "The last 24 hours", "20 min", 72),
        ("7d", "The last 7 days", "2 h", 84),
    ],
)
def test_ranges_are_links_to_wider_buckets_with_a_unit_on_each_chart(
    operator, name, title, per, bars
):
    url = "/activity" if name == "1h" else f"/activity?range={name}"
    page = soup(operator.get(url))
    assert page.select_one("#activity-heading").get_text() == title
    links = {a.get_text(): a for a in page.select("#activity .ranges a")}
    assert list(links) == ["1 h", "24 h", "7 d"]
    for link in links.values():  # plain links: they work without JavaScript
        assert link["href"] == link["hx-get"]
        assert link["href"].startswith("/activity")
    assert links[f"{name[:-1]} {name[-1]}"]["aria-current"] == "page"
    titles = [t.get_text() for t in page.select("#activity svg .axis-title")]
    assert titles == ["locks", f"events per {per}", f"refused per {per}"]
    assert f"per {per}" in page.select_one("#events-title").get_text()
    poll = page.select_one("#activity .poller")["hx-get"]
    assert (f"range={name}" in poll) == (name != "1h")
    assert len(charts.window(NOW, charts.SPANS[name]).moments) == bars + 1


def test_an_unknown_range_is_a_400_with_the_choices(operator):
    response = operator.get("/activity?range=1y")
    assert response.status_code == 400
    assert "1h, 24h, 7d" in response.get_data(as_text=True)


def test_one_spike_is_clipped_so_the_rest_stays_readable():
    values = [3, 4, 5, 4, 3] * 11 + [400]
    assert charts._scale(values) == 15  # three times the 90th percentile
    assert charts._scale([3, 4, 5, 9, 4, 3]) == 9  # no spike: the largest value
    assert charts._scale([0] * 50 + [1, 90]) == 90  # too few values to clip for
    assert charts._scale([]) == 0


def test_a_spike_is_drawn_at_the_top_and_told_in_words(app, backend):
    minute = [event("acquired", 30.5 - i, resource=f"job:{i}") for i in range(20)]
    spike = [event("renewed", 5.5, resource="job:spike") for _ in range(200)]
    with app.app_context():
        for item in [*minute, *spike]:
            db.session.add(item)
        db.session.commit()
        drawn = charts.build(NOW, 15)
    chart = drawn.events
    assert chart.peak == 200
    assert chart.clipped
    assert chart.y_max < 200
    tallest = max(bar[3] for bar in chart.bars)
    assert tallest == chart.plot_bottom - chart.plot_top


def test_every_range_is_redrawn_once_a_minute(fake_app, monkeypatch):
    """A drawing counts only what the stored buckets lack, so the day and the
    week are drawn as often as the hour: their newest point is now."""
    calls = []
    real_build = charts.build

    def counted(now, within, shown=charts.DEFAULT_SPAN, budget=None):
        calls.append((shown.name, now))
        return real_build(now, within, shown, budget)

    monkeypatch.setattr(charts, "build", counted)
    with fake_app.app_context():
        for seconds in (0, 20, 59, 60, 61, 130):
            for shown in charts.SPANS.values():
                charts.cached(NOW + timedelta(seconds=seconds), 15, shown)
    for name in charts.SPANS:
        assert [at for shown, at in calls if shown == name] == [
            NOW,
            NOW + timedelta(seconds=60),
            NOW + timedelta(seconds=130),
        ]


def direct(now, within, shown):
    """The samples and events per bucket counted afresh from every event of the
    range, nothing stored: what the stored buckets must agree with."""
    moments = charts.window(now, shown)
    states = activity.states(moments, within)
    per_bucket = [sum(c.values()) for c in activity.per_bucket(moments)]
    return [tuple(s[k] for k in activity.STATES) for s in states], per_bucket


def drawn(now, within, shown):
    samples = charts.samples(now, within, shown)
    per_minute = [count for _, count in charts.per_minute(now, shown)]
    return [(s.held, s.expiring, s.stale) for s in samples], per_minute


@pytest.mark.parametrize("name", ["1h", "24h"])
def test_stored_buckets_agree_with_counting_afresh_as_time_moves_on(app, backend, name):
    """A history written while the charts are drawn again and again (each
    drawing storing its closed buckets): every drawing equals a count of the
    whole range from the events and rows, nothing stored."""
    shown = charts.SPANS[name]
    with app.app_context():
        for n in range(6):
            # Events up to "now" of this round, then a drawing at that now.
            now = NOW + shown.step * n + timedelta(seconds=17 * n)
            for k, action in enumerate(["acquired", "renewed", "released"]):
                # Written as they happen: seconds before the drawing.
                at = now - timedelta(seconds=15 - 5 * k)
                resource = f"job:{n}"
                db.session.add(
                    LockEvent(
                        resource=resource,
                        action=action,
                        owner="w",
                        previous_owner=None if action == "acquired" else "w",
                        fence=n + 1,
                        acquired_at=at,
                        expires_at=at + timedelta(minutes=3),
                        occurred_at=at,
                    )
                )
                db.session.flush()
            # A grant of this round still held: its event and its row.
            granted = now - timedelta(seconds=30)
            expires = now + timedelta(minutes=2)
            db.session.add(
                LockEvent(
                    resource=f"job:row{n}",
                    action="acquired",
                    owner="w",
                    fence=100 + n,
                    acquired_at=granted,
                    expires_at=expires,
                    occurred_at=granted,
                )
            )
            db.session.add(
                DistributedLock(
                    resource=f"job:row{n}",
                    owner="w",
                    fence=100 + n,
                    acquired_at=granted,
                    expires_at=expires,
                )
            )
            db.session.commit()
            assert drawn(now, 30, shown) == direct(now, 30, shown)
        stored = db.session.scalar(select(func.count()).select_from(ActivitySample))
    assert stored > 0  # the drawings did store closed moments


def test_a_closed_bucket_is_read_back_not_counted_again(app, backend):
    """After a drawing, an event written into a closed bucket (which a real
    service never does: events are appended) does not change the bucket; one in
    the open bucket and the last minute does."""
    with app.app_context():
        db.session.add(event("acquired", 30.5, resource="job:a"))
        db.session.commit()
        first = dict(charts.per_minute(NOW))
        assert first[minutes_ago(31)] == 1
        db.session.add(event("acquired", 30.5, resource="job:b"))  # closed
        db.session.add(event("acquired", 0.5, resource="job:c"))  # the last minute
        db.session.commit()
        again = dict(charts.per_minute(NOW + timedelta(seconds=1)))
        totals = db.session.scalars(
            select(ActivityEvents.events).where(
                ActivityEvents.starts_at == minutes_ago(31),
                ActivityEvents.action == EVERY_ACTION,
            )
        ).all()
    assert again[minutes_ago(31)] == 1
    assert again[minutes_ago(1)] == 1
    assert totals == [1]


def test_an_unaligned_now_draws_the_open_bucket_after_the_grid(app, backend):
    now = NOW + timedelta(seconds=30)
    with app.app_context():
        db.session.add(event("acquired", -0.25, resource="job:open"))
        db.session.add(event("acquired", 0.5, resource="job:last"))
        db.session.commit()
        moments = charts.window(now).moments
        drawing = charts.build(now, 15)
    assert moments[0] == NOW - timedelta(hours=1)
    assert moments[-2:] == [NOW, now]
    assert len(drawing.per_minute) == 61
    assert drawing.per_minute[-2:] == [(minutes_ago(1), 1), (NOW, 1)]
    whole, open_bucket = drawing.events.bars[-2:]
    assert open_bucket[2] < whole[2]  # drawn half as wide


def test_concurrent_drawings_store_each_closed_bucket_once(make_app, backend):
    """Drawers in several threads at once, the store empty: they count the same
    buckets, all agree, and each bucket is stored once (the later inserts are
    left alone, never an error)."""
    app = make_app()
    with app.app_context():
        for n in range(30):  # each grant's event and its row (ran out since)
            db.session.add(event("acquired", 55 - n, resource=f"job:{n}"))
            db.session.add(row(f"job:{n}", "w", 55 - n, 45 - n))
        db.session.commit()
    start = threading.Barrier(4)
    results, errors = [], []

    def draw():
        try:
            with app.app_context():
                start.wait(timeout=30)
                results.append(drawn(NOW, 15, charts.DEFAULT_SPAN))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert len(results) == 4
    assert all(r == results[0] for r in results)
    with app.app_context():
        per_bucket = db.session.execute(
            select(ActivityEvents.starts_at, func.count())
            .where(ActivityEvents.action == EVERY_ACTION)
            .group_by(ActivityEvents.starts_at)
        ).all()
        samples = db.session.scalar(select(func.count()).select_from(ActivitySample))
    assert len(per_bucket) == 59  # every whole minute but the last (not closed)
    assert {count for _, count in per_bucket} == {1}
    assert samples == 60  # the moments up to a minute before now


def test_stored_rows_older_than_the_widest_range_are_deleted(app, backend):
    with app.app_context():
        charts.per_minute(NOW)
        charts.per_minute(NOW + timedelta(days=8))
        oldest = db.session.scalar(select(func.min(ActivityEvents.starts_at)))
    assert oldest >= NOW + timedelta(days=8) - rollup.KEPT_FOR


def _charts_now_and_cards(fake_app, clock):
    """The charts' last point (now) and the cards' counts, at the clock's now."""
    from app.extensions import lock_service

    with fake_app.app_context():
        service = lock_service()
        within = service.settings.expiring_within
        last = charts.samples(clock.now(), within)[-1]
        cards = service.counts()
    return (last.held, last.expiring, last.stale), (
        cards[LockState.HELD],
        cards[LockState.EXPIRING],
        cards[LockState.STALE],
    )


def test_the_charts_now_judges_short_ttls_as_the_cards_do(backend, fake_app, clock):
    """The charts' last point and the cards agree on "expiring" by each grant's
    ttl: a lock renewed for 20 s with 12 s left is held (within the 15 s
    window, not past half its ttl), one acquired or renewed for 60 s with 8 s
    left is expiring."""
    from app.extensions import lock_service

    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:short", "w", ttl=20)
        service.acquire("job:renewed-short", "w", ttl=300)
        service.acquire("job:renewed-long", "w", ttl=300)
        clock.advance(40)
        service.acquire("job:long", "w", ttl=60)
        service.renew("job:renewed-short", "w", ttl=20)
        service.renew("job:renewed-long", "w", ttl=60)
    clock.advance(8)  # job:short ran out; 12 s left of 20, 52 of 60
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (3, 0, 1)
    assert charted == cards
    clock.advance(44)  # 8 s left of 60; the 20 s ones ran out
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (0, 2, 2)
    assert charted == cards


def test_the_charts_count_a_holder_held_resource_once_as_the_cards_do(
    backend, fake_app, clock
):
    """A semaphore held by 2 holders and a shared lock held by 2 readers are one
    lock each, in the state of their grant that ends first, on the charts as
    on the cards: held, then expiring as that grant nears its end, then held
    again by the later one, and gone once every grant ran out. Acquired in the
    window (their events tell) and untouched for longer than the window (their
    rows tell) alike."""
    from app.extensions import lock_service

    hour = 3600
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:exclusive", "w", ttl=3 * hour)
        service.acquire("job:stale", "w", ttl=60)
        service.acquire("job:sem", "a", ttl=2 * hour, limit=2)
        service.acquire("job:sem", "b", ttl=4 * hour, limit=2)
        service.acquire("job:readers", "r1", ttl=5 * hour, mode="shared")
        service.acquire("job:readers", "r2", ttl=6 * hour, mode="shared")
    clock.advance(120)
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (3, 0, 1)
    assert charted == cards

    # The last event says a reader let go; the other still holds the lock.
    with fake_app.app_context():
        lock_service().release("job:readers", "r1")
    clock.advance(60)
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (3, 0, 1)
    assert charted == cards

    clock.advance(2 * hour - 180 - 10)  # holder a: 10 s left, untouched for 2 h
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (2, 1, 1)
    assert charted == cards

    clock.advance(20)  # holder a ran out: holder b holds the semaphore
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (3, 0, 1)
    assert charted == cards

    clock.advance(2 * hour)  # every holder and the exclusive grant ran out
    charted, cards = _charts_now_and_cards(fake_app, clock)
    assert cards == (1, 0, 2)
    assert charted == cards


def holder_held_row(resource, limit, holders_ends_minutes):
    """The row of a resource held by holders (no owner; ``places_until`` the
    latest expiry of its holders) and its holders, granted before the window."""
    granted = minutes_ago(90)
    ends = [minutes_ago(m) for m in holders_ends_minutes]
    row = DistributedLock(
        resource=resource,
        owner=None,
        fence=1,
        acquired_at=granted,
        expires_at=granted,
        holder_limit=limit,
        places_until=max(ends),
    )
    held = [
        LockHolder(
            resource=resource,
            owner=f"p{i}",
            token=f"t{i}",
            mode=SHARED if limit == 1 else "exclusive",
            fence=10 + i,
            acquired_at=granted,
            expires_at=expires,
        )
        for i, expires in enumerate(ends)
    ]
    return [row, *held]


def test_a_past_moment_counts_untouched_holders_by_the_one_that_ends_first(stored):
    """No event in the window: the holders did not change, so at each past
    moment the resource is in the state of its holder that ends first after it
    (expiring within 2 min of it, then held by the next), and free once the last
    ran out (a holder that ran out is nobody's grant: never stale)."""
    sampled = stored(
        rows=[
            *holder_held_row("job:sem", 3, [40, 20, -30]),
            *holder_held_row("job:readers", 1, [50, 10]),
        ],
        within=120,
    )
    assert at_minute(sampled, 55) == (2, 0, 0)
    assert at_minute(sampled, 51) == (1, 1, 0)  # a reader: 1 min left
    assert at_minute(sampled, 45) == (2, 0, 0)  # the other reader holds it
    assert at_minute(sampled, 41) == (1, 1, 0)  # a holder: 1 min left
    assert at_minute(sampled, 40) == (2, 0, 0)  # the next holder holds it
    assert at_minute(sampled, 21) == (1, 1, 0)
    assert at_minute(sampled, 11) == (1, 1, 0)  # a reader: 1 min left
    assert at_minute(sampled, 10) == (1, 0, 0)  # the readers ran out: free
    assert at_minute(sampled, 0) == (1, 0, 0)


def test_a_request_counts_a_bounded_number_of_events_and_says_what_it_has_not(
    backend, operator, fake_app, clock, monkeypatch
):
    """With nothing stored (a fresh deploy), a request counts only the newest
    events within its budget: the older part of the range is drawn as not
    counted yet, and the page says so (counting the whole range in the request
    took 16-30 s at a million events, past a worker's timeout). The rest is
    counted in the background and stored; the next drawing is the whole range,
    equal to counting it afresh."""
    monkeypatch.setattr(rollup, "EVENTS_PER_DRAWING", 10)
    clock.current = NOW + timedelta(seconds=30)
    with fake_app.app_context():
        for n in range(60):  # one grant a minute (its event and row), 2 min long
            db.session.add(event("acquired", 59.5 - n, f"job:{n}", ttl_minutes=2))
            db.session.add(row(f"job:{n}", "w", 59.5 - n, 57.5 - n))
            db.session.flush()
        db.session.commit()
    # The background count is started by the request and run here, after it.
    started = []
    count_the_rest = charts._count_the_rest
    monkeypatch.setattr(charts, "_count_the_rest", lambda *args: started.append(args))
    first = soup(operator.get("/activity"))
    # The same drawing on a paused page, where nothing polls.
    paused = soup(operator.get("/activity?live=0"))
    with fake_app.app_context():
        filled = [
            db.session.scalar(select(func.count()).select_from(ActivitySample)),
            db.session.scalar(
                select(func.count())
                .select_from(ActivityEvents)
                .where(ActivityEvents.action == EVERY_ACTION)
            ),
        ]
        assert len(started) == 1
        count_the_rest(*started[0])
        for thread in charts.counting_in_background(fake_app):
            thread.join(timeout=60)
        assert not charts.counting_in_background(fake_app)
        whole = direct(clock.now(), 15, charts.DEFAULT_SPAN)

    counting = first.select_one("#activity-counting")
    assert counting is not None
    assert "being counted in the background" in counting.get_text()
    assert "shows within seconds" in counting.get_text()
    counting_paused = paused.select_one("#activity-counting").get_text()
    assert "shows once the page is resumed or reloaded" in counting_paused
    assert "within seconds" not in counting_paused
    hatched = first.select("rect.uncounted")
    assert len(hatched) == 2  # the states' and the events' plots
    # The newest 10 events are a minute each: counted from about 10 min ago.
    bars = first.select("rect.event-bar title")
    assert 9 <= len(bars) <= 12
    assert all("1 event at" in bar.get_text() for bar in bars)
    # The request stored the closed moments and buckets it counted, not 60.
    assert all(8 <= n <= 12 for n in filled), filled
    # While the rest is counted, the charts poll every few seconds, then once a
    # minute again.
    assert "every 5s" in first.select_one(".poller")["hx-trigger"]

    again = soup(operator.get("/activity?live=1"))  # the pause is remembered
    assert again.select_one("#activity-counting") is None
    assert "every 60s" in again.select_one(".poller")["hx-trigger"]
    assert not again.select("rect.uncounted")
    assert len(again.select("rect.event-bar")) == 60
    with fake_app.app_context():
        assert drawn(clock.now(), 15, charts.DEFAULT_SPAN) == whole


EVENTS_PER_SECOND = 12


def write_traffic(app, since: datetime, until: datetime) -> None:
    """``EVENTS_PER_SECOND`` acquires and releases from ``since`` to ``until``,
    in order (their ids follow their instants, as events written as they
    happen)."""
    seconds = (until - since).total_seconds()
    count = round(seconds * EVENTS_PER_SECOND)
    rows = []
    for n in range(count):
        at = since + timedelta(seconds=n / EVENTS_PER_SECOND)
        acquired = n % 2 == 0
        rows.append(
            {
                "resource": f"job:{n // 2 % 40}",
                "action": "acquired" if acquired else "released",
                "owner": "w" if acquired else None,
                "previous_owner": None if acquired else "w",
                "fence": 1,
                "acquired_at": at,
                "expires_at": at + timedelta(seconds=30),
                "occurred_at": at,
            }
        )
    with app.app_context():
        db.session.execute(LockEvent.__table__.insert(), rows)
        db.session.commit()


@pytest.mark.parametrize("name", list(charts.SPANS))
def test_under_steady_traffic_every_range_shows_its_events_within_a_minute(
    backend, operator, fake_app, clock, monkeypatch, name
):
    """Twelve events a second written as time passes, one range's charts
    polled every ten seconds from a cold start (nothing stored, seven minutes of
    traffic before it) for 80 s: it never says "0 in the range" for
    what it has not counted, and from the second poll on (the background count
    of the cold start done) it shows the count of every event in it.
    Above about 8 events a second the minute just ended was never counted (it
    cannot be stored until a minute after it ends, and the budget reached only
    the open minute): 24 h and 7 d said "0 events in the range" on every poll,
    1 h showed the current minute only."""
    built: dict[str, charts.Activity] = {}
    build = charts.build

    def recorded(now, within, shown=charts.DEFAULT_SPAN, budget=None):
        drawing = build(now, within, shown, budget)
        built[shown.name] = drawing
        return drawing

    monkeypatch.setattr(charts, "build", recorded)
    # Mid-minute, minutes into the open bucket of the day's and the week's.
    clock.current = NOW + timedelta(minutes=7, seconds=17)
    written_until = clock.now() - timedelta(minutes=7)
    for poll in range(8):  # across a minute's end, at 10:08:07
        write_traffic(fake_app, written_until, clock.now())
        written_until = clock.now()
        page = soup(operator.get(f"/activity?range={name}"))
        for thread in charts.counting_in_background(fake_app):
            thread.join(timeout=60)
        caption = page.select("figure.chart figcaption")[1].get_text()
        drawing = built[name]
        with fake_app.app_context():
            events_in_range = db.session.scalar(
                select(func.count()).where(
                    LockEvent.occurred_at >= drawing.start,
                    LockEvent.occurred_at < drawing.end,
                )
            )
        assert events_in_range > 0
        if poll == 0:
            # The cold start: its newest minutes, the rest said uncounted.
            assert page.select_one("#activity-counting") is not None
            assert "in the range" not in caption or "counted part" in caption
            assert " 0 in the " not in caption, caption
        else:
            assert page.select_one("#activity-counting") is None, poll
            assert f"{events_in_range} in the range" in caption, (poll, caption)
        clock.advance(10)


def test_a_bucket_not_counted_yet_leaves_the_stored_ones_drawn(
    backend, operator, fake_app, clock, monkeypatch
):
    """The day's buckets are stored up to the open one, whose older minutes
    are neither stored nor within a request's budget: that bucket alone is
    hatched and the caption counts the rest as "the counted part" (every
    bucket before an uncounted one was drawn as not counted, and the range
    said "0 events in the range")."""
    day = charts.SPANS["24h"]
    with fake_app.app_context():
        for minute in range(60):  # one a minute in the hour before 10:00
            db.session.add(event("acquired", 60 - minute, f"job:{minute}"))
        db.session.flush()
        for minute in range(15):  # three a minute since
            for n in range(3):
                db.session.add(event("renewed", -minute - n / 4, f"job:{n}"))
        db.session.commit()
        # A drawing at 10:01:30 stored every bucket before 10:00.
        charts.samples(NOW + timedelta(seconds=90), 15, day)
        charts.per_minute(NOW + timedelta(seconds=90), day)
    monkeypatch.setattr(rollup, "EVENTS_PER_DRAWING", 5)
    monkeypatch.setattr(charts, "_count_the_rest", lambda *args: None)
    clock.current = NOW + timedelta(minutes=15, seconds=30)
    page = soup(operator.get("/activity?range=24h"))
    caption = page.select("figure.chart figcaption")[1].get_text()
    assert "60 in the counted part of the range" in caption
    assert len(page.select("rect.uncounted")) == 1  # the open bucket's events
    assert page.select_one("#activity-counting") is not None
    assert len(page.select("rect.event-bar")) == 3  # 09:00, 09:20, 09:40


def holder_event(action, minutes, resource, owner, fence, ttl_minutes=60.0, mode=None):
    """An event of one holder of a resource held by holders (its own fence)."""
    at = minutes_ago(minutes)
    ends = action in ("released", "force_released")
    return LockEvent(
        resource=resource,
        action=action,
        owner=owner,
        previous_owner=owner if ends else None,
        fence=fence,
        acquired_at=at,
        expires_at=at if ends else at + timedelta(minutes=ttl_minutes),
        occurred_at=at,
        mode=mode or "exclusive",
    )


def test_overlapping_holders_in_the_past_each_hold_their_resource(stored):
    """Two holders at once, in the past: a semaphore's holders (a from 50 min
    ago and on, b from 40 to 30 min ago) and two readers (r1 from 55 min ago,
    renewed at 35 until 5 min ago; r2 from 45 to 25 min ago). Each holder is
    read from its own events, so a resource is held while any of its grants
    is, once (as the cards count it), and expiring as its grant that ends
    first: not freed by another holder's release, nor renewed by another's
    renewal."""
    a_ends = minutes_ago(-10)
    semaphore = DistributedLock(
        resource="sem:2",
        owner=None,
        fence=1,
        acquired_at=minutes_ago(50),
        expires_at=minutes_ago(50),
        holder_limit=2,
        places_until=a_ends,
    )
    holder_a = LockHolder(
        resource="sem:2",
        owner="a",
        token="t",
        mode="exclusive",
        fence=11,
        acquired_at=minutes_ago(50),
        expires_at=a_ends,
    )
    readers = DistributedLock(
        resource="rw:1",
        owner=None,
        fence=1,
        acquired_at=minutes_ago(55),
        expires_at=minutes_ago(55),
        holder_limit=1,
        places_until=minutes_ago(5),
    )
    r1 = LockHolder(
        resource="rw:1",
        owner="r1",
        token="t",
        mode=SHARED,
        fence=21,
        acquired_at=minutes_ago(35),
        expires_at=minutes_ago(5),
    )
    sampled = stored(
        events=[
            holder_event("acquired", 55, "rw:1", "r1", 21, 30, SHARED),
            holder_event("acquired", 50, "sem:2", "a", 11),
            holder_event("acquired", 45, "rw:1", "r2", 22, 60, SHARED),
            holder_event("acquired", 40, "sem:2", "b", 12),
            holder_event("renewed", 35, "rw:1", "r1", 21, 30, SHARED),
            holder_event("released", 30, "sem:2", "b", 12),
            holder_event("released", 25, "rw:1", "r2", 22, mode=SHARED),
        ],
        rows=[semaphore, holder_a, readers, r1],
        within=120,
    )
    assert at_minute(sampled, 58) == (0, 0, 0)
    assert at_minute(sampled, 52) == (1, 0, 0)  # r1
    assert at_minute(sampled, 42) == (2, 0, 0)  # a and b; r1 and r2
    assert at_minute(sampled, 38) == (2, 0, 0)
    assert at_minute(sampled, 26) == (2, 0, 0)  # a; r1 (r2 left at 25)
    assert at_minute(sampled, 20) == (2, 0, 0)  # a alone; r1 alone
    assert at_minute(sampled, 6) == (1, 1, 0)  # r1: 1 min left
    assert at_minute(sampled, 4) == (1, 0, 0)  # r1 ran out: free
    assert at_minute(sampled, 0) == (1, 0, 0)
