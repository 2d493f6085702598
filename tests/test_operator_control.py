"""Freezes, bulk release of stale locks, confirmed fences and the fence check, in
the service, on a fake clock, on every database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lockkeeper_core.errors import (
    FenceMismatch,
    InvalidInput,
    LockChanged,
    LockHeld,
    LockNotFound,
    NotFrozen,
    ResourceFrozen,
)
from lockkeeper_core.models import LockEvent
from sqlalchemy import select

from app.extensions import db

pytestmark = pytest.mark.usefixtures("backend")


def events(resource: str | None = None) -> list[LockEvent]:
    db.session.rollback()  # a new snapshot: see what other connections committed
    query = select(LockEvent).order_by(LockEvent.id)
    if resource is not None:
        query = query.where(LockEvent.resource == resource)
    return list(db.session.scalars(query))


def actions(resource: str) -> list[str]:
    return [event.action for event in events(resource)]


# -- confirmed fences -------------------------------------------------------------


def test_force_release_needs_a_reason(service):
    service.acquire("job:1", "w-1")
    for reason in (None, "", "   "):
        with pytest.raises(InvalidInput) as refused:
            service.force_release("job:1", actor="alice", reason=reason)
        assert [field for field, _ in refused.value.errors] == ["reason"]
    assert service.get("job:1").owner == "w-1"


def test_force_release_of_the_confirmed_fence_releases_it(service):
    fence = service.acquire("job:1", "w-1").lock.fence
    lock = service.force_release(
        "job:1", actor="alice", reason="hung", expected_fence=fence
    )
    assert (lock.owner, lock.fence) == ("w-1", fence)
    assert actions("job:1") == ["acquired", "force_released"]


def test_force_release_of_another_fence_is_refused_and_changes_nothing(service, clock):
    old = service.acquire("job:1", "w-1", ttl=1).lock.fence
    clock.advance(2)
    new = service.acquire("job:1", "w-2", ttl=60).lock
    with pytest.raises(LockChanged) as refused:
        service.force_release("job:1", actor="alice", reason="x", expected_fence=old)
    assert (refused.value.holder.owner, refused.value.holder.fence) == (
        "w-2",
        new.fence,
    )
    assert service.get("job:1") == new
    assert actions("job:1") == ["acquired", "took_over"]


def test_claim_of_a_valid_lock_needs_force_and_a_reason(service):
    fence = service.acquire("job:1", "w-1").lock.fence
    with pytest.raises(LockHeld):
        service.claim("job:1", "op", actor="alice", reason="x", expected_fence=fence)
    with pytest.raises(InvalidInput) as refused:
        service.claim("job:1", "op", actor="alice", force=True, expected_fence=fence)
    assert [field for field, _ in refused.value.errors] == ["reason"]
    assert actions("job:1") == ["acquired"]
    lock = service.claim(
        "job:1", "op", actor="alice", reason="x", force=True, expected_fence=fence
    )
    assert lock.owner == "op"
    assert lock.fence > fence
    assert actions("job:1") == ["acquired", "force_claimed"]


def test_claim_of_a_free_or_stale_lock_needs_no_reason(service, clock):
    assert service.claim("job:1", "op", ttl=1, actor="alice").owner == "op"
    clock.advance(2)
    assert service.claim("job:1", "op2", actor="alice").owner == "op2"


def test_claim_of_a_confirmed_grant_that_ended_is_refused(service):
    fence = service.acquire("job:1", "w-1").lock.fence
    service.release("job:1", "w-1")
    with pytest.raises(LockChanged) as refused:
        service.claim(
            "job:1", "op", actor="alice", reason="x", force=True, expected_fence=fence
        )
    assert refused.value.holder is None
    assert actions("job:1") == ["acquired", "released"]


@pytest.mark.parametrize("fence", [0, -1, True, "7", 1.5])
def test_expected_fence_must_be_a_positive_integer(service, fence):
    with pytest.raises(InvalidInput) as refused:
        service.force_release("job:1", actor="a", reason="x", expected_fence=fence)
    assert [field for field, _ in refused.value.errors] == ["fence"]


# -- freezes ----------------------------------------------------------------------


def test_a_freeze_refuses_new_grants_under_its_prefix(service, clock):
    service.freeze("billing:", actor="alice", reason="migration")
    with pytest.raises(ResourceFrozen) as refused:
        service.acquire("billing:42", "w-1")
    freeze = refused.value.freeze
    assert (freeze.prefix, freeze.reason, freeze.actor, freeze.ends_at) == (
        "billing:",
        "migration",
        "alice",
        None,
    )
    assert "billing:" in str(refused.value)
    assert "migration" in str(refused.value)
    with pytest.raises(LockNotFound):
        service.get("billing:42")
    assert actions("billing:42") == []
    # Other resources, and names that only look alike, are not frozen.
    assert service.acquire("billing-old:1", "w-1").acquired
    assert service.acquire("Billing:1", "w-1").acquired


def test_a_freeze_refuses_take_over_but_lets_renew_release_and_reacquire_go_on(
    service, clock
):
    service.acquire("billing:1", "w-1", ttl=10)
    service.acquire("billing:2", "w-2", ttl=10)
    service.freeze("billing", actor="alice", reason="incident")
    assert service.renew("billing:1", "w-1", ttl=10).owner == "w-1"
    reacquired = service.acquire("billing:1", "w-1", ttl=10)
    assert reacquired.acquired
    assert reacquired.action.value == "reacquired"
    service.release("billing:1", "w-1")
    clock.advance(11)  # billing:2 is stale now
    with pytest.raises(ResourceFrozen):
        service.acquire("billing:2", "w-3")
    with pytest.raises(ResourceFrozen):
        service.acquire("billing:2", "w-2")  # its own, but expired: a new grant
    with pytest.raises(ResourceFrozen):
        service.acquire("billing:1", "w-1")  # released: a new grant
    assert actions("billing:2") == ["acquired"]


def test_a_freeze_refuses_a_claim_without_force_only(service):
    service.freeze("billing:", actor="alice", reason="migration")
    with pytest.raises(ResourceFrozen):
        service.claim("billing:1", "op", actor="alice", reason="x")
    lock = service.claim("billing:1", "op", actor="alice", reason="x", force=True)
    assert lock.owner == "op"
    assert actions("billing:1") == ["claimed"]


def test_a_held_lock_is_refused_as_held_even_when_frozen(service):
    service.acquire("billing:1", "w-1")
    service.freeze("billing:", actor="alice", reason="migration")
    result = service.acquire("billing:1", "w-2")
    assert not result.acquired
    assert result.lock.owner == "w-1"


def test_a_timed_freeze_ends_by_itself_on_the_deciding_clock(service, clock):
    frozen = service.freeze(
        "billing:", actor="alice", reason="deploy", duration=timedelta(minutes=5)
    )
    assert frozen.ends_at == clock.now() + timedelta(minutes=5)
    clock.advance(299)
    with pytest.raises(ResourceFrozen) as refused:
        service.acquire("billing:1", "w-1")
    assert refused.value.freeze.ends_at == frozen.ends_at
    assert [f.prefix for f in service.list_freezes()] == ["billing:"]
    clock.advance(1)
    assert service.acquire("billing:1", "w-1").acquired
    assert service.list_freezes() == []
    with pytest.raises(NotFrozen):
        service.unfreeze("billing:", actor="alice", reason="done")


def test_unfreeze_lets_grants_in_and_both_write_events(service, clock):
    service.freeze("billing:", actor="alice", reason="migration")
    clock.advance(10)
    service.unfreeze("billing:", actor="bob", reason="migration done")
    assert service.acquire("billing:1", "w-1").acquired
    frozen, unfrozen = events("billing:")
    assert (frozen.action, frozen.actor, frozen.reason, frozen.expires_at) == (
        "frozen",
        "alice",
        "migration",
        None,
    )
    assert (unfrozen.action, unfrozen.actor, unfrozen.reason) == (
        "unfrozen",
        "bob",
        "migration done",
    )
    assert unfrozen.occurred_at - frozen.occurred_at == timedelta(seconds=10)


def test_freezing_again_replaces_the_reason_and_end(service):
    service.freeze("a:", actor="alice", reason="one", duration=timedelta(hours=1))
    service.freeze("a:", actor="bob", reason="two")
    (freeze,) = service.list_freezes()
    assert (freeze.reason, freeze.actor, freeze.ends_at) == ("two", "bob", None)
    assert actions("a:") == ["frozen", "frozen"]


def test_freeze_input_is_checked(service):
    with pytest.raises(InvalidInput) as refused:
        service.freeze("no spaces", actor="a", reason="x")
    assert [f for f, _ in refused.value.errors] == ["prefix"]
    with pytest.raises(InvalidInput) as refused:
        service.freeze("a:", actor="a", reason=None)
    assert [f for f, _ in refused.value.errors] == ["reason"]
    with pytest.raises(InvalidInput) as refused:
        service.freeze("a:", actor="a", reason="x", duration=timedelta(0))
    assert [f for f, _ in refused.value.errors] == ["for"]
    with pytest.raises(InvalidInput):
        service.unfreeze("a:", actor="a", reason="")
    with pytest.raises(NotFrozen):
        service.unfreeze("a:", actor="a", reason="x")


# -- bulk release of stale locks ---------------------------------------------------


def test_release_stale_releases_every_stale_lock_matching_with_one_event_each(
    service, clock, monkeypatch
):
    monkeypatch.setattr("lockkeeper_core.operator.RELEASE_BATCH", 3)
    for i in range(7):
        service.acquire(f"job:{i}", "w-1", ttl=10)
    service.acquire("job:other", "w-2", ttl=10)
    service.acquire("report:1", "w-1", ttl=10)
    service.acquire("job:held", "w-1", ttl=100)
    clock.advance(11)
    released = service.release_stale(
        actor="alice", reason="after the outage", prefix="job:", owner="w-1"
    )
    assert sorted(lock.resource for lock in released) == [f"job:{i}" for i in range(7)]
    ended = [e for e in events() if e.action == "force_released"]
    assert sorted(e.resource for e in ended) == [f"job:{i}" for i in range(7)]
    assert {(e.actor, e.reason, e.previous_owner) for e in ended} == {
        ("alice", "after the outage", "w-1")
    }
    stale = service.list_locks(state="stale").items
    assert [lock.resource for lock in stale] == ["job:other", "report:1"]
    assert service.get("job:held").owner == "w-1"
    assert service.count_stale() == 2
    assert service.count_stale(owner="w-2") == 1


def test_release_stale_needs_a_reason(service, clock):
    service.acquire("job:1", "w-1", ttl=1)
    clock.advance(2)
    with pytest.raises(InvalidInput):
        service.release_stale(actor="alice", reason=None)
    assert service.count_stale() == 1


# -- fence check --------------------------------------------------------------------


def test_check_fence_accepts_only_the_valid_grant(service, clock):
    lock = service.acquire("job:1", "w-1", ttl=10).lock
    assert service.check_fence("job:1", lock.fence) == lock
    with pytest.raises(FenceMismatch) as refused:
        service.check_fence("job:1", lock.fence - 1 or 999)
    assert refused.value.current == lock
    clock.advance(11)
    with pytest.raises(FenceMismatch) as refused:
        service.check_fence("job:1", lock.fence)
    assert refused.value.current.state.value == "stale"
    taken = service.acquire("job:1", "w-2").lock
    with pytest.raises(FenceMismatch) as refused:
        service.check_fence("job:1", lock.fence)
    assert refused.value.current == taken
    service.release("job:1", "w-2")
    with pytest.raises(FenceMismatch) as refused:
        service.check_fence("job:1", taken.fence)
    assert refused.value.current is None
