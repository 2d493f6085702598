"""``lock_all``: several locks held as one by both clients (blocking and
asyncio) against a real server."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from lockkeeper_client import LockKind, LockLost, LockNotAcquired, SetMember

from tests.client_flavours import FLAVOURS, connect


@pytest.fixture(params=FLAVOURS)
def make_client(request):
    made = []

    def make(url, token, **options):
        made.append(connect(request.param, url, token, **options))
        return made[-1]

    yield make
    for lock_client in made:
        lock_client.close()


def test_lock_all_holds_every_member_and_releases_them_as_one(live_server, make_client):
    client = make_client(live_server.url, live_server.token, timeout=5)
    members = ["acct:2", SetMember("acct:1", LockKind(shared=True)), "acct:3"]
    with client.lock_all(members, ttl=30, wait=5) as held:
        assert [lock.resource for lock in held.locks] == ["acct:2", "acct:1", "acct:3"]
        assert len(set(held.fences.values())) == 3
        assert held.locks[1].mode == "shared"
        with live_server.service() as service:
            for resource in ("acct:1", "acct:2", "acct:3"):
                assert len(service.holders(resource).holders) == 1
            # The set's page is the set the client holds.
            found = service.set_view(held.set_id)
            assert [m.resource for m in found.members] == ["acct:1", "acct:2", "acct:3"]
    with live_server.service() as service:
        for resource in ("acct:1", "acct:2", "acct:3"):
            assert service.holders(resource).holders == []


def test_lock_all_that_stays_refused_names_the_member(live_server, make_client):
    client = make_client(live_server.url, live_server.token, timeout=5)
    with live_server.service() as service:
        service.acquire("acct:9", "someone", ttl=30)
    with (
        pytest.raises(LockNotAcquired, match="'acct:9' stayed held"),
        client.lock_all(["acct:8", "acct:9"], ttl=30, wait=0.3),
    ):
        pass
    with live_server.service() as service:
        assert service.holders("acct:8").holders == []  # nothing held meanwhile


def test_a_member_lost_during_the_block_raises_at_its_end(live_server, make_client):
    client = make_client(live_server.url, live_server.token, timeout=5)
    held = client.lock_all(["acct:1", "acct:2"], ttl=3, renew_every=0.1)
    held.acquire()
    live_server.force_release("acct:2")
    assert held.lost.wait(10)
    with pytest.raises(LockLost):
        held.__exit__(None, None, None)
    with live_server.service() as service:
        assert service.holders("acct:1").holders == []  # released at the end


def test_two_workers_taking_overlapping_sets_in_opposite_orders_never_overlap(
    live_server, make_client
):
    """Each worker names the same two resources the other way round: taken as
    one set, neither ever holds one while waiting for the other."""
    inside = Counter()
    most = Counter()
    guard = threading.Lock()
    failures = []

    def worker(names: list[str]) -> None:
        client = make_client(live_server.url, live_server.token, timeout=5)
        try:
            for _ in range(15):
                with client.lock_all(names, ttl=10, wait=30):
                    with guard:
                        for name in names:
                            inside[name] += 1
                            most[name] = max(most[name], inside[name])
                    with guard:
                        for name in names:
                            inside[name] -= 1
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [
        threading.Thread(target=worker, args=(names,))
        for names in (["acct:a", "acct:b"], ["acct:b", "acct:a"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    assert most == Counter({"acct:a": 1, "acct:b": 1})


def test_a_set_bound_to_a_session_ends_with_it(live_server, make_client):
    client = make_client(live_server.url, live_server.token, timeout=5)
    session = client.create_session("w-5", 30)
    attempt = client.acquire_all(["acct:5", "acct:6"], "w-5", session=session.id)
    assert attempt.acquired
    assert attempt.set_id
    assert {lock.session for lock in attempt.locks} == {session.id}
    client.end_session(session.id)
    with live_server.service() as service:
        for resource in ("acct:5", "acct:6"):
            assert service.holders(resource).holders == []
