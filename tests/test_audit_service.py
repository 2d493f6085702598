"""Audit queries on every database: filters, keyset pages, tenures, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.audit.service import (
    EventFilter,
    iter_events,
    list_events,
    prune_events,
    tenures,
)
from app.locks.errors import InvalidInput
from app.locks.pagination import encode_cursor
from app.locks.state import Action

pytestmark = pytest.mark.usefixtures("backend")


def ids(page) -> list[int]:
    return [e.id for e in page.items]


def all_pages(filters: EventFilter, limit: int) -> list[int]:
    seen, cursor = [], None
    while True:
        page = list_events(filters, limit=limit, cursor=cursor)
        seen.extend(ids(page))
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


@pytest.fixture
def history(service, clock):
    """A small history across resources, owners, actors and times."""
    service.acquire("job:1", "w-1", ttl=30, actor="tok-a")  # 09:00:00
    service.acquire("job:2", "w-2", ttl=30, actor="tok-b")
    clock.advance(10)
    service.renew("job:1", "w-1", ttl=30, actor="tok-a")  # 09:00:10
    service.release("job:2", "w-2", actor="tok-b")
    clock.advance(10)
    service.acquire("job_x", "w-3", ttl=30, actor="tok-a")  # 09:00:20
    service.acquire("jobs:9", "w-3", ttl=30, actor="tok-a")
    service.force_release("job:1", actor="alice", reason="stuck, rebooting")
    return service


def test_events_are_listed_newest_first(history):
    page = list_events(EventFilter(), limit=50)
    assert ids(page) == sorted(ids(page), reverse=True)
    assert len(page.items) == 7
    assert page.next_cursor is None


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (
            EventFilter(resource="job:1"),
            "job:1 force_released, job:1 renewed, job:1 acquired",
        ),
        (EventFilter(owner="w-2"), "job:2 released, job:2 acquired"),
        (
            EventFilter(action="acquired"),
            "jobs:9 acquired, job_x acquired, job:2 acquired, job:1 acquired",
        ),
        (EventFilter(actor="alice"), "job:1 force_released"),
        (
            EventFilter(prefix="job:"),
            "job:1 force_released, job:2 released, job:1 renewed, job:2 acquired,"
            " job:1 acquired",
        ),
        (
            EventFilter(owner="w-3", action="acquired", actor="tok-a"),
            "jobs:9 acquired, job_x acquired",
        ),
    ],
)
def test_each_filter_returns_exactly_its_events(history, filters, expected):
    page = list_events(filters, limit=50)
    assert ", ".join(f"{e.resource} {e.action}" for e in page.items) == expected


def test_prefix_wildcard_characters_match_literally(history):
    # "_" and "%" are LIKE wildcards: unescaped, "job_" would match "job:1" too.
    assert [e.resource for e in list_events(EventFilter(prefix="job_")).items] == [
        "job_x"
    ]
    assert list_events(EventFilter(prefix="job%")).items == []
    assert list_events(EventFilter(prefix="%")).items == []


def test_prefix_match_is_case_sensitive_like_resources(history):
    assert list_events(EventFilter(prefix="JOB")).items == []
    assert list_events(EventFilter(prefix="Job:1")).items == []


def test_time_range_includes_since_and_excludes_until(history, clock):
    start = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)
    window = EventFilter(
        since=start + timedelta(seconds=10), until=start + timedelta(seconds=20)
    )
    assert [e.action.value for e in list_events(window).items] == [
        "released",
        "renewed",
    ]
    assert all(
        e.occurred_at >= start + timedelta(seconds=20)
        for e in list_events(EventFilter(since=start + timedelta(seconds=20))).items
    )


def test_pagination_over_ties_in_occurred_at_has_no_gaps_or_repeats(service):
    # Every event at the same instant: only the id can order them.
    for n in range(23):
        service.acquire(f"tie:{n}", "w-1", ttl=30)
    every = ids(list_events(EventFilter(), limit=500))
    assert len(every) == 23
    assert all_pages(EventFilter(), limit=5) == every
    assert all_pages(EventFilter(prefix="tie:1"), limit=2) == [
        e for e in every if e in ids(list_events(EventFilter(prefix="tie:1")))
    ]


def test_cursor_pages_stay_within_the_filter(history):
    pages = all_pages(EventFilter(prefix="job:"), limit=2)
    assert pages == ids(list_events(EventFilter(prefix="job:"), limit=50))


def test_iter_events_streams_the_same_rows_as_the_pages(history):
    filters = EventFilter(prefix="job")
    assert [e.id for e in iter_events(filters, batch=2)] == all_pages(filters, 3)


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        (EventFilter(resource="bad resource"), "resource"),
        (EventFilter(owner="x\x00"), "owner"),
        (EventFilter(action="stolen"), "action"),
        (EventFilter(prefix="p" * 256), "prefix"),
        (EventFilter(since=datetime(2026, 1, 1)), "since"),  # noqa: DTZ001
        (
            EventFilter(
                since=datetime(2026, 2, 1, tzinfo=UTC),
                until=datetime(2026, 1, 1, tzinfo=UTC),
            ),
            "until",
        ),
    ],
)
def test_bad_filters_are_refused_with_the_field_named(service, filters, field):
    with pytest.raises(InvalidInput) as caught:
        list_events(filters)
    assert field in [f for f, _ in caught.value.errors]


@pytest.mark.parametrize("position", [0, -1, 10**30, 2**63, True, "7", None])
def test_foreign_cursor_is_refused(service, position):
    for cursor in ("not-a-cursor", encode_cursor({"id": position})):
        with pytest.raises(InvalidInput):
            list_events(EventFilter(), cursor=cursor)


def test_owner_and_actor_filters_are_exact_about_trailing_spaces(service):
    service.acquire("job:1", "w-1 ", actor="tok ")
    assert list_events(EventFilter(owner="w-1")).items == []
    assert list_events(EventFilter(actor="tok")).items == []
    assert len(list_events(EventFilter(owner="w-1 ", actor="tok ")).items) == 1


# -- tenures --------------------------------------------------------------------


def by_action(page, action: Action):
    return [e for e in page.items if e.action is action]


def test_release_ends_the_tenure_of_its_grant(service, clock):
    service.acquire("job:1", "w-1", ttl=60)
    clock.advance(20)
    service.renew("job:1", "w-1", ttl=60)
    clock.advance(25)
    service.release("job:1", "w-1")
    page = list_events(EventFilter(resource="job:1"))
    found = tenures(page.items)
    (grant,) = by_action(page, Action.ACQUIRED)
    (release,) = by_action(page, Action.RELEASED)
    assert found.started[grant.id].held_for == timedelta(seconds=45)
    assert found.started[grant.id].ended_by == "released"
    assert found.ended[release.id] == found.started[grant.id]
    assert set(found.started) == {grant.id}


def test_take_over_ends_the_old_tenure_when_it_expired(service, clock):
    service.acquire("job:1", "w-1", ttl=30)
    clock.advance(100)
    service.acquire("job:1", "w-2", ttl=30)  # took_over
    page = list_events(EventFilter(resource="job:1"))
    found = tenures(page.items)
    (first,) = by_action(page, Action.ACQUIRED)
    (took_over,) = by_action(page, Action.TOOK_OVER)
    # Held until it expired, not until the take-over 70 s later.
    assert found.started[first.id].held_for == timedelta(seconds=30)
    assert found.ended[took_over.id].grant_id == first.id
    assert found.ended[took_over.id].ended_by == "expired"
    assert took_over.id not in found.started  # w-2 still holds it


def test_force_claim_and_force_release_end_tenures(service, clock):
    service.acquire("job:1", "w-1", ttl=300)
    clock.advance(5)
    service.claim("job:1", "op", ttl=300, actor="alice", reason="hung", force=True)
    clock.advance(7)
    service.force_release("job:1", actor="alice", reason="done")
    page = list_events(EventFilter(resource="job:1"))
    found = tenures(page.items)
    (grant,) = by_action(page, Action.ACQUIRED)
    (claim,) = by_action(page, Action.FORCE_CLAIMED)
    assert found.started[grant.id].held_for == timedelta(seconds=5)
    assert found.started[claim.id].held_for == timedelta(seconds=7)
    assert found.started[claim.id].ended_by == "force_released"


def test_reacquire_continues_the_tenure(service, clock):
    service.acquire("job:1", "w-1", ttl=30)
    clock.advance(10)
    service.acquire("job:1", "w-1", ttl=30)  # reacquired: same grant
    clock.advance(10)
    service.release("job:1", "w-1")
    page = list_events(EventFilter(resource="job:1"))
    (grant,) = by_action(page, Action.ACQUIRED)
    assert tenures(page.items).started[grant.id].held_for == timedelta(seconds=20)


def test_purged_tenure_ends_at_its_expiry_without_an_ending_event(service, clock):
    service.acquire("job:1", "w-1", ttl=30)
    clock.advance(3600)
    service.purge_stale(timedelta(minutes=5))
    service.acquire("job:1", "w-2", ttl=30)  # finds no row: "acquired"
    page = list_events(EventFilter(resource="job:1"))
    found = tenures(page.items)
    first = page.items[-1]
    assert found.started[first.id].held_for == timedelta(seconds=30)
    assert found.started[first.id].ended_by == "expired"
    assert found.started[first.id].end_id is None
    assert found.ended == {}


def test_a_stale_lock_force_released_later_was_held_until_it_expired(service, clock):
    """The audit page said "until force released", the timeline "expired": the
    holder had it until its expiry; the force-release recorded the end."""
    service.acquire("job:1", "w-1", ttl=30)
    clock.advance(100)
    service.force_release("job:1", actor="alice", reason="stale")
    page = list_events(EventFilter(resource="job:1"))
    found = tenures(page.items)
    (grant,) = by_action(page, Action.ACQUIRED)
    (forced,) = by_action(page, Action.FORCE_RELEASED)
    assert found.started[grant.id].ended_by == "expired"
    assert found.started[grant.id].held_for == timedelta(seconds=30)
    assert found.ended[forced.id] == found.started[grant.id]


def test_the_audit_page_and_the_timeline_derive_the_same_tenures(service, clock):
    from app.audit.tenures import derive

    service.acquire("job:1", "w-1", ttl=30)
    clock.advance(10)
    service.renew("job:1", "w-1", ttl=30)
    clock.advance(100)
    service.acquire("job:1", "w-2", ttl=30)  # took over a stale lock
    clock.advance(5)
    service.claim("job:1", "op", ttl=300, actor="alice", reason="hung", force=True)
    clock.advance(7)
    service.force_release("job:1", actor="alice", reason="done")
    service.acquire("job:1", "w-3", ttl=30)
    clock.advance(3)
    service.release("job:1", "w-3")
    page = list_events(EventFilter(resource="job:1"))
    found = tenures(page.items)
    timeline = derive(page.items, service.now())
    assert [t.ended_by for t in timeline] == [
        "expired",
        "force_claimed",
        "force_released",
        "released",
    ]
    assert sorted(found.started.values(), key=lambda t: t.grant_id) == timeline


def test_tenures_of_a_page_take_a_fixed_number_of_queries(service, clock, fake_app):
    from sqlalchemy import event

    from app.extensions import db

    for n in range(30):
        service.acquire(f"job:{n}", "w-1", ttl=30)
        service.release(f"job:{n}", "w-1")
    page = list_events(EventFilter(), limit=60)
    statements = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731
    event.listen(db.engine, "before_cursor_execute", listener)
    try:
        found = tenures(page.items)
    finally:
        event.remove(db.engine, "before_cursor_execute", listener)
    assert len(found.started) == 30
    assert len([s for s in statements if s.startswith("SELECT")]) == 3


# -- retention ------------------------------------------------------------------


def test_prune_deletes_only_events_older_than_the_cutoff(service, clock):
    for n in range(7):
        service.acquire(f"old:{n}", "w-1", ttl=30)
    clock.advance(91 * 86400)
    service.acquire("new:1", "w-1", ttl=30)
    assert prune_events(timedelta(days=90), batch=3) == 7
    assert [e.resource for e in iter_events()] == ["new:1"]
    assert prune_events(timedelta(days=90)) == 0


def test_prune_and_purge_never_lower_the_next_fence(service, clock):
    first = service.acquire("job:1", "w-1", ttl=30).lock.fence
    clock.advance(100 * 86400)
    assert service.purge_stale(timedelta(days=7)) == ["job:1"]
    assert prune_events(timedelta(days=90)) == 1
    assert list(iter_events()) == []
    again = service.acquire("job:1", "w-2", ttl=30).lock.fence
    assert again > first


def test_negative_retention_is_refused(service):
    with pytest.raises(InvalidInput):
        prune_events(timedelta(days=-1))
