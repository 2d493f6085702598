"""The worker client in the embedded mode: both faces on the in-process
transport (``lockkeeper_core.embedded``), on every database, with no server between
the client and the database.

The client's behavioural cases (``tests/test_client.py``,
``tests/test_client_holders.py``) run here again as they are written, on the
embedded flavours: the switch is the client's ``transport=``, nothing else.
A server on the same database stands beside them where a case needs one (an
operator's force-release, a second token): one world, the same tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import pytest
from lockkeeper_client import (
    AsyncLockClient,
    AuthenticationFailed,
    InvalidRequest,
    LockClient,
    LockLost,
    LockMissing,
)
from lockkeeper_core.embedded import AsyncEmbeddedTransport, Embedded, EmbeddedTransport
from lockkeeper_core.models import LockEvent
from lockkeeper_core.schema import SchemaNotReady
from sqlalchemy import create_engine, select

from tests.client_flavours import EMBEDDED_FLAVOURS, connect

# The behavioural cases, collected here again on the embedded flavours.
from tests.test_client import (  # noqa: F401
    test_a_nested_lock_of_the_same_owner_is_refused_not_dropped_on_exit,
    test_a_token_outside_its_scope_raises_access_denied_not_lock_lost,
    test_acquire_of_held_lock_is_refused_with_holder_and_retry_after,
    test_acquire_returns_a_typed_lock_with_aware_utc_timestamps,
    test_check_raises_lock_lost_once_the_lock_is_lost,
    test_default_owner_is_random_per_lock,
    test_exception_inside_block_propagates_and_the_lock_is_released,
    test_force_release_mid_block_sets_lost_and_calls_on_lost_once,
    test_get_returns_the_current_holder,
    test_invalid_resource_raises_invalid_request_with_field_errors,
    test_leaving_a_lost_lock_raises_lock_lost_even_if_no_renew_noticed_it,
    test_lock_block_holds_the_lock_and_releases_it_on_exit,
    test_quota_answer_raises_lock_quota_reached_with_retry_after,
    test_raise_on_lost_false_keeps_the_loss_in_lost_and_the_log,
    test_release_by_another_owner_raises_lock_lost_and_keeps_the_lock,
    test_release_frees_the_lock,
    test_release_of_a_lock_never_held_raises_lock_lost,
    test_renew_by_another_owner_raises_lock_lost,
    test_renew_extends_expiry_and_keeps_fence_and_acquired_at,
    test_takeover_after_loss_is_not_released_by_the_old_holder,
    test_two_clients_contend_and_the_waiter_gets_the_lock_after_release,
    test_wait_none_waits_until_granted,
    test_wait_timeout_raises_lock_not_acquired_naming_resource_and_holder,
    test_wrong_token_raises_authentication_failed,
)
from tests.test_client_holders import (  # noqa: F401
    test_a_semaphore_grants_its_holders_each_with_a_fence_then_refuses,
    test_another_limit_on_a_resource_in_use_raises_limit_mismatch,
    test_shared_grants_coexist_and_an_exclusive_one_waits_for_them,
)
from tests.test_client_sets import (  # noqa: F401
    test_a_member_lost_during_the_block_raises_at_its_end,
    test_lock_all_holds_every_member_and_releases_them_as_one,
    test_lock_all_that_stays_refused_names_the_member,
    test_lock_all_waits_in_the_servers_lines,
    test_two_workers_taking_overlapping_sets_in_opposite_orders_never_overlap,
)


def database_of(live_server) -> str:
    return live_server.app.config["SQLALCHEMY_DATABASE_URI"]


@pytest.fixture(params=EMBEDDED_FLAVOURS)
def make_client(request, live_server, backend):
    """``make_client(url, token, **options)``: a client of the embedded
    flavour on this test's database (``url`` is only its label)."""
    made = []

    def make(url, token, **options):
        made.append(
            connect(
                request.param, url, token, database=database_of(live_server), **options
            )
        )
        return made[-1]

    yield make
    for lock_client in made:
        lock_client.close()


@pytest.fixture
def worker(live_server, make_client):
    with make_client(live_server.url, live_server.token, timeout=5) as lock_client:
        yield lock_client


@pytest.fixture
def other_worker(live_server, make_client):
    token = live_server.create_token("other-worker")
    with make_client(live_server.url, token, timeout=5) as lock_client:
        yield lock_client


# -- the embedded mode's own cases --------------------------------------------------


def test_an_embedded_grant_is_the_servers_grant(live_server, worker, backend):
    """Same tables, fences and events: the server reads the embedded holder,
    and its next grant of the resource has a higher fence."""
    embedded = worker.acquire("emb:1", "w-1", ttl=30).lock
    with httpx.Client(
        base_url=live_server.url, headers=live_server.auth_headers
    ) as web:
        seen = web.get("/api/v1/locks/emb:1").json()
        assert (seen["owner"], seen["fence"], seen["token"]) == (
            "w-1",
            embedded.fence,
            "live-server",
        )
        worker.release("emb:1", "w-1")
        over_http = web.post("/api/v1/locks/emb:1", json={"owner": "w-2"}).json()
    assert over_http["lock"]["fence"] > embedded.fence
    events = locks_events(live_server, "emb:1")
    assert [e.action for e in events] == ["acquired", "released", "acquired"]
    assert events[0].fence == events[1].fence == embedded.fence


def locks_events(live_server, resource):
    engine = create_engine(database_of(live_server))
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    select(LockEvent.action, LockEvent.fence)
                    .where(LockEvent.resource == resource)
                    .order_by(LockEvent.id)
                )
            )
    finally:
        engine.dispose()


def test_a_revoked_token_is_refused_at_the_next_grant(live_server, make_client):
    token = live_server.create_token("short-lived")
    with make_client(live_server.url, token, timeout=5) as worker:
        assert worker.acquire("emb:2", "w-1", ttl=30).acquired
        live_server.revoke_token("short-lived")
        # Within the token cache's seconds the guard may still pass it; the
        # grant's own transaction refuses it either way.
        with pytest.raises((AuthenticationFailed, LockLost)):
            worker.acquire("emb:3", "w-1", ttl=30)


def in_process(live_server, token=None) -> LockClient:
    return LockClient(
        "http://embedded",
        token or live_server.token,
        timeout=5,
        transport=EmbeddedTransport(database_of(live_server)),
    )


def test_sessions_and_leadership_in_process(live_server, backend):
    with in_process(live_server) as worker:
        with worker.session(ttl=5) as session:
            with session.lock("emb:s1"), session.lock("emb:s2"):
                held = worker.get("emb:s1")
                assert held.session == session.id
        with pytest.raises(LockMissing):
            worker.get("emb:s1")
        with worker.leadership("emb:lead", ttl=5, wait=5) as lead:
            assert worker.leader("emb:lead") == lead.owner
        assert worker.leader("emb:lead") is None


def test_sessions_and_leadership_in_process_asyncio(live_server, backend):
    async def main() -> None:
        async with AsyncLockClient(
            "http://embedded",
            live_server.token,
            timeout=5,
            transport=AsyncEmbeddedTransport(database_of(live_server)),
        ) as worker:
            async with worker.session(ttl=5) as session:
                async with session.lock("emb:a1"):
                    assert (await worker.get("emb:a1")).session == session.id
            with pytest.raises(LockMissing):
                await worker.get("emb:a1")
            async with worker.leadership("emb:alead", ttl=5, wait=5) as lead:
                assert await worker.leader("emb:alead") == lead.owner

    asyncio.run(main())


def test_an_operator_ending_the_session_is_seen_by_the_embedded_holder(
    live_server, backend
):
    with in_process(live_server) as worker:
        session = worker.session(ttl=3, raise_on_lost=False)
        with session, contextlib.suppress(LockLost):
            with session.lock("emb:s3"):
                with live_server.service() as locks:
                    locks.sessions.end(
                        session.id, token=None, actor="operator:test", reason="test"
                    )
                assert session.lost.wait(10)


def test_the_embedded_mode_refuses_a_schema_that_is_behind(empty_url):
    with pytest.raises(SchemaNotReady, match="lockkeeper db upgrade"):
        Embedded(empty_url)


def test_the_async_transport_never_runs_the_core_on_the_loop(live_server, backend):
    """The event loop's own thread never runs a statement: a waiting acquire
    parks a pool thread, and the loop meanwhile answers a ticker."""
    transport = AsyncEmbeddedTransport(database_of(live_server))
    loop_threads: set[int] = set()
    ran_in: set[int] = set()
    call = transport.embedded.call

    def spy(*args, **kwargs):
        ran_in.add(threading.get_ident())
        return call(*args, **kwargs)

    transport.embedded.call = spy  # type: ignore[method-assign]

    async def main() -> int:
        loop_threads.add(threading.get_ident())
        ticks = 0
        async with AsyncLockClient(
            "http://embedded", live_server.token, transport=transport
        ) as client:
            await client.acquire("emb:loop", "w-1", ttl=1)

            async def tick():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.create_task(tick())
            # Waits in line about a second, off the loop.
            result = await client.acquire("emb:loop", "w-2", ttl=5, wait=5)
            ticker.cancel()
            assert result.acquired
        return ticks

    ticks = asyncio.run(main())
    assert ticks > 20
    assert ran_in
    assert not (ran_in & loop_threads)


def test_a_waiting_acquire_leaves_the_quick_calls_their_own_threads(
    live_server, backend
):
    """The asyncio transport's calls that answer at once run on threads of
    their own: with every waiting thread taken by a waiting acquire, another
    resource is still taken and released at once."""
    transport = AsyncEmbeddedTransport(database_of(live_server), threads=1)

    async def main() -> None:
        async with AsyncLockClient(
            "http://embedded", live_server.token, transport=transport
        ) as client:
            await client.acquire("emb:held", "w-1", ttl=30)
            waiting = asyncio.create_task(
                client.acquire("emb:held", "w-2", ttl=30, wait=20)
            )
            deadline = asyncio.get_running_loop().time() + 10
            while not (await client.get("emb:held")).waiters:
                assert asyncio.get_running_loop().time() < deadline
            # The only waiting thread is taken: these calls answer all the same.
            quick = await asyncio.wait_for(client.acquire("emb:free", "w-3"), 5)
            assert quick.acquired
            await asyncio.wait_for(client.release("emb:free", "w-3"), 5)
            await client.release("emb:held", "w-1")
            assert (await asyncio.wait_for(waiting, 20)).acquired

    asyncio.run(main())


def test_one_constructor_switches_a_worker(live_server, backend):
    """A worker's code, unchanged, over HTTP and in process."""

    def job(client: LockClient) -> int:
        with client.lock("emb:job", ttl=10, wait=5) as held:
            return held.fence

    with LockClient(live_server.url, live_server.token) as over_http:
        first = job(over_http)
    with LockClient(
        live_server.url,
        live_server.token,
        transport=EmbeddedTransport(database_of(live_server)),
    ) as in_process:
        second = job(in_process)
    assert second > first


def test_an_embedded_wait_turned_away_keeps_its_place(live_server, backend):
    """The in-process transport keeps a turned-away wait's place as the server
    does (``place``), in the one line HTTP waiters share."""
    from lockkeeper_core.core import LockSettings

    embedded = Embedded(database_of(live_server), settings=LockSettings(max_waiters=0))
    try:
        with (
            live_server.service() as locks,
            LockClient(
                live_server.url,
                live_server.token,
                transport=EmbeddedTransport(embedded),
            ) as client,
        ):
            assert locks.acquire("emb:45", "holder", ttl=30).acquired
            turned = client.acquire("emb:45", "w", 30, wait=5, place=0)
            assert turned.waiting_room_full
            assert turned.place
            again = client.acquire("emb:45", "w", 30, wait=5, place=turned.place)
            assert again.place == turned.place
            assert [w.owner for w in locks.queue.line("emb:45")] == ["w"]
            locks.release("emb:45", "holder")
            granted = client.acquire("emb:45", "w", 30, wait=5, place=turned.place)
            assert granted.acquired
            assert locks.queue.line("emb:45") == []
    finally:
        embedded.close()


def test_an_embedded_wait_that_runs_out_keeps_its_place_when_it_rejoins(
    live_server, backend, monkeypatch
):
    """The in-process transport keeps the place of a wait that ran out and asked
    to ``rejoin`` as the server does, and refuses a ``rejoin`` that is not a
    boolean as the API's document does."""
    monkeypatch.setattr("lockkeeper_core.queue.PLACE_KEPT_FOR", 30.0)  # a slow machine
    embedded = Embedded(database_of(live_server))
    try:
        with (
            live_server.service() as locks,
            LockClient(
                live_server.url,
                live_server.token,
                transport=EmbeddedTransport(embedded),
            ) as client,
        ):
            assert locks.acquire("emb:48", "holder", ttl=30).acquired
            ran_out = client.acquire("emb:48", "w", 30, wait=0.1, place=0, rejoin=True)
            assert not ran_out.acquired
            assert ran_out.place
            assert [w.owner for w in locks.queue.line("emb:48")] == ["w"]
            last = client.acquire("emb:48", "w", 30, wait=0.1, place=ran_out.place)
            assert last.place is None
            assert locks.queue.line("emb:48") == []
        with httpx.Client(
            transport=EmbeddedTransport(embedded),
            base_url=live_server.url,
            headers=live_server.auth_headers,
        ) as http:
            refused = http.post(
                "/api/v1/locks/emb:48",
                json={"owner": "w", "wait": 0.1, "rejoin": "yes"},
            )
        assert refused.status_code == 400
        assert [e["field"] for e in refused.json()["errors"]] == ["rejoin"]
    finally:
        embedded.close()


def test_an_embedded_set_whose_wait_runs_out_keeps_its_places_when_it_rejoins(
    live_server, backend, monkeypatch
):
    """The in-process transport keeps a set's places when its wait runs out
    and it asked to ``rejoin``, as the server does, and refuses ``places``
    that are not the set's as the server does."""
    monkeypatch.setattr("lockkeeper_core.set_waiting.PLACE_KEPT_FOR", 30.0)
    embedded = Embedded(database_of(live_server))
    try:
        with (
            live_server.service() as locks,
            LockClient(
                live_server.url,
                live_server.token,
                transport=EmbeddedTransport(embedded),
            ) as client,
        ):
            assert locks.acquire("emb:49", "holder", ttl=30).acquired
            members = ["emb:49", "emb:50"]
            ran_out = client.acquire_all(
                members, "w", 30, wait=0.1, places={}, rejoin=True
            )
            assert not ran_out.acquired
            assert sorted(ran_out.places) == members
            for resource in members:
                assert [w.owner for w in locks.queue.line(resource)] == ["w"]
            last = client.acquire_all(members, "w", 30, wait=0.1, places=ran_out.places)
            assert last.places is None
            assert locks.queue.line("emb:49") == locks.queue.line("emb:50") == []
            with pytest.raises(InvalidRequest) as refused:
                client.acquire_all(members, "w", 30, wait=0.1, places={"emb:51": 1})
            assert [field for field, _ in refused.value.errors] == ["places"]
    finally:
        embedded.close()


def test_a_workers_own_engine_serves_the_lock_core_and_is_left_as_it_was(
    live_server, backend
):
    """A worker hands its own ``Engine``: the core's writes run at READ
    COMMITTED on MariaDB (the hot path takes the driver's connection from the
    pool itself, where an isolation level set at a ``Connection``'s checkout
    never applied: its transactions ran at the worker's REPEATABLE READ),
    while the worker's own connections keep the level it chose."""
    worker_engine = create_engine(database_of(live_server))
    try:
        embedded = Embedded(worker_engine)
        with LockClient(
            live_server.url,
            live_server.token,
            transport=EmbeddedTransport(embedded),
        ) as client:
            with client.lock("emb:own-engine", ttl=10) as held:
                assert held.fence >= 1
        if backend == "mariadb":
            writes = embedded.service.core.write_engine
            for engine in (writes, embedded.service.core.reads):
                raw = engine.raw_connection()
                try:
                    cursor = raw.cursor()
                    cursor.execute("SELECT @@tx_isolation")
                    assert cursor.fetchone()[0] == "READ-COMMITTED", engine
                finally:
                    raw.close()
            with worker_engine.connect() as conn:
                level = conn.exec_driver_sql("SELECT @@tx_isolation").scalar()
            assert level == "REPEATABLE-READ"
        embedded.close()
        # The worker's engine is the worker's: still usable after the close.
        with worker_engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        worker_engine.dispose()
