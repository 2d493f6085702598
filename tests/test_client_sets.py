"""``lock_all``: several locks held as one by both clients (blocking and
asyncio) against a real server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
from lockkeeper_client import (
    AsyncLockClient,
    LockKind,
    LockLost,
    LockNotAcquired,
    SetMember,
)

from tests.client_flavours import FLAVOURS, connect
from tests.live_server import serve


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


def _poll(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        threading.Event().wait(0.01)


def _line(live_server, resource: str) -> list[tuple[str, int]]:
    with live_server.service() as service:
        return [(w.owner, w.id) for w in service.queue.line(resource)]


class _Block:
    """``with client.lock_all(...)`` entered in a thread of its own, held
    until ``leave`` is set."""

    def __init__(self, client, members, **options):
        self.entered = threading.Event()
        self.leave = threading.Event()
        self.failure: list[BaseException] = []
        self.fences: dict[str, int] = {}

        def run():
            try:
                with client.lock_all(members, **options) as held:
                    self.fences = held.fences
                    self.entered.set()
                    self.leave.wait(60)
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                self.failure.append(exc)
                self.entered.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def end(self) -> None:
        self.leave.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_lock_all_waits_in_the_servers_lines(live_server, make_client):
    """The set takes a place in every member's line (the free one's too,
    holding none of them), so a later acquire of its free member is refused,
    and it is granted once the holder lets go."""
    client = make_client(live_server.url, live_server.token, timeout=5)
    with live_server.service() as service:
        assert service.acquire("acct:9", "someone", ttl=30).acquired
    block = _Block(client, ["acct:8", "acct:9"], ttl=30, wait=30, owner="w-set")
    _poll(lambda: [o for o, _ in _line(live_server, "acct:8")] == ["w-set"], "in line")
    assert [o for o, _ in _line(live_server, "acct:9")] == ["w-set"]
    with live_server.service() as service:
        assert service.holders("acct:8").holders == []  # nothing held meanwhile
        assert not service.acquire("acct:8", "late", ttl=30).acquired
        service.release("acct:9", "someone")
    assert block.entered.wait(30)
    assert not block.failure, block.failure
    assert set(block.fences) == {"acct:8", "acct:9"}
    block.end()
    assert _line(live_server, "acct:8") == _line(live_server, "acct:9") == []


def test_lock_all_waits_on_in_requests_of_the_servers_largest_wait(
    make_app, make_client
):
    """A server whose largest wait is 0.5 s: the client learns it from the
    400 of its first request and waits on in requests of that, one after
    another, each keeping the set's place in line for the next (``rejoin``),
    until the holder lets go."""
    with serve(make_app(LOCKKEEPER_MAX_WAIT=0.5)) as server:
        client = make_client(server.url, server.token, timeout=5)
        with server.service() as service:
            assert service.acquire("acct:9", "someone", ttl=30).acquired
        block = _Block(client, ["acct:8", "acct:9"], ttl=30, wait=60, owner="w-set")
        seen: set[tuple[int, object]] = set()

        def another_request() -> bool:
            with server.service() as service:
                seen.update((w.id, w.deadline) for w in service.queue.line("acct:8"))
            return len(seen) >= 3  # each request moved its place's deadline

        _poll(another_request, "the wait goes on in requests of 0.5 s", 30)
        assert len({place for place, _ in seen}) == 1  # one place throughout
        assert not block.entered.is_set()
        with server.service() as service:
            service.release("acct:9", "someone")
        assert block.entered.wait(30)
        assert not block.failure, block.failure
        block.end()


def test_lock_all_turned_away_by_a_full_room_says_which_cap(make_app, make_client):
    """A server with no waiting room (LOCKKEEPER_MAX_WAITERS=0): the set's
    waiting requests are turned away (503) and the client polls; its wait
    ends naming the cap to raise."""
    with serve(make_app(LOCKKEEPER_MAX_WAITERS=0)) as server:
        client = make_client(server.url, server.token, timeout=5)
        with server.service() as service:
            assert service.acquire("acct:9", "someone", ttl=30).acquired
        with (
            pytest.raises(LockNotAcquired, match=r"full \(LOCKKEEPER_MAX_WAITERS\)"),
            client.lock_all(["acct:8", "acct:9"], ttl=30, wait=0.5),
        ):
            pass
        with server.service() as service:
            assert service.holders("acct:8").holders == []


@pytest.mark.anyio
async def test_a_cancelled_waiting_lock_all_leaves_no_set_behind(live_server):
    """The set's request is out, waiting in the server's lines, when its
    caller gives up: the server ends the wait when it sees the connection
    close (its places leave the lines) and nothing is granted after, even
    once the holder lets go."""
    async with AsyncLockClient(live_server.url, live_server.token) as client:
        with live_server.service() as service:
            assert service.acquire("acct:9", "someone", ttl=30).acquired
        held = client.lock_all(["acct:8", "acct:9"], ttl=30, wait=30, owner="w-set")
        waiting = asyncio.create_task(held.acquire())
        deadline = time.monotonic() + 10
        while not _line(live_server, "acct:8"):
            assert time.monotonic() < deadline, "the set never joined the lines"
            await asyncio.sleep(0.01)
        waiting.cancel()
        (outcome,) = await asyncio.gather(waiting, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError)
        deadline = time.monotonic() + 10
        while _line(live_server, "acct:8") or _line(live_server, "acct:9"):
            assert time.monotonic() < deadline, "the set's places stayed in line"
            await asyncio.sleep(0.01)
        with live_server.service() as service:
            service.release("acct:9", "someone")
            assert service.holders("acct:8").holders == []
            assert service.holders("acct:9").holders == []
