"""More than one holder: semaphores and shared grants, every rule on a fake
clock, on every database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core.errors import (
    InvalidInput,
    LimitMismatch,
    LockHeld,
    LockNotFound,
    QuotaExceeded,
    ResourceFrozen,
    TokenEnded,
)
from lockkeeper_core.models import DistributedLock, LockEvent, LockHolder
from lockkeeper_core.state import Action, LockState
from sqlalchemy import select, update

from app.auth.models import ApiToken
from app.extensions import db
from tests.conftest import ApiClient

pytestmark = pytest.mark.usefixtures("backend")


def events_of(resource: str) -> list[LockEvent]:
    db.session.rollback()  # no snapshot of an earlier read (SQLite)
    return list(
        db.session.scalars(
            select(LockEvent)
            .where(LockEvent.resource == resource)
            .order_by(LockEvent.id)
        )
    )


def holders_of(resource: str) -> list[LockHolder]:
    db.session.rollback()
    return list(
        db.session.scalars(
            select(LockHolder)
            .where(LockHolder.resource == resource)
            .order_by(LockHolder.fence)
        )
    )


def test_a_semaphore_grants_limit_holders_each_with_its_own_fence(service):
    grants = [service.acquire("sem:1", f"w-{i}", ttl=30, limit=3) for i in range(3)]
    assert all(g.acquired for g in grants)
    fences = [g.lock.fence for g in grants]
    assert fences == sorted(set(fences))
    assert [g.lock.holders for g in grants] == [1, 2, 3]
    assert {(g.lock.limit, g.lock.mode) for g in grants} == {(3, "exclusive")}
    refused = service.acquire("sem:1", "w-3", ttl=30, limit=3)
    assert not refused.acquired
    assert refused.lock.owner == "w-0"  # the live grant that ends first
    events = events_of("sem:1")
    assert [e.action for e in events] == ["acquired"] * 3
    assert {e.mode for e in events} == {"exclusive"}


def test_the_refusal_names_the_grant_that_ends_first(service, clock):
    service.acquire("sem:first", "long", ttl=60, limit=2)
    service.acquire("sem:first", "short", ttl=10, limit=2)
    refused = service.acquire("sem:first", "late", ttl=30, limit=2)
    assert (refused.lock.owner, refused.lock.ttl_remaining) == ("short", 10)


def test_a_same_holder_reacquire_keeps_its_fence(service, clock):
    first = service.acquire("sem:re", "w-1", ttl=10, limit=2)
    clock.advance(5)
    again = service.acquire("sem:re", "w-1", ttl=30, limit=2)
    assert again.action is Action.REACQUIRED
    assert again.lock.fence == first.lock.fence
    assert again.lock.ttl_remaining == 30
    assert len(holders_of("sem:re")) == 1


def test_renew_and_release_act_on_the_callers_own_holder(service, clock):
    a = service.acquire("sem:rr", "a", ttl=10, limit=2).lock
    b = service.acquire("sem:rr", "b", ttl=10, limit=2).lock
    renewed = service.renew("sem:rr", "b", ttl=40)
    assert (renewed.fence, renewed.ttl_remaining) == (b.fence, 40)
    released = service.release("sem:rr", "a")
    assert released.fence == a.fence
    assert [p.owner for p in holders_of("sem:rr")] == ["b"]
    with pytest.raises(LockNotFound):
        service.release("sem:rr", "a")
    with pytest.raises(LockNotFound):
        service.renew("sem:rr", "nobody")
    assert [e.action for e in events_of("sem:rr")][-2:] == ["renewed", "released"]


def test_an_expired_holder_is_taken_over_naming_its_owner(service, clock):
    service.acquire("sem:tk", "old", ttl=5, limit=1 + 1)
    service.acquire("sem:tk", "live", ttl=60, limit=2)
    clock.advance(6)
    taken = service.acquire("sem:tk", "new", ttl=30, limit=2)
    assert taken.acquired
    assert taken.action is Action.TOOK_OVER
    last = events_of("sem:tk")[-1]
    assert (last.action, last.previous_owner) == ("took_over", "old")
    assert sorted(p.owner for p in holders_of("sem:tk")) == ["live", "new"]


def test_another_limit_is_a_mismatch_while_in_use(service, clock):
    service.acquire("sem:mm", "a", ttl=10, limit=4)
    with pytest.raises(LimitMismatch) as raised:
        service.acquire("sem:mm", "b", ttl=10, limit=5)
    assert raised.value.limit == 4
    with pytest.raises(LimitMismatch):
        service.acquire("sem:mm", "b", ttl=10, mode="shared")
    with pytest.raises(LimitMismatch):
        service.acquire("sem:mm", "b", ttl=10)  # exclusive, limit 1
    # Once free, the next grant sets the limit.
    clock.advance(11)
    assert service.acquire("sem:mm", "b", ttl=10, limit=5).lock.limit == 5


def test_an_exclusive_lock_refuses_a_semaphore_acquire(service):
    service.acquire("x:mm", "a", ttl=10)
    with pytest.raises(LimitMismatch) as raised:
        service.acquire("x:mm", "b", ttl=10, limit=3)
    assert raised.value.limit == 1


def test_shared_grants_coexist_and_exclude_an_exclusive_one(service, clock):
    r1 = service.acquire("rw:1", "r1", ttl=10, mode="shared")
    r2 = service.acquire("rw:1", "r2", ttl=20, mode="shared")
    assert r1.acquired
    assert r2.acquired
    assert r2.lock.holders == 2
    assert r2.lock.mode == "shared"
    writer = service.acquire("rw:1", "w", ttl=10)
    assert not writer.acquired
    assert writer.lock.owner == "r1"
    service.release("rw:1", "r1")
    service.release("rw:1", "r2")
    assert service.acquire("rw:1", "w", ttl=10).acquired
    assert not service.acquire("rw:1", "r3", ttl=10, mode="shared").acquired
    assert [e.mode for e in events_of("rw:1")] == [
        "shared",
        "shared",
        "shared",
        "shared",
        "exclusive",
    ]


def test_an_exclusive_grant_waits_out_expired_shared_grants(service, clock):
    service.acquire("rw:exp", "r1", ttl=5, mode="shared")
    clock.advance(6)
    assert service.acquire("rw:exp", "w", ttl=10).acquired
    assert service.get("rw:exp").owner == "w"


def test_promote_only_as_the_sole_holder_with_a_new_fence(service):
    r1 = service.acquire("rw:p", "r1", ttl=10, mode="shared").lock
    service.acquire("rw:p", "r2", ttl=10, mode="shared")
    refused = service.acquire("rw:p", "r1", ttl=10)
    assert not refused.acquired
    assert refused.lock.owner == "r2"
    assert [p.owner for p in holders_of("rw:p")] == ["r1", "r2"]  # kept
    service.release("rw:p", "r2")
    promoted = service.acquire("rw:p", "r1", ttl=10)
    assert promoted.acquired
    assert promoted.lock.mode == "exclusive"
    assert promoted.lock.fence > r1.fence
    assert holders_of("rw:p") == []
    assert service.get("rw:p").owner == "r1"


def test_demote_always_keeps_the_fence(service):
    w = service.acquire("rw:d", "w", ttl=10).lock
    demoted = service.acquire("rw:d", "w", ttl=10, mode="shared")
    assert demoted.acquired
    assert demoted.lock.mode == "shared"
    assert demoted.lock.fence == w.fence
    assert service.acquire("rw:d", "r", ttl=10, mode="shared").acquired
    db.session.rollback()
    row = db.session.scalar(
        select(DistributedLock).where(DistributedLock.resource == "rw:d")
    )
    assert row.owner is None
    assert row.places_until is not None


def test_the_quota_counts_holders(service):
    service.acquire("q:x", "w", ttl=10, token="q", max_locks=2)
    service.acquire("q:sem", "w", ttl=10, token="q", max_locks=2, limit=3)
    with pytest.raises(QuotaExceeded):
        service.acquire("q:sem", "w2", ttl=10, token="q", max_locks=2, limit=3)
    with pytest.raises(QuotaExceeded):
        service.acquire("q:y", "w", ttl=10, token="q", max_locks=2)
    # A re-acquire of a holder it holds is no new grant.
    assert service.acquire(
        "q:sem", "w", ttl=10, token="q", max_locks=2, limit=3
    ).acquired


def test_a_freeze_refuses_a_new_holder(service):
    service.acquire("frz:sem", "a", ttl=10, limit=2)
    service.freeze("frz:", actor="op", reason="maintenance")
    with pytest.raises(ResourceFrozen):
        service.acquire("frz:sem", "b", ttl=10, limit=2)
    with pytest.raises(ResourceFrozen):
        service.acquire("frz:rw", "b", ttl=10, mode="shared")
    # Renewals of grants already made go on.
    assert service.renew("frz:sem", "a", ttl=10).owner == "a"


def test_a_revoked_token_is_refused_at_the_place_grant(fake_app, service):
    ApiClient(fake_app, "gone")
    db.session.execute(
        update(ApiToken)
        .where(ApiToken.name == "gone")
        .values(revoked_at=datetime.now(UTC))
    )
    db.session.commit()
    with pytest.raises(TokenEnded):
        service.acquire("tok:sem", "w", ttl=10, token="gone", limit=2)
    assert holders_of("tok:sem") == []


def rows_of(resource: str) -> list[DistributedLock]:
    db.session.rollback()
    return list(
        db.session.scalars(
            select(DistributedLock).where(DistributedLock.resource == resource)
        )
    )


@pytest.mark.parametrize(
    "shape", [{"mode": "shared"}, {"limit": 3}], ids=["shared", "semaphore"]
)
def test_a_refused_holder_of_a_new_resource_writes_nothing(fake_app, service, shape):
    # Over its quota (429), frozen (423), its token ended: no row, no holder,
    # no event, for a resource that had none (the holders path inserted a free
    # row before it decided).
    service.acquire("full:x", "w", ttl=10, token="q", max_locks=1)
    with pytest.raises(QuotaExceeded):
        service.acquire("new:quota", "w", ttl=10, token="q", max_locks=1, **shape)
    service.freeze("new:froz", actor="op", reason="maintenance")
    with pytest.raises(ResourceFrozen):
        service.acquire("new:frozen", "w", ttl=10, **shape)
    ApiClient(fake_app, "ended")
    db.session.execute(
        update(ApiToken)
        .where(ApiToken.name == "ended")
        .values(revoked_at=datetime.now(UTC))
    )
    db.session.commit()
    with pytest.raises(TokenEnded):
        service.acquire("new:ended", "w", ttl=10, token="ended", **shape)
    for resource in ("new:quota", "new:frozen", "new:ended"):
        assert rows_of(resource) == []
        assert holders_of(resource) == []
        assert events_of(resource) == []
    # The first grant writes the row with its holder.
    granted = service.acquire("new:quota", "w", ttl=10, token="q2", **shape)
    assert granted.acquired
    assert [row.owner for row in rows_of("new:quota")] == [None]
    assert [holder_row.owner for holder_row in holders_of("new:quota")] == ["w"]


def test_holders_of_another_token_are_other_holders(service):
    service.acquire("tk:sem", "w", ttl=10, token="t1", limit=2)
    other = service.acquire("tk:sem", "w", ttl=10, token="t2", limit=2)
    assert other.acquired
    assert other.action is Action.ACQUIRED
    with pytest.raises(LockNotFound):
        service.release("tk:sem", "w", token="t3")


@pytest.mark.parametrize(
    ("limit", "mode", "field"),
    [
        (0, "exclusive", "limit"),
        (1001, "exclusive", "limit"),
        (True, "exclusive", "limit"),
        (2, "shared", "mode"),
        (1, "read", "mode"),
    ],
)
def test_bad_limit_or_mode_is_bad_input(service, limit, mode, field):
    with pytest.raises(InvalidInput) as raised:
        service.acquire("bad:1", "w", ttl=10, limit=limit, mode=mode)
    assert [f for f, _ in raised.value.errors] == [field]


def test_a_claim_never_coexists_with_holders(service):
    service.acquire("op:rw", "r1", ttl=30, mode="shared")
    for force in (False, True):
        with pytest.raises(LockHeld) as raised:
            service.claim("op:rw", "op", ttl=30, actor="alice", reason="x", force=force)
        assert raised.value.holder.owner == "r1"


def test_purge_keeps_a_row_held_by_holders(service, clock):
    service.acquire("pg:sem", "a", ttl=600, limit=2)
    service.acquire("pg:old", "b", ttl=5, limit=2)
    clock.advance(120)
    service.purge_stale(timedelta(minutes=1))
    assert [p.owner for p in holders_of("pg:sem")] == ["a"]
    assert holders_of("pg:old") == []
    # The exclusive path still sees the live holder.
    with pytest.raises(LimitMismatch):
        service.acquire("pg:sem", "x", ttl=5)


def test_a_session_bound_acquire_is_refused_by_shared_holders(service):
    service.acquire("ss:rw", "r1", ttl=30, mode="shared", token="t")
    session = service.sessions.create("w", 30, token="t")
    refused = service.acquire("ss:rw", "w", session=session.id, token="t")
    assert not refused.acquired
    assert refused.lock.owner == "r1"


# -- listing and counting holders ------------------------------------------------


def hold_holders(service, clock):
    """A semaphore of 3 with 2 holders, a shared lock with 2 readers and one
    exclusive lock; the exclusive one ends first, then the readers, then the
    semaphore's holders."""
    assert service.acquire("job:solo", "w-9:1", ttl=20, token="ci").acquired
    for owner, ttl in (("host-a:1", 60), ("host-b:2", 90)):
        assert service.acquire("sem:pool", owner, ttl=ttl, limit=3, token="ci").acquired
    for owner in ("reader-1", "reader-2"):
        assert service.acquire("rw:cfg", owner, ttl=40, mode="shared").acquired
    clock.advance(1)


def test_every_live_grant_is_an_entry_of_the_grant_list(service, clock):
    hold_holders(service, clock)
    listed = service.list_locks(entries="grants").items
    assert [(lock.resource, lock.owner) for lock in listed] == [
        ("job:solo", "w-9:1"),
        ("rw:cfg", "reader-1"),
        ("rw:cfg", "reader-2"),
        ("sem:pool", "host-a:1"),
        ("sem:pool", "host-b:2"),
    ]
    by_owner = {lock.owner: lock for lock in listed}
    pool = by_owner["host-b:2"]
    assert (pool.limit, pool.mode, pool.holders, pool.token) == (
        3,
        "exclusive",
        2,
        "ci",
    )
    assert round(pool.ttl_remaining) == 89
    reader = by_owner["reader-1"]
    assert (reader.mode, reader.holders, reader.limit) == ("shared", 2, 1)
    assert by_owner["w-9:1"].holders == 1
    # Each grant its own fence: the entries are the holders' own.
    assert {lock.fence for lock in listed if lock.resource == "sem:pool"} == {
        grant.fence for grant in service.holders("sem:pool").holders
    }


@pytest.mark.parametrize(
    "sort",
    ["resource", "-resource", "natural", "owner", "-expires", "urgent", "waiters"],
)
def test_pages_of_one_list_every_grant_exactly_once(service, clock, sort):
    hold_holders(service, clock)
    seen, cursor = [], None
    while True:
        page = service.list_locks(entries="grants", limit=1, cursor=cursor, sort=sort)
        seen += [(lock.resource, lock.fence) for lock in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    every = service.list_locks(entries="grants", sort=sort).items
    assert seen == [(lock.resource, lock.fence) for lock in every]
    assert len(set(seen)) == 5


def test_a_resource_held_by_holders_is_one_entry_of_the_resource_list(service, clock):
    hold_holders(service, clock)
    listed = service.list_locks(entries="resources", sort="urgent").items
    # Its grant that ends first stands for it.
    assert [(lock.resource, lock.owner, lock.holders) for lock in listed] == [
        ("job:solo", "w-9:1", 1),
        ("rw:cfg", "reader-1", 2),
        ("sem:pool", "host-a:1", 2),
    ]
    # A search finds it by any of its holders' owners.
    found = service.list_locks(entries="resources", owner_contains="HOST-B")
    assert [(lock.resource, lock.owner) for lock in found.items] == [
        ("sem:pool", "host-a:1")
    ]
    assert service.count_locks(owner_contains="host-b") == 1
    assert service.count_locks(prefix="sem:", state="held") == 1


def test_holders_count_in_every_counter_and_group(service, clock):
    hold_holders(service, clock)
    clock.advance(10)  # job:solo expiring
    assert service.counts() == {
        LockState.HELD: 2,
        LockState.EXPIRING: 1,
        LockState.STALE: 0,
    }
    assert service.counts(owner_contains="reader-2") == {
        LockState.HELD: 1,
        LockState.EXPIRING: 0,
        LockState.STALE: 0,
    }
    owners = {g.name: (g.held, g.expiring, g.stale) for g in service.owner_counts()}
    assert owners == {
        "w-9:1": (0, 1, 0),
        "host-a:1": (1, 0, 0),
        "host-b:2": (1, 0, 0),
        "reader-1": (1, 0, 0),
        "reader-2": (1, 0, 0),
    }
    prefixes = {g.name: g.total for g in service.prefix_counts()}
    assert prefixes == {"job:": 1, "rw:": 1, "sem:": 1}
    clock.advance(45)  # the readers' grants ended: rw:cfg is free
    assert [
        lock.resource for lock in service.list_locks(entries="resources").items
    ] == [
        "job:solo",
        "sem:pool",
    ]
    assert sum(service.counts().values()) == 2


def test_a_session_bound_holder_names_its_session(fake_app, service, clock):
    api = ApiClient(fake_app)
    session = api.post("/api/v1/sessions", json={"owner": "w-7", "ttl": 15}).get_json()
    bound = api.post(
        "/api/v1/locks/sem:s",
        json={"owner": "w-7", "session": session["id"], "limit": 2},
    )
    assert bound.status_code == 200, bound.get_json()
    assert service.acquire("sem:s", "w-8", ttl=30, limit=2).acquired
    sessions = {
        lock.owner: lock.session for lock in service.list_locks(entries="grants").items
    }
    assert sessions == {"w-7": session["id"], "w-8": None}
    held = {lock.owner: lock.session for lock in service.holders("sem:s").holders}
    assert held == sessions
