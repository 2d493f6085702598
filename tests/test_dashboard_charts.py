"""The last hour's charts: states per minute and events per minute, from events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.dashboard import charts
from app.locks.results import Event, Lock
from app.locks.state import Action, LockState
from tests.dashboard_helpers import poller_version, soup

NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)
_ids = iter(range(1, 100_000))


def minutes_ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def event(action, minutes, resource="job:1", owner="w", ttl_minutes=10.0, prev=None):
    at = minutes_ago(minutes)
    return Event(
        id=next(_ids),
        resource=resource,
        action=Action(action),
        owner=owner,
        previous_owner=prev,
        fence=1,
        acquired_at=at,
        expires_at=at + timedelta(minutes=ttl_minutes) if owner else at,
        actor=None,
        reason=None,
        occurred_at=at,
    )


def row(resource, owner, acquired_minutes, expires_minutes):
    expires = minutes_ago(expires_minutes)
    remaining = (expires - NOW).total_seconds()
    return Lock(
        resource=resource,
        owner=owner,
        fence=1,
        acquired_at=minutes_ago(acquired_minutes),
        expires_at=expires,
        ttl_remaining=max(remaining, 0),
        state=LockState.STALE if remaining <= 0 else LockState.HELD,
    )


def at_minute(samples, minutes):
    [sample] = [s for s in samples if s.at == minutes_ago(minutes)]
    return (sample.held, sample.expiring, sample.stale)


def test_a_lock_that_runs_out_goes_held_expiring_stale():
    events = [event("acquired", 30, ttl_minutes=10)]
    current = [row("job:1", "w", 30, 20)]
    sampled = charts.samples(events, current, NOW, expiring_within=120)
    assert len(sampled) == 61
    assert at_minute(sampled, 40) == (0, 0, 0)  # before the acquire: free
    assert at_minute(sampled, 30) == (1, 0, 0)
    assert at_minute(sampled, 21) == (0, 1, 0)  # 1 min left, within 2 min
    assert at_minute(sampled, 20) == (0, 0, 1)
    assert at_minute(sampled, 0) == (0, 0, 1)


def test_renewals_and_a_release_within_the_hour():
    events = [
        event("renewed", 50, ttl_minutes=5),  # held since before the hour
        event("renewed", 46, ttl_minutes=5),
        event("released", 44),
    ]
    sampled = charts.samples(events, [], NOW, expiring_within=15)
    assert at_minute(sampled, 60) == (1, 0, 0)
    assert at_minute(sampled, 45) == (1, 0, 0)
    assert at_minute(sampled, 44) == (0, 0, 0)


def test_a_take_over_was_stale_before_it():
    events = [event("took_over", 10, owner="w2", prev="w1")]
    sampled = charts.samples(events, [], NOW, expiring_within=15)
    assert at_minute(sampled, 60) == (0, 0, 1)
    assert at_minute(sampled, 10) == (1, 0, 0)


def test_the_charts_and_the_tenures_agree_on_a_stale_lock_ended_later():
    """A lock that ran out and was force-released later: its tenure ended
    ("expired") at its expiry, so the chart counts it stale, not held, between."""
    from app.audit.tenures import derive

    events = [
        event("acquired", 40, ttl_minutes=5),
        event("force_released", 20, prev="w"),
    ]
    [tenure] = derive(events, NOW)
    assert (tenure.held_until, tenure.ended_by) == (minutes_ago(35), "expired")
    sampled = charts.samples(events, [], NOW, expiring_within=0)
    assert at_minute(sampled, 36) == (1, 0, 0)
    assert at_minute(sampled, 30) == (0, 0, 1)
    assert at_minute(sampled, 20) == (0, 0, 0)


def test_a_lock_untouched_all_hour_counts_from_its_row():
    current = [row("job:long", "w", 180, -120), row("job:dead", "w", 300, 200)]
    sampled = charts.samples([], current, NOW, expiring_within=15)
    assert {at_minute(sampled, m) for m in range(61)} == {(1, 0, 1)}


def test_events_per_minute_and_the_drawing():
    events = [event("acquired", 5.5, resource=f"job:{n}") for n in range(3)]
    events.append(event("acquired", 0.5, resource="job:x"))
    events.append(event("acquired", 61, resource="job:old"))  # outside the window
    minutes = charts.per_minute(events, NOW)
    assert len(minutes) == 60
    assert dict(minutes)[minutes_ago(6)] == 3
    assert dict(minutes)[minutes_ago(1)] == 1
    assert sum(count for _, count in minutes) == 4

    drawn = charts.build(events, [], NOW, 15)
    assert drawn.total_events == 4
    assert [bar[4] for bar in drawn.events.bars] == [
        "3 events at 09:54Z",
        "1 event at 09:59Z",
    ]
    assert drawn.events.y_max == 5
    labels = [label for _, label in drawn.states.x_ticks]
    assert labels[0] == "09:00Z"
    assert labels[-1] == "10:00Z"
    for points in drawn.states.lines.values():
        assert len(points.split()) == 61


def test_overview_shows_the_last_hour_and_polls_it_once_a_minute(
    operator, fake_app, clock
):
    from app.locks.service import lock_service

    with fake_app.app_context():
        lock_service().acquire("job:1", "w", ttl=600)
    page = soup(operator.get("/"))
    section = page.select_one("#activity")
    assert "Now 1 held, 0 expiring, 0 stale" in section.select_one("desc").get_text()
    poller = section.select_one(".poller")
    assert poller["hx-trigger"].startswith("every 60s")
    version = poller_version(poller)
    headers = {
        "HX-Request": "true",
        "HX-Target": "section#activity",
        "Lockkeeper-Shown": version,
    }
    assert operator.get(poller["hx-get"], headers=headers).status_code == 204
    clock.advance(60)
    again = operator.get(poller["hx-get"], headers=headers)
    assert again.status_code == 200
    assert soup(again).body is None
    assert soup(operator.get("/activity")).body is not None
