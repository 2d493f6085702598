"""Audit queries on every database: filters, keyset pages, tenures, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core import event_pages
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.pagination import encode_cursor
from lockkeeper_core.state import Action
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.audit.service import (
    EventFilter,
    iter_events,
    list_events,
    prune_events,
    tenures,
)
from app.extensions import db

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


# -- how SQLite reads a prefix or a time window ----------------------------------

START = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)


@pytest.fixture
def spread(service, clock):
    """Events of several prefixes (and a name differing only in case) over
    ten minutes, renewals among them."""
    for minute in range(10):
        for n in range(4):
            resource = f"job:{minute % 3}{n}"
            service.acquire(resource, f"w-{n}", ttl=600)
            service.renew(resource, f"w-{n}", ttl=600)
        service.acquire(f"Job:{minute}", "w-9", ttl=30)
        service.acquire(f"jobs:{minute}", "w-9", ttl=30)
        clock.advance(60)
    return service


SPREAD_FILTERS = [
    EventFilter(prefix="job:1"),
    EventFilter(prefix="job:"),
    EventFilter(prefix="jo", actions=("renewed",), except_actions=True),
    EventFilter(since=START + timedelta(minutes=3)),
    EventFilter(since=START + timedelta(minutes=2), until=START + timedelta(minutes=5)),
    EventFilter(until=START + timedelta(minutes=4), owner="w-9"),
    EventFilter(
        prefix="job:2",
        since=START + timedelta(minutes=1),
        until=START + timedelta(minutes=9),
    ),
    EventFilter(since=START + timedelta(hours=1)),
]


@pytest.mark.parametrize("filters", SPREAD_FILTERS)
def test_a_range_read_or_an_id_walk_pages_the_same_events(spread, filters, monkeypatch):
    every = [e for e in iter_events(EventFilter()) if _matches(filters, e)]
    for narrow_below in (1, 10**9):  # always walk the ids; always read the range
        monkeypatch.setattr(event_pages, "NARROW_RANGE", narrow_below)
        assert all_pages(filters, limit=7) == [e.id for e in every]
        assert [e.id for e in iter_events(filters)] == [e.id for e in every]


def _matches(filters: EventFilter, event) -> bool:
    return (
        event.resource.startswith(filters.prefix or "")
        and (filters.owner is None or event.owner == filters.owner)
        and (filters.action is None or event.action.value == filters.action)
        and (
            not filters.actions
            or (event.action.value in filters.actions) != filters.except_actions
        )
        and (filters.since is None or event.occurred_at >= filters.since)
        and (filters.until is None or event.occurred_at < filters.until)
    )


def page_plan(backend, filters: EventFilter) -> tuple[list[str], str]:
    """The statements ``list_events`` sends, and the plan of its page's."""
    statements = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        list_events(filters, limit=5)
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    [(statement, parameters)] = [s for s in statements if "lock_events.details" in s[0]]
    explain = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "
    with db.engine.connect() as conn:
        raw = conn.connection.cursor()
        raw.execute(explain + statement, parameters)
        return [s for s, _ in statements], "\n".join(
            str(line) for line in raw.fetchall()
        )


NARROW_AND_WIDE = [
    (EventFilter(prefix="job:1"), "ix_lock_events_resource_id"),
    (
        EventFilter(since=START, until=START + timedelta(minutes=1)),
        "ix_lock_events_occurred_at",
    ),
]


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(("filters", "index"), NARROW_AND_WIDE)
def test_sqlite_reads_a_narrow_range_and_walks_the_ids_past_a_wide_one(
    backend, spread, filters, index, monkeypatch
):
    _, narrow = page_plan(backend, filters)
    monkeypatch.setattr(event_pages, "NARROW_RANGE", 1)
    _, wide = page_plan(backend, filters)
    assert index in narrow, narrow
    assert "TEMP B-TREE" in narrow, narrow
    # Newest first along the ids (the rowid): nothing to sort.
    assert index not in wide, wide
    assert "TEMP B-TREE" not in wide, wide


@pytest.mark.backends("postgresql", "mariadb")
@pytest.mark.parametrize(("filters", "index"), NARROW_AND_WIDE)
def test_other_planners_get_one_statement_however_wide_the_range(
    backend, spread, filters, index, monkeypatch
):
    # They estimate a range from statistics: nothing is counted first.
    narrow_statements, _ = page_plan(backend, filters)
    monkeypatch.setattr(event_pages, "NARROW_RANGE", 1)
    wide_statements, _ = page_plan(backend, filters)
    assert len(narrow_statements) == 1
    assert narrow_statements == wide_statements


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
    for n in range(3):
        assert service.acquire("sem:q", f"p-{n}", ttl=30, limit=3).acquired
    for n in range(3):
        service.release("sem:q", f"p-{n}")

    def selects(limit: int) -> tuple[int, int]:
        page = list_events(EventFilter(), limit=limit)
        statements = []
        listener = lambda *args: statements.append(args[2])  # noqa: E731
        event.listen(db.engine, "before_cursor_execute", listener)
        try:
            found = tenures(page.items)
        finally:
            event.remove(db.engine, "before_cursor_execute", listener)
        return len(found.started), len(
            [s for s in statements if s.startswith("SELECT")]
        )

    # Two queries whatever the page's length: never one per row.
    assert selects(6) == (3, 2)
    assert selects(66) == (33, 2)


# -- tenures of holders at once ---------------------------------------------------


def test_three_holders_at_once_each_keep_their_own_tenure(service, clock):
    """Each holder's grant ends its own holder's tenure only: before, the next
    grant on the resource ended the one before it, so p-1 was 'held for 5 s
    until acquired' while it held on for 30."""
    for owner in ("p-1", "p-2", "p-3"):
        assert service.acquire("sem:3", owner, ttl=60, limit=3).acquired
        clock.advance(5)  # granted at 0, 5 and 10 s
    clock.advance(5)
    service.release("sem:3", "p-2")  # at 20 s
    clock.advance(10)
    service.renew("sem:3", "p-3", ttl=60)  # at 30 s
    service.release("sem:3", "p-1")  # at 30 s
    clock.advance(15)
    service.release("sem:3", "p-3")  # at 45 s
    page = list_events(EventFilter(resource="sem:3"))
    found = tenures(page.items)
    grants = {e.owner: e for e in by_action(page, Action.ACQUIRED)}
    releases = {e.owner: e for e in by_action(page, Action.RELEASED)}
    held = {
        owner: (found.started[grant.id].held_for, found.started[grant.id].ended_by)
        for owner, grant in grants.items()
    }
    assert held == {
        "p-1": (timedelta(seconds=30), "released"),
        "p-2": (timedelta(seconds=15), "released"),
        "p-3": (timedelta(seconds=35), "released"),
    }
    for owner, release in releases.items():
        assert found.ended[release.id] == found.started[grants[owner].id]


def test_a_holder_taken_over_ends_only_the_holder_that_ran_out(service, clock):
    assert service.acquire("sem:2", "p-1", ttl=10, limit=2).acquired
    assert service.acquire("sem:2", "p-2", ttl=60, limit=2).acquired
    clock.advance(15)
    taken = service.acquire("sem:2", "p-3", ttl=60, limit=2)
    assert taken.action is Action.TOOK_OVER
    clock.advance(5)
    service.release("sem:2", "p-2")
    page = list_events(EventFilter(resource="sem:2"))
    found = tenures(page.items)
    first, second = by_action(page, Action.ACQUIRED)[::-1]
    (took_over,) = by_action(page, Action.TOOK_OVER)
    assert found.started[first.id].held_for == timedelta(seconds=10)
    assert found.started[first.id].ended_by == "expired"
    assert found.ended[took_over.id] == found.started[first.id]
    assert found.started[second.id].held_for == timedelta(seconds=20)
    assert found.started[second.id].ended_by == "released"
    assert took_over.id not in found.started  # p-3 is still a holder


def test_one_owner_under_two_tokens_is_two_holders_with_a_tenure_each(service, clock):
    """The holder is (token, owner): w's holder under t-2 is not a re-grant of
    its holder under t-1 (it ended it: "held for 5 s until acquired" while it
    is still held), and a take-over of the t-2 holder that ran out, naming w,
    ends only that one."""
    assert service.acquire("sem:tok", "w", ttl=60, limit=2, token="t-1").acquired
    clock.advance(5)
    assert service.acquire("sem:tok", "w", ttl=10, limit=2, token="t-2").acquired
    clock.advance(15)  # the t-2 holder ran out at 15 s
    assert service.acquire("sem:tok", "c", ttl=60, limit=2).action is Action.TOOK_OVER
    clock.advance(10)
    page = list_events(EventFilter(resource="sem:tok"))
    found = tenures(page.items)
    first, second = by_action(page, Action.ACQUIRED)[::-1]
    (took_over,) = by_action(page, Action.TOOK_OVER)
    assert took_over.previous_owner == "w"
    assert first.id not in found.started  # w still holds its t-1 holder
    ran_out = found.started[second.id]
    assert (ran_out.held_for, ran_out.ended_by) == (timedelta(seconds=10), "expired")
    assert found.ended == {took_over.id: ran_out}
    # Released, it was held for 30 s by either reading.
    service.release("sem:tok", "w", token="t-1")
    page = list_events(EventFilter(resource="sem:tok"))
    released = tenures(page.items).started[first.id]
    assert (released.held_for, released.ended_by) == (timedelta(seconds=30), "released")


def test_shared_grants_and_a_promotion_keep_their_holders_tenures(service, clock):
    assert service.acquire("rw:t", "r-1", ttl=60, mode="shared").acquired
    clock.advance(4)
    assert service.acquire("rw:t", "r-2", ttl=60, mode="shared").acquired
    clock.advance(6)
    service.release("rw:t", "r-2")  # at 10 s
    clock.advance(2)
    assert service.acquire("rw:t", "r-1", ttl=60).acquired  # promoted at 12 s
    clock.advance(3)
    service.release("rw:t", "r-1")  # at 15 s
    page = list_events(EventFilter(resource="rw:t"))
    found = tenures(page.items)
    shared_1, shared_2, exclusive = by_action(page, Action.ACQUIRED)[::-1]
    assert found.started[shared_1.id].held_for == timedelta(seconds=12)
    assert found.started[shared_1.id].ended_by == "acquired"
    assert found.started[shared_2.id].held_for == timedelta(seconds=6)
    assert found.started[exclusive.id].held_for == timedelta(seconds=3)
    # A promotion names no previous owner: it recorded no end.
    assert found.started[shared_1.id].end_id is None


def test_the_audit_page_and_the_timeline_derive_the_same_parallel_tenures(
    service, clock
):
    from app.audit.tenures import derive

    fences = {}
    for owner, ttl in (("p-1", 20), ("p-2", 60), ("p-3", 60)):
        fences[owner] = service.acquire("sem:x", owner, ttl=ttl, limit=3).lock.fence
        clock.advance(3)
    service.renew("sem:x", "p-2", ttl=60)
    clock.advance(30)  # p-1 ran out
    taken = service.acquire("sem:x", "p-4", ttl=60, limit=3)
    assert taken.action is Action.TOOK_OVER
    service.force_release_holder("sem:x", fences["p-2"], actor="al", reason="stuck")
    clock.advance(2)
    service.release("sem:x", "p-3")
    assert service.acquire("sem:x", "p-5", ttl=5, limit=3).acquired
    clock.advance(10)  # p-5 ran out; no event of its own ends it
    assert service.acquire("sem:x", "p-6", ttl=60, limit=3).action is Action.ACQUIRED
    page = list_events(EventFilter(resource="sem:x"))
    found = tenures(page.items)
    timeline = [t for t in derive(page.items, service.now()) if t.ended_by != "held"]
    assert [(t.owner, t.ended_by) for t in timeline] == [
        ("p-1", "expired"),
        ("p-2", "force_released"),
        ("p-3", "released"),
        ("p-5", "expired"),
    ]
    assert sorted(found.started.values(), key=lambda t: t.grant_id) == sorted(
        timeline, key=lambda t: t.grant_id
    )
    assert {t.end_id: t for t in timeline if t.end_id is not None} == found.ended


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
