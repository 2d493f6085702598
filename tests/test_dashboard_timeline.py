"""The timeline geometry, from events alone: no Flask, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.dashboard import timeline
from app.locks.results import Event
from app.locks.state import Action

T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)
_ids = iter(range(1, 10_000))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(action, second, owner, ttl=30, previous=None, fence=1, actor=None):
    return Event(
        id=next(_ids),
        resource="job:1",
        action=Action(action),
        owner=owner,
        previous_owner=previous,
        fence=fence,
        acquired_at=at(second),
        expires_at=at(second + ttl),
        actor=actor,
        reason=None,
        occurred_at=at(second),
    )


def test_no_events_draw_nothing():
    drawn = timeline.build([], at(0))
    assert drawn.empty
    assert drawn.lanes == []


def test_release_ends_a_tenure_where_it_happened():
    spans = timeline.tenures(
        [event("acquired", 0, "a"), event("released", 10, "a", previous="a")], at(60)
    )
    assert [(s.owner, s.start, s.end, s.ended_by) for s in spans] == [
        ("a", at(0), at(10), "released")
    ]


def test_renewals_extend_one_tenure_and_a_live_lock_runs_to_now():
    spans = timeline.tenures(
        [
            event("acquired", 0, "a", ttl=30),
            event("renewed", 20, "a", ttl=30),
            event("renewed", 40, "a", ttl=30),
        ],
        at(50),
    )
    assert [(s.start, s.end, s.ended_by) for s in spans] == [(at(0), at(50), "held")]


def test_unrenewed_lock_ends_at_its_expiry_and_take_over_starts_a_new_lane():
    events = [
        event("acquired", 0, "a", ttl=10, fence=1),
        event("took_over", 30, "b", ttl=10, previous="a", fence=2, actor="tok"),
    ]
    spans = timeline.tenures(events, at(100))
    assert [(s.owner, s.end, s.ended_by, s.fence) for s in spans] == [
        ("a", at(10), "expired", 1),
        ("b", at(40), "expired", 2),
    ]
    drawn = timeline.build(events, at(100))
    assert [lane.owner for lane in drawn.lanes] == ["a", "b"]
    assert drawn.lanes[0].y < drawn.lanes[1].y
    assert [m.action for m in drawn.markers] == ["took_over"]
    assert drawn.markers[0].label == "took_over by tok (from a)"


def test_force_claim_cuts_the_holder_short_and_is_marked_forced():
    events = [
        event("acquired", 0, "a", ttl=100),
        event("force_claimed", 20, "op", ttl=60, previous="a", actor="olga"),
    ]
    spans = timeline.tenures(events, at(30))
    assert [(s.owner, s.end, s.ended_by, s.forced) for s in spans] == [
        ("a", at(20), "force_claimed", False),
        ("op", at(30), "held", True),
    ]
    drawn = timeline.build(events, at(30))
    assert "tenure-forced" in drawn.bars[1].css_class
    assert drawn.markers[0].action == "force_claimed"


def test_force_release_is_marked_on_the_holders_lane():
    events = [
        event("acquired", 0, "a", ttl=100),
        event("force_released", 50, "a", previous="a", actor="olga"),
    ]
    drawn = timeline.build(events, at(100))
    assert drawn.bars[0].tenure.ended_by == "force_released"
    marker = drawn.markers[0]
    assert marker.action == "force_released"
    assert marker.y == drawn.lanes[0].y + timeline.LANE_HEIGHT / 2


def test_geometry_maps_time_linearly_onto_the_plot():
    events = [
        event("acquired", 0, "a", ttl=100),
        event("released", 50, "a", previous="a"),
    ]
    drawn = timeline.build(events, at(100))
    plot = timeline.WIDTH - timeline.LABEL_WIDTH - timeline.RIGHT_PAD
    bar = drawn.bars[0]
    assert bar.x == timeline.LABEL_WIDTH
    assert bar.width == plot / 2
    assert drawn.now_x == timeline.LABEL_WIDTH + plot
    assert [t.x for t in drawn.ticks][0] == timeline.LABEL_WIDTH
    assert len(drawn.ticks) == timeline.TICKS + 1
    assert drawn.height == timeline.TOP + timeline.LANE_HEIGHT + timeline.AXIS_HEIGHT


def test_tiny_tenures_stay_visible():
    events = [
        event("acquired", 0, "a", ttl=100),
        event("released", 0.001, "a", previous="a"),
    ]
    drawn = timeline.build(events, at(3600))
    assert drawn.bars[0].width >= 2


def test_events_out_of_order_give_the_same_picture():
    events = [
        event("acquired", 0, "a", ttl=10),
        event("took_over", 30, "b", ttl=10, previous="a"),
        event("released", 35, "b", previous="b"),
    ]
    assert timeline.tenures(list(reversed(events)), at(60)) == timeline.tenures(
        events, at(60)
    )


def test_history_that_starts_mid_tenure_still_shows_the_holder():
    spans = timeline.tenures([event("renewed", 10, "a", ttl=30)], at(20))
    assert [(s.owner, s.ended_by) for s in spans] == [("a", "held")]


def test_only_the_most_recent_owners_get_lanes():
    events = [
        event("took_over", n * 10, f"w{n}", ttl=5, previous=f"w{n - 1}")
        for n in range(timeline.MAX_LANES + 3)
    ]
    drawn = timeline.build(events, at(1000))
    assert len(drawn.lanes) == timeline.MAX_LANES
    assert drawn.hidden_owners == 3
    assert drawn.lanes[-1].owner == f"w{timeline.MAX_LANES + 2}"
