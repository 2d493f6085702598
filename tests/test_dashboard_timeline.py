"""The timeline geometry, from events alone: no Flask, no database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from lockkeeper_core.results import Event
from lockkeeper_core.state import Action

from app.audit.tenures import derive
from app.dashboard import timeline

T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)
_ids = iter(range(1, 10_000))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(
    action,
    second,
    owner,
    ttl=30,
    previous=None,
    fence=1,
    actor=None,
    mode=None,
    token=None,
):
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
        token=token,
        mode=mode,
    )


def test_no_events_draw_nothing():
    drawn = timeline.build([], at(0))
    assert drawn.empty
    assert drawn.lanes == []


def test_release_ends_a_tenure_where_it_happened():
    spans = derive(
        [event("acquired", 0, "a"), event("released", 10, "a", previous="a")], at(60)
    )
    assert [(s.owner, s.held_from, s.held_until, s.ended_by) for s in spans] == [
        ("a", at(0), at(10), "released")
    ]


def test_renewals_extend_one_tenure_and_a_live_lock_runs_to_now():
    spans = derive(
        [
            event("acquired", 0, "a", ttl=30),
            event("renewed", 20, "a", ttl=30),
            event("renewed", 40, "a", ttl=30),
        ],
        at(50),
    )
    assert [(s.held_from, s.held_until, s.ended_by) for s in spans] == [
        (at(0), at(50), "held")
    ]


def test_unrenewed_lock_ends_at_its_expiry_and_take_over_starts_a_new_lane():
    events = [
        event("acquired", 0, "a", ttl=10, fence=1),
        event("took_over", 30, "b", ttl=10, previous="a", fence=2, actor="tok"),
    ]
    spans = derive(events, at(100))
    assert [(s.owner, s.held_until, s.ended_by, s.fence) for s in spans] == [
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
    spans = derive(events, at(30))
    assert [(s.owner, s.held_until, s.ended_by, s.forced) for s in spans] == [
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
    # 100 s: a tick every 30 s, on the round instants.
    assert [t.label for t in drawn.ticks] == [
        "09:00:00Z",
        "09:00:30Z",
        "09:01:00Z",
        "09:01:30Z",
    ]
    assert drawn.ticks[0].x == timeline.LABEL_WIDTH
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
    assert derive(list(reversed(events)), at(60)) == derive(events, at(60))


def test_history_that_starts_mid_tenure_still_shows_the_holder():
    spans = derive([event("renewed", 10, "a", ttl=30)], at(20))
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


def test_ticks_fall_on_round_minutes_none_skipped():
    # The span of the report: 16:05:17 to 16:13:02 used to give 16:06, 16:08
    # with 16:07 skipped (equal fractions truncated to the minute).
    start = datetime(2026, 11, 30, 16, 5, 17, tzinfo=UTC)
    end = datetime(2026, 11, 30, 16, 13, 2, tzinfo=UTC)
    labels = [label for _, label in timeline.ticks(start, end)]
    assert labels == ["16:06Z", "16:08Z", "16:10Z", "16:12Z"]
    moments = [moment for moment, _ in timeline.ticks(start, end)]
    assert all(m.second == 0 and m.minute % 2 == 0 for m in moments)


def test_tick_steps_are_round_and_few_at_every_scale():
    for seconds in (60, 61, 300, 3599, 7200, 86400, 3 * 86400, 90 * 86400):
        start = T0 + timedelta(seconds=13.7)
        end = start + timedelta(seconds=seconds)
        found = timeline.ticks(start, end)
        assert 2 <= len(found) <= timeline.MAX_TICKS, seconds
        assert all(start <= moment <= end for moment, _ in found)
        steps = {b - a for (a, _), (b, _) in zip(found, found[1:], strict=False)}
        assert len(steps) == 1
        [step] = steps
        assert step in timeline.ROUND_STEPS or step % timedelta(days=30) == timedelta()
        assert len({label for _, label in found}) == len(found), seconds


def test_a_fresh_lock_gets_the_minimum_span_not_milliseconds():
    events = [event("acquired", 0, "a", ttl=30)]
    drawn = timeline.build(events, at(0.028))
    assert drawn.end - drawn.start == timeline.MIN_SPAN
    assert len(drawn.ticks) >= 2
    bar = drawn.bars[0]
    assert bar.x + bar.width <= timeline.WIDTH - timeline.RIGHT_PAD + 0.01


def test_long_owner_labels_are_cut_to_fit_left_of_the_bars():
    owner = "worker-" + "x" * 200
    drawn = timeline.build([event("acquired", 0, owner, ttl=30)], at(10))
    lane = drawn.lanes[0]
    assert lane.owner == owner
    assert len(lane.label) == timeline.LABEL_CHARS
    assert lane.label.endswith("…")
    # 7 px a character at 12 px from x = 8 ends before the plot starts.
    assert 8 + 7 * len(lane.label) <= timeline.LABEL_WIDTH
    short = timeline.build([event("acquired", 0, "w-1", ttl=30)], at(10))
    assert short.lanes[0].label == "w-1"


# -- where the timeline's old rules and the audit page's disagreed: one rule now --


def test_a_stale_lock_force_released_later_ran_out_at_its_expiry():
    """The timeline said "expired", the audit page "force released": it was held
    until its expiry, and the force-release recorded the end."""
    events = [
        event("acquired", 0, "a", ttl=10),
        event("force_released", 50, "a", previous="a", actor="olga"),
    ]
    [span] = derive(events, at(100))
    assert (span.held_until, span.ended_by) == (at(10), "expired")
    assert span.end_id == events[1].id


def test_a_release_stamped_after_the_expiry_ends_at_the_expiry():
    """The old timeline let a release outlast the expiry its holder was promised."""
    events = [
        event("acquired", 0, "a", ttl=10),
        event("released", 12, "a", previous="a"),
    ]
    [span] = derive(events, at(100))
    assert (span.held_until, span.ended_by) == (at(10), "expired")


def test_events_are_ordered_by_id_not_by_a_skewed_clock():
    """Two app instances with clocks 5 s apart: the take-over (inserted second,
    under the row lock) is stamped before the grant it ended."""
    grant = event("acquired", 10, "a", ttl=100, fence=1)
    took = event("force_claimed", 5, "b", ttl=100, previous="a", fence=2)
    spans = derive([took, grant], at(20))
    assert [(s.owner, s.fence) for s in spans] == [("a", 1), ("b", 2)]
    assert spans[0].held_for == timedelta(0)  # cut by the skew, never negative


def test_a_renewal_of_another_fence_shows_a_grant_whose_events_are_missing():
    events = [
        event("acquired", 0, "a", ttl=100, fence=1),
        event("renewed", 30, "b", ttl=100, fence=2),
    ]
    spans = derive(events, at(40))
    assert [(s.owner, s.ended_by, s.grant_id) for s in spans] == [
        ("a", "unrecorded", events[0].id),
        ("b", "held", None),
    ]


def test_holders_at_once_run_side_by_side_in_lanes_of_their_own():
    # A semaphore of 3: a, b and c are holders at once; b releases, a renews,
    # c's holder runs out and d takes it over.
    events = [
        event("acquired", 0, "a", ttl=60, fence=1),
        event("acquired", 5, "b", ttl=60, fence=2),
        event("acquired", 10, "c", ttl=20, fence=3),
        event("released", 20, "b", fence=2),
        event("renewed", 40, "a", ttl=60, fence=1),
        event("took_over", 45, "d", ttl=60, previous="c", fence=4),
    ]
    spans = derive(events, at(50))
    assert [
        (s.owner, s.fence, s.held_from, s.held_until, s.ended_by) for s in spans
    ] == [
        ("a", 1, at(0), at(50), "held"),
        ("b", 2, at(5), at(20), "released"),
        ("c", 3, at(10), at(30), "expired"),
        ("d", 4, at(45), at(50), "held"),
    ]
    drawn = timeline.build(events, at(50))
    assert [lane.owner for lane in drawn.lanes] == ["a", "b", "c", "d"]
    bars = {bar.tenure.owner: bar for bar in drawn.bars}
    assert len({bar.y for bar in bars.values()}) == 4
    # a's bar spans b's and c's: the holders were held at once.
    assert bars["a"].x < bars["b"].x < bars["c"].x
    assert bars["a"].x + bars["a"].width > bars["c"].x + bars["c"].width


def test_one_owner_under_two_tokens_is_two_holders_each_with_its_own_bar():
    # w is two holders of a semaphore of 2, under t-1 and t-2; the t-2
    # holder runs out and c takes it over (naming w, with no token).
    events = [
        event("acquired", 0, "w", ttl=60, fence=1, token="t-1"),
        event("acquired", 5, "w", ttl=10, fence=2, token="t-2"),
        event("took_over", 20, "c", ttl=60, previous="w", fence=3),
        event("released", 30, "w", fence=1, token="t-1"),
    ]
    spans = derive(events, at(40))
    assert [
        (s.owner, s.fence, s.held_from, s.held_until, s.ended_by) for s in spans
    ] == [
        ("w", 1, at(0), at(30), "released"),
        ("w", 2, at(5), at(15), "expired"),
        ("c", 3, at(20), at(40), "held"),
    ]
    # Each holder its own lane, both labelled w, the token in its title; the
    # take-over is marked in c's.
    drawn = timeline.build(events, at(40))
    assert [(lane.owner, lane.token) for lane in drawn.lanes] == [
        ("w", "t-1"),
        ("w", "t-2"),
        ("c", None),
    ]
    bars = {bar.tenure.fence: bar for bar in drawn.bars}
    assert len({bar.y for bar in bars.values()}) == 3
    [marker] = drawn.markers
    assert marker.y == bars[3].y + timeline.BAR_HEIGHT / 2


def test_a_session_bound_grant_ends_with_its_session_not_its_recorded_expiry():
    # a's exclusive grant is bound to session s-1 (its event recorded 15 s);
    # the heartbeats moved it, and wrote nothing. b took it over at 60 s.
    bound = {"session": "s-1"}
    events = [
        replace(event("acquired", 0, "a", ttl=15, fence=1), details=bound),
        event("took_over", 60, "b", ttl=30, previous="a", fence=2),
    ]
    spans = {
        when: [
            (s.owner, s.held_until, s.ended_by)
            for s in derive(events, at(70), sessions=sessions)
        ]
        for when, sessions in (
            ("ended at 40 s", {"s-1": at(40)}),
            ("purged", {}),
        )
    }
    assert spans == {
        "ended at 40 s": [("a", at(40), "expired"), ("b", at(70), "held")],
        "purged": [("a", at(15), "expired_unknown"), ("b", at(70), "held")],
    }
    # A take-over that recorded the expiry it took (migration 0032 on
    # PostgreSQL) ends it then, its session's row there or not.
    took = replace(
        events[1],
        details={
            "previous_token": "",
            "previous_expires_at": at(40).isoformat(timespec="microseconds"),
        },
    )
    for sessions in ({"s-1": at(40)}, {}):
        assert [
            (s.owner, s.held_until, s.ended_by)
            for s in derive([events[0], took], at(70), sessions=sessions)
        ] == [("a", at(40), "expired"), ("b", at(70), "held")]
    # A holder bound to a live session is held, whatever other grants came.
    holders = [
        replace(event("acquired", 0, "a", ttl=15, fence=1), details=bound),
        event("acquired", 20, "c", ttl=60, fence=2),
    ]
    assert [
        (s.owner, s.ended_by)
        for s in derive(holders, at(30), parallel=True, sessions={"s-1": at(45)})
    ] == [("a", "held"), ("c", "held")]


def test_shared_readers_overlap_and_a_release_ends_only_its_own_grant():
    events = [
        event("acquired", 0, "r1", ttl=60, fence=1, mode="shared"),
        event("acquired", 1, "r2", ttl=60, fence=2, mode="shared"),
        event("released", 10, "r1", fence=1, mode="shared"),
        event("renewed", 20, "r2", ttl=60, fence=2, mode="shared"),
    ]
    spans = derive(events, at(30))
    assert [(s.owner, s.ended_by, s.held_until) for s in spans] == [
        ("r1", "released", at(10)),
        ("r2", "held", at(30)),
    ]


def test_a_promotion_ends_the_holders_shared_grant_where_its_exclusive_one_starts():
    events = [
        event("acquired", 0, "r1", ttl=60, fence=1, mode="shared"),
        event("acquired", 1, "r2", ttl=60, fence=2, mode="shared"),
        event("released", 5, "r2", fence=2, mode="shared"),
        event("acquired", 8, "r1", ttl=60, fence=3, mode="exclusive"),
    ]
    spans = derive(events, at(20))
    assert [(s.owner, s.fence, s.held_until, s.ended_by) for s in spans] == [
        ("r1", 1, at(8), "acquired"),
        ("r2", 2, at(5), "released"),
        ("r1", 3, at(20), "held"),
    ]


def test_renewals_of_holders_read_without_their_grants_stay_parallel_when_told():
    # The events read start after both grants: only renewals, which one
    # exclusive holder's history would read as a grant whose events are missing.
    events = [
        event("renewed", 0, "a", ttl=30, fence=1),
        event("renewed", 1, "b", ttl=30, fence=2),
        event("renewed", 10, "a", ttl=30, fence=1),
    ]
    spans = derive(events, at(12), parallel=True)
    assert sorted((s.owner, s.ended_by) for s in spans) == [
        ("a", "held"),
        ("b", "held"),
    ]
    serial = derive(events, at(12), parallel=False)
    assert "unrecorded" in [s.ended_by for s in serial]


def test_one_holder_at_a_time_is_never_read_as_parallel():
    events = [
        event("acquired", 0, "a", ttl=30, fence=1),
        event("released", 10, "a", fence=1),
        event("acquired", 11, "b", ttl=5, fence=2),
        event("took_over", 20, "c", ttl=30, previous="b", fence=3),
        event("force_claimed", 25, "d", ttl=30, previous="c", fence=4),
    ]
    from app.audit.tenures import shows_parallel_holders

    assert not shows_parallel_holders(events)
    assert derive(events, at(30)) == derive(events, at(30), parallel=False)
