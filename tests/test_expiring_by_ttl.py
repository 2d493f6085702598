""" "Expiring" judged against each lock's own ttl, on every database: a holder
renewing on time is never expiring, however short its ttl; one that misses its
renewals is, once past half its ttl; every read agrees (the lock, the lists,
the counts, the By owner groups, the API and the metrics read these)."""

from __future__ import annotations

import pytest
from lockkeeper_core.state import LockState

pytestmark = pytest.mark.usefixtures("backend")


def states(service, resource: str) -> set[LockState]:
    """The state of ``resource`` as every read judges it."""
    found = {service.get(resource, include_stale=True).state}
    found |= {
        lock.state
        for lock in service.list_locks(prefix=resource, limit=10).items
        if lock.resource == resource
    }
    counts = service.counts(prefix=resource)
    found |= {state for state, n in counts.items() if n}
    for state in LockState:
        if service.list_locks(prefix=resource, state=state).items:
            found.add(state)
    return found


def test_a_leader_renewing_a_15_s_ttl_every_5_s_is_never_expiring(service, clock):
    service.acquire("leader:1", "w-1", ttl=15)
    for _ in range(12):  # a minute of renewals
        clock.advance(5)
        assert states(service, "leader:1") == {LockState.HELD}
        service.renew("leader:1", "w-1", ttl=15)
    assert service.counts() == {
        LockState.HELD: 1,
        LockState.EXPIRING: 0,
        LockState.STALE: 0,
    }


def test_a_holder_that_stops_renewing_is_expiring_past_half_its_ttl(service, clock):
    service.acquire("leader:1", "w-1", ttl=15)
    clock.advance(5)
    service.renew("leader:1", "w-1", ttl=15)  # then no more renewals
    clock.advance(7.4)
    assert states(service, "leader:1") == {LockState.HELD}
    clock.advance(0.2)  # 7.4 s of its 15 s left
    assert states(service, "leader:1") == {LockState.EXPIRING}
    clock.advance(7.4)
    assert states(service, "leader:1") == {LockState.STALE}


def test_a_long_held_lock_is_judged_by_its_last_renewal_not_its_age(service, clock):
    """Held for an hour on a 20 s ttl: the span since its acquire (an hour)
    is not its ttl; its latest renewal's is."""
    service.acquire("leader:1", "w-1", ttl=20)
    for _ in range(180):
        clock.advance(20 / 3)
        service.renew("leader:1", "w-1", ttl=20)
    assert states(service, "leader:1") == {LockState.HELD}
    clock.advance(11)  # 9 s of 20 left: a renewal missed
    assert states(service, "leader:1") == {LockState.EXPIRING}


def test_a_session_bound_grant_is_judged_by_its_sessions_ttl(service, clock):
    """A heartbeat moves a bound grant's expiry and writes no event: its
    session's ttl is its ttl."""
    session = service.sessions.create("w-1", 15, token="worker")
    assert service.acquire(
        "leader:1", "w-1", session=session.id, token="worker"
    ).acquired
    for _ in range(6):
        clock.advance(5)
        service.sessions.heartbeat(session.id, token="worker")
        assert states(service, "leader:1") == {LockState.HELD}
    clock.advance(8)  # 7 s of 15 left
    assert states(service, "leader:1") == {LockState.EXPIRING}


def test_semaphore_holders_and_shared_grants_each_keep_their_own_ttl(service, clock):
    service.acquire("sem:1", "a", ttl=10, limit=2)
    service.acquire("sem:1", "b", ttl=600, limit=2)
    service.acquire("rw:1", "r", ttl=16, mode="shared")
    clock.advance(6)  # a: 4 of 10 left; r: 10 of 16 left
    holders = {h.owner: h.state for h in service.holders("sem:1").holders}
    assert holders == {"a": LockState.EXPIRING, "b": LockState.HELD}
    assert service.holders("rw:1").holders[0].state is LockState.HELD
    grants = {
        (lock.resource, lock.owner): lock.state
        for lock in service.list_locks(entries="grants").items
    }
    assert grants == {
        ("sem:1", "a"): LockState.EXPIRING,
        ("sem:1", "b"): LockState.HELD,
        ("rw:1", "r"): LockState.HELD,
    }
    owners = {g.name: (g.held, g.expiring, g.stale) for g in service.owner_counts()}
    assert owners == {"a": (0, 1, 0), "b": (1, 0, 0), "r": (1, 0, 0)}
