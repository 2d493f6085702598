"""Every rule of the lock service, on a fake clock, on every database."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from lockkeeper_core.errors import (
    InvalidInput,
    LockExpired,
    LockHeld,
    LockNotFound,
    NotOwner,
)
from lockkeeper_core.models import DistributedLock, LockEvent
from lockkeeper_core.pagination import prefix_range_bounds
from lockkeeper_core.state import Action, LockState
from sqlalchemy import func, select

from app.extensions import db

pytestmark = pytest.mark.usefixtures("backend")


def events_of(resource: str) -> list[LockEvent]:
    db.session.expire_all()
    return list(
        db.session.scalars(
            select(LockEvent)
            .where(LockEvent.resource == resource)
            .order_by(LockEvent.id)
        )
    )


def lock_rows() -> int:
    return db.session.scalar(select(func.count()).select_from(DistributedLock))


# -- acquire ------------------------------------------------------------------


def test_acquire_of_free_resource_grants_it_with_a_fence(service, clock):
    result = service.acquire("job:42", "w-1", ttl=30)
    assert result.acquired
    assert result.action is Action.ACQUIRED
    lock = result.lock
    assert (lock.resource, lock.owner) == ("job:42", "w-1")
    assert lock.fence >= 1
    assert lock.acquired_at == clock.now()
    assert lock.expires_at == clock.now() + timedelta(seconds=30)
    assert lock.ttl_remaining == 30
    assert lock.state is LockState.HELD


def test_stored_instants_equal_what_sqlalchemy_binds(service, clock):
    """Equality in SQL with instants SQLAlchemy binds (text on SQLite, whole
    seconds included): the hot path stores what every other query compares with."""
    clock.advance(0.5)
    service.acquire("job:format", "w-1", ttl=30)
    service.renew("job:format", "w-1", ttl=30)
    now, expires_at = clock.now(), clock.now() + timedelta(seconds=30)
    assert lock_rows_where(
        DistributedLock.acquired_at == now, DistributedLock.expires_at == expires_at
    )
    clock.advance(0.5)
    service.release("job:format", "w-1")
    assert lock_rows_where(DistributedLock.expires_at == clock.now())
    assert [event.occurred_at for event in events_of("job:format")] == [
        now,
        now,
        clock.now(),
    ]


def lock_rows_where(*conditions) -> int:
    db.session.rollback()  # a fresh snapshot
    return db.session.scalar(
        select(func.count()).select_from(DistributedLock).where(*conditions)
    )


def test_acquire_uses_default_ttl_when_none_given(service, clock):
    lock = service.acquire("job:1", "w-1").lock
    assert lock.expires_at - clock.now() == timedelta(seconds=30)


def test_fractional_ttl_is_kept_to_the_microsecond(service, clock):
    lock = service.acquire("job:1", "w-1", ttl=0.25).lock
    assert lock.expires_at - clock.now() == timedelta(milliseconds=250)


def test_acquire_of_validly_held_lock_is_refused_and_names_the_holder(service, clock):
    first = service.acquire("job:42", "w-1", ttl=30).lock
    clock.advance(10)
    result = service.acquire("job:42", "w-2", ttl=30)
    assert not result.acquired
    assert result.lock.owner == "w-1"
    assert result.lock.fence == first.fence
    assert result.lock.ttl_remaining == pytest.approx(20)


def test_refused_acquire_writes_no_event(service):
    service.acquire("job:42", "w-1", ttl=30)
    service.acquire("job:42", "w-2", ttl=30)
    assert [e.action for e in events_of("job:42")] == ["acquired"]


def test_same_owner_reacquire_keeps_fence_and_moves_both_timestamps(service, clock):
    first = service.acquire("job:42", "w-1", ttl=30).lock
    clock.advance(20)
    again = service.acquire("job:42", "w-1", ttl=60)
    assert again.acquired
    assert again.action is Action.REACQUIRED
    assert again.lock.fence == first.fence
    assert again.lock.acquired_at == clock.now()
    assert again.lock.expires_at == clock.now() + timedelta(seconds=60)


def test_takeover_at_exactly_expires_at_is_allowed_with_a_new_fence(service, clock):
    first = service.acquire("job:42", "w-1", ttl=30).lock
    clock.advance(30)
    result = service.acquire("job:42", "w-2", ttl=30)
    assert result.acquired
    assert result.action is Action.TOOK_OVER
    assert result.lock.fence > first.fence
    event = events_of("job:42")[-1]
    assert (event.action, event.owner, event.previous_owner) == (
        "took_over",
        "w-2",
        "w-1",
    )


def test_takeover_just_before_expiry_is_refused(service, clock):
    service.acquire("job:42", "w-1", ttl=30)
    clock.advance(29.999)
    assert not service.acquire("job:42", "w-2").acquired


def test_same_owner_acquire_after_expiry_is_a_new_grant_with_new_fence(service, clock):
    first = service.acquire("job:42", "w-1", ttl=1).lock
    clock.advance(5)
    again = service.acquire("job:42", "w-1", ttl=1)
    assert again.action is Action.TOOK_OVER
    assert again.lock.fence > first.fence


def test_acquire_after_release_is_acquired_with_a_higher_fence(service):
    first = service.acquire("job:42", "w-1").lock
    service.release("job:42", "w-1")
    second = service.acquire("job:42", "w-2")
    assert second.action is Action.ACQUIRED
    assert second.lock.fence > first.fence


def test_fence_keeps_increasing_across_purge_of_stale_rows(service, clock):
    first = service.acquire("job:42", "w-1", ttl=1).lock
    clock.advance(3600)
    assert service.purge_stale(timedelta(minutes=30)) == ["job:42"]
    assert lock_rows() == 0
    assert service.acquire("job:42", "w-2").lock.fence > first.fence


def test_fence_keeps_increasing_across_force_release(service):
    first = service.acquire("job:42", "w-1").lock
    service.force_release("job:42", actor="admin", reason="stuck")
    assert service.acquire("job:42", "w-1").lock.fence > first.fence


# -- renew ----------------------------------------------------------------------


def test_renew_moves_expiry_and_keeps_fence_and_acquired_at(service, clock):
    first = service.acquire("job:42", "w-1", ttl=30).lock
    clock.advance(25)
    renewed = service.renew("job:42", "w-1", ttl=40)
    assert renewed.fence == first.fence
    assert renewed.acquired_at == first.acquired_at
    assert renewed.expires_at == clock.now() + timedelta(seconds=40)
    assert [e.action for e in events_of("job:42")] == ["acquired", "renewed"]


def test_renew_of_missing_lock_is_not_found(service):
    with pytest.raises(LockNotFound):
        service.renew("job:42", "w-1")


def test_renew_of_expired_lock_is_refused_and_never_upserts(service, clock):
    service.acquire("job:42", "w-1", ttl=30)
    clock.advance(30)
    with pytest.raises(LockExpired):
        service.renew("job:42", "w-1")
    assert service.get("job:42", include_stale=True).state is LockState.STALE


def test_renew_of_lock_held_by_another_is_refused(service):
    service.acquire("job:42", "w-1")
    with pytest.raises(NotOwner) as caught:
        service.renew("job:42", "w-2")
    assert caught.value.holder.owner == "w-1"
    assert [e.action for e in events_of("job:42")] == ["acquired"]


# -- release --------------------------------------------------------------------


def test_release_removes_the_lock_and_logs_it(service):
    lock = service.acquire("job:42", "w-1").lock
    released = service.release("job:42", "w-1", actor="token-a")
    assert released.fence == lock.fence
    with pytest.raises(LockNotFound):
        service.get("job:42", include_stale=True)
    assert service.list_locks().items == []
    assert sum(service.counts().values()) == 0
    event = events_of("job:42")[-1]
    assert (event.action, event.owner, event.fence, event.actor) == (
        "released",
        "w-1",
        lock.fence,
        "token-a",
    )


def test_release_of_missing_lock_is_not_found(service):
    with pytest.raises(LockNotFound):
        service.release("job:42", "w-1")


def test_release_of_expired_lock_is_not_found_and_changes_nothing(service, clock):
    service.acquire("job:42", "w-1", ttl=5)
    clock.advance(6)
    with pytest.raises(LockNotFound):
        service.release("job:42", "w-1")
    assert lock_rows() == 1
    assert len(events_of("job:42")) == 1


def test_release_by_other_owner_is_forbidden(service):
    service.acquire("job:42", "w-1")
    with pytest.raises(NotOwner):
        service.release("job:42", "w-2")
    assert service.get("job:42").owner == "w-1"


# -- operator actions -----------------------------------------------------------


def test_force_release_removes_a_valid_lock_and_records_actor_and_reason(service):
    service.acquire("job:42", "w-1")
    service.force_release("job:42", actor="alice", reason="worker hung")
    event = events_of("job:42")[-1]
    assert (event.action, event.actor, event.reason, event.previous_owner) == (
        "force_released",
        "alice",
        "worker hung",
        "w-1",
    )
    with pytest.raises(LockNotFound):
        service.get("job:42")


def test_force_release_of_missing_lock_is_not_found(service):
    with pytest.raises(LockNotFound):
        service.force_release("job:42", actor="alice", reason="stuck")


def test_claim_of_free_resource_grants_it_to_the_named_owner(service):
    lock = service.claim("job:42", "operator:alice", 60, actor="alice", reason="manual")
    assert lock.owner == "operator:alice"
    assert events_of("job:42")[-1].action == "claimed"


def test_claim_of_stale_lock_is_claimed_with_new_fence(service, clock):
    first = service.acquire("job:42", "w-1", ttl=1).lock
    clock.advance(2)
    lock = service.claim("job:42", "operator:alice", 60, actor="alice")
    assert lock.fence > first.fence
    assert events_of("job:42")[-1].previous_owner == "w-1"


def test_claim_of_validly_held_lock_needs_force(service):
    service.acquire("job:42", "w-1")
    with pytest.raises(LockHeld) as caught:
        service.claim("job:42", "operator:alice", 60, actor="alice")
    assert caught.value.holder.owner == "w-1"
    lock = service.claim(
        "job:42", "operator:alice", 60, actor="alice", reason="hung", force=True
    )
    assert lock.owner == "operator:alice"
    assert events_of("job:42")[-1].action == "force_claimed"


def test_holder_learns_of_force_claim_on_its_next_renew(service):
    service.acquire("job:42", "w-1")
    service.claim("job:42", "operator:alice", 60, actor="alice", reason="x", force=True)
    with pytest.raises(NotOwner):
        service.renew("job:42", "w-1")


# -- reads ------------------------------------------------------------------------


def test_get_hides_stale_locks_unless_asked(service, clock):
    service.acquire("job:42", "w-1", ttl=1)
    clock.advance(1)
    with pytest.raises(LockNotFound):
        service.get("job:42")
    assert service.get("job:42", include_stale=True).state is LockState.STALE


def test_list_filters_by_state_prefix_and_owner(service, clock):
    service.acquire("job:1", "w-1", ttl=100)
    service.acquire("job:2", "w-2", ttl=3)  # past half its ttl after 2 s
    service.acquire("report:x", "w-1", ttl=1)
    clock.advance(2)
    by_state = {
        state: [lock.resource for lock in service.list_locks(state=state).items]
        for state in ("held", "expiring", "stale", "all")
    }
    assert by_state == {
        "held": ["job:1"],
        "expiring": ["job:2"],
        "stale": ["report:x"],
        "all": ["job:1", "job:2", "report:x"],
    }
    assert [lock.resource for lock in service.list_locks(prefix="job:").items] == [
        "job:1",
        "job:2",
    ]
    assert [lock.resource for lock in service.list_locks(owner="w-1").items] == [
        "job:1",
        "report:x",
    ]
    assert service.counts() == {
        LockState.HELD: 1,
        LockState.EXPIRING: 1,
        LockState.STALE: 1,
    }


def test_counts_leave_out_free_rows_whatever_their_release_time(service, clock):
    """The counts of every lock are ranges of expiries over every row less the
    free rows in them (a released row keeps its release time as expiry): a row
    released before, just after or long after the instant counted is in no
    state, as in the list of that instant."""
    service.acquire("old:1", "w", ttl=100)
    service.release("old:1", "w")  # free, its expiry before the instant
    service.acquire("stale:1", "w", ttl=1)
    service.acquire("job:2", "w", ttl=4)  # 2 s of its 4 s left: expiring
    clock.advance(2)
    for name, ttl in [("job:1", 100), ("gone:1", 100), ("gone:2", 100)]:
        service.acquire(name, "w", ttl=ttl)
    instant = service.now()
    clock.advance(3)
    service.release("gone:1", "w")  # its expiry within the expiring range
    clock.advance(50)
    service.release("gone:2", "w")  # its expiry within the held range
    counts = service.counts(at=instant)
    listed = Counter(lock.state for lock in service.list_locks(at=instant).items)
    assert counts == {
        LockState.HELD: 1,
        LockState.EXPIRING: 1,
        LockState.STALE: 1,
    }
    assert counts == {state: listed[state] for state in LockState}


def test_prefix_search_treats_underscore_and_percent_literally(service):
    service.acquire("a_b", "w")
    service.acquire("axb", "w")
    assert [lock.resource for lock in service.list_locks(prefix="a_").items] == ["a_b"]


def test_prefix_search_is_case_exact(service):
    service.acquire("job:1", "w")
    service.acquire("JOB:2", "w")
    assert [lock.resource for lock in service.list_locks(prefix="JOB").items] == [
        "JOB:2"
    ]


def test_a_prefix_search_finds_exactly_the_names_on_both_edges_of_its_range(service):
    """SQLite narrows a prefix search to the names from the prefix up to the
    next prefix (``job:1`` to ``job:2``): the prefix itself and the names just
    inside are found, those at or past either edge and other cases are not."""
    names = ["job:0", "job:1", "job:1-", "job:10", "job:1z", "job:2", "JOB:1", "job1"]
    names += ["job:z", "job:zz", "job:z0"]
    for name in names:
        service.acquire(name, "w")

    def found(prefix):
        return sorted(lock.resource for lock in service.list_locks(prefix=prefix).items)

    assert found("job:1") == ["job:1", "job:1-", "job:10", "job:1z"]
    assert found("job:z") == ["job:z", "job:z0", "job:zz"]  # after z: "{"
    assert found("job:1z") == ["job:1z"]
    assert found("job:\U0010ffff") == []
    assert service.counts(prefix="job:1")[LockState.HELD] == 4


def test_the_next_prefix_skips_surrogates_and_has_none_after_the_last_character():
    assert [b.value for b in prefix_range_bounds("job:1")] == ["job:1", "job:2"]
    assert [b.value for b in prefix_range_bounds("a\ud7ff")] == ["a\ud7ff", "a\ue000"]
    assert [b.value for b in prefix_range_bounds("a\U0010ffff")] == ["a\U0010ffff", "b"]
    assert [b.value for b in prefix_range_bounds("\U0010ffff")] == ["\U0010ffff"]


def test_owners_differing_only_in_trailing_space_are_different_owners(service):
    service.acquire("job:1", "w-1 ")
    assert not service.acquire("job:1", "w-1").acquired
    assert service.list_locks(owner="w-1").items == []
    assert [lock.owner for lock in service.list_locks(owner="w-1 ").items] == ["w-1 "]


def test_resource_names_are_case_sensitive(service):
    assert service.acquire("Job:1", "w-1").acquired
    assert service.acquire("job:1", "w-2").acquired


def test_list_pages_without_gaps_or_repeats(service):
    names = [f"job:{i:03d}" for i in range(23)]
    for name in names:
        service.acquire(name, "w")
    seen, cursor = [], None
    while True:
        page = service.list_locks(limit=5, cursor=cursor)
        seen += [lock.resource for lock in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == names


# -- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"resource": "", "owner": "w"}, "resource"),
        ({"resource": "job 42", "owner": "w"}, "resource"),
        ({"resource": "job/42", "owner": "w"}, "resource"),
        ({"resource": "x" * 256, "owner": "w"}, "resource"),
        ({"resource": "job\x00", "owner": "w"}, "resource"),
        ({"resource": "job", "owner": ""}, "owner"),
        ({"resource": "job", "owner": "w\x00"}, "owner"),
        ({"resource": "job", "owner": "w\n"}, "owner"),
        ({"resource": "job", "owner": "w" * 256}, "owner"),
        ({"resource": "job", "owner": "w", "ttl": 0}, "ttl"),
        ({"resource": "job", "owner": "w", "ttl": -1}, "ttl"),
        ({"resource": "job", "owner": "w", "ttl": 86400.5}, "ttl"),
        ({"resource": "job", "owner": "w", "ttl": float("nan")}, "ttl"),
        ({"resource": "job", "owner": "w", "ttl": float("inf")}, "ttl"),
        ({"resource": "job", "owner": "w", "ttl": True}, "ttl"),
        ({"resource": "job", "owner": "w", "ttl": "30"}, "ttl"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(service, kwargs, field):
    with pytest.raises(InvalidInput) as caught:
        service.acquire(**kwargs)
    assert field in [name for name, _ in caught.value.errors]
    assert lock_rows() == 0


def test_longest_valid_names_are_accepted(service):
    resource = "A-z0.9_:@=+" + "x" * 244
    assert service.acquire(resource, "ö" * 255, ttl=86400).acquired


def test_every_bad_field_is_named_at_once(service):
    with pytest.raises(InvalidInput) as caught:
        service.acquire("bad name", "", ttl=-1)
    assert {name for name, _ in caught.value.errors} == {"resource", "owner", "ttl"}


# -- the audit trail --------------------------------------------------------------


def test_every_ownership_change_writes_exactly_one_event(service, clock):
    from app.auth.service import create_token

    create_token("workers")
    service.acquire("job:42", "w-1", ttl=10)  # acquired
    service.acquire("job:42", "w-1", ttl=10)  # reacquired
    service.renew("job:42", "w-1", ttl=10)  # renewed
    clock.advance(11)
    service.acquire("job:42", "w-2", ttl=10)  # took_over
    service.claim(
        "job:42", "op", 10, actor="a", reason="r", force=True
    )  # force_claimed
    service.force_release("job:42", actor="a", reason="r")  # force_released
    service.claim("job:42", "op", 10, actor="a", for_token="workers")  # claimed
    service.release("job:42", "op", token="workers")  # released
    assert [e.action for e in events_of("job:42")] == [
        "acquired",
        "reacquired",
        "renewed",
        "took_over",
        "force_claimed",
        "force_released",
        "claimed",
        "released",
    ]
    assert all(e.occurred_at is not None for e in events_of("job:42"))
