"""``client.watch(...)`` in the embedded mode: the followed audit log read from
the events table in the worker's own process, both faces, every database.

The cases of ``tests/test_client_watch.py`` again, with the in-process
transport: the TCP relay those cut has no counterpart here, so a database that
stops answering in the middle of the stream stands for the dropped connection
(the client reconnects after the last id it saw: no gap, no repeat).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from lockkeeper_client import AccessDenied, AsyncLockClient, LockClient, LockEvent
from lockkeeper_core import event_streams as streams_module
from lockkeeper_core.embedded import AsyncEmbeddedTransport, EmbeddedTransport
from lockkeeper_core.models import LockEvent as EventRow
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from app.auth.service import create_token
from app.extensions import db, lock_service

pytestmark = pytest.mark.usefixtures("backend")

events_table = EventRow.__table__


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def token(app) -> str:
    with app.app_context():
        return create_token("embedded-watcher")


def grant(app, resource: str) -> None:
    """A grant through the server's own service: another door, one log."""
    with app.app_context():
        assert lock_service().acquire(resource, "w", 30).acquired


def event_ids(app, prefix: str) -> list[int]:
    with app.app_context(), db.engine.connect() as conn:
        return list(
            conn.scalars(
                select(events_table.c.id)
                .where(events_table.c.resource.startswith(prefix))
                .order_by(events_table.c.id)
            )
        )


class DatabaseDrops:
    """``follow_step`` fails ``times`` times once ``armed``, as a database
    that stops answering: the stream ends with a read error."""

    def __init__(self, monkeypatch, times: int = 2):
        self.armed = threading.Event()
        self.left = times
        real = streams_module.follow_step

        def follow_step(*args, **kwargs):
            if self.armed.is_set() and self.left > 0:
                self.left -= 1
                raise OperationalError("SELECT", {}, ConnectionError("dropped"))
            return real(*args, **kwargs)

        monkeypatch.setattr(streams_module, "follow_step", follow_step)


def database(app) -> str:
    return app.config["SQLALCHEMY_DATABASE_URI"]


def test_embedded_watch_resumes_after_the_database_drops_without_gaps_or_repeats(
    app, token, monkeypatch
):
    drops = DatabaseDrops(monkeypatch)
    transport = EmbeddedTransport(database(app))
    client = LockClient("http://embedded", token, transport=transport, backoff=0.05)
    got: list[LockEvent] = []
    done = threading.Event()

    def consume():
        try:
            for event in client.watch(prefix="w:"):
                got.append(event)
                if len(got) == 10:
                    return
        finally:
            done.set()

    threading.Thread(target=consume, daemon=True).start()
    try:
        streams = transport.embedded.streams
        wait_until(lambda: len(streams) == 1, what="the stream to open")
        for n in range(5):
            grant(app, f"w:{n}")
        grant(app, "other:1")  # outside the filter
        wait_until(lambda: len(got) == 5, what="the first five")
        drops.armed.set()
        # The database drops first: a look already under way when it was
        # armed could otherwise read the last five and end the watch before
        # any look failed (seen under load).
        wait_until(lambda: drops.left < 2, what="the database to drop")
        for n in range(5, 10):
            grant(app, f"w:{n}")  # while it reconnects
        assert done.wait(20)
    finally:
        client.close()
    assert drops.left < 2, "the stream never met the dropped database"
    assert [event.id for event in got] == event_ids(app, "w:")
    assert [event.resource for event in got] == [f"w:{n}" for n in range(10)]
    assert all(event.action == "acquired" for event in got)


def test_embedded_watch_of_an_out_of_scope_resource_is_access_denied(app):
    with app.app_context():
        scoped = create_token("scoped", prefixes=["team-a:"])
    transport = EmbeddedTransport(database(app))
    with LockClient("http://embedded", scoped, transport=transport) as client:
        with pytest.raises(AccessDenied):
            next(iter(client.watch(resource="team-b:1")))


def test_embedded_watch_sees_only_the_tokens_scope(app):
    """A prefix filter wider than the token's scope still sees only the
    scope's events (the server narrows its streams the same way)."""
    with app.app_context():
        scoped = create_token("scoped-b", prefixes=["team-b:"])
    transport = EmbeddedTransport(database(app))
    grant(app, "team-a:1")
    grant(app, "team-b:1")
    with LockClient("http://embedded", scoped, transport=transport) as client:
        assert next(iter(client.watch(prefix="team-", after=0))).resource == "team-b:1"


def test_async_embedded_watch_resumes_after_the_database_drops(app, token, monkeypatch):
    drops = DatabaseDrops(monkeypatch)
    got: list[LockEvent] = []
    on_the_loop: list[str] = []

    async def consume(client: AsyncLockClient):
        async for event in client.watch(prefix="a:"):
            got.append(event)
            if len(got) == 6:
                return

    async def until(condition, what: str):
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.01)

    async def main():
        transport = AsyncEmbeddedTransport(database(app))
        real = streams_module.follow_step

        def step(*args, **kwargs):
            # The core's reads never run on the event loop's thread.
            try:
                asyncio.get_running_loop()
                on_the_loop.append(threading.current_thread().name)
            except RuntimeError:
                pass
            return real(*args, **kwargs)

        monkeypatch.setattr(streams_module, "follow_step", step)
        async with AsyncLockClient(
            "http://embedded", token, transport=transport, backoff=0.05
        ) as client:
            task = asyncio.create_task(consume(client))
            streams = transport.embedded.streams
            await until(lambda: len(streams) == 1, "the stream to open")
            for n in range(3):
                await asyncio.to_thread(grant, app, f"a:{n}")
            await until(lambda: len(got) == 3, "the first three")
            drops.armed.set()
            for n in range(3, 6):
                await asyncio.to_thread(grant, app, f"a:{n}")
            await asyncio.wait_for(task, 20)
            # The reader gone, its stream closes (its wake-up undone).
            await until(lambda: not streams, "the stream to close")

    asyncio.run(main())
    assert drops.left == 0, "the stream never met the dropped database"
    assert on_the_loop == []
    assert [event.id for event in got] == event_ids(app, "a:")


def test_an_async_watcher_cancelled_while_it_sleeps_lets_go_of_its_thread(app, token):
    async def main():
        transport = AsyncEmbeddedTransport(database(app), threads=1)
        async with AsyncLockClient("http://embedded", token, transport=transport) as c:

            async def first():
                async for event in c.watch(prefix="none:"):
                    return event

            task = asyncio.create_task(first())
            deadline = time.monotonic() + 20
            while not transport.embedded.streams:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)  # the stream is asleep in the pool's thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The pool's only thread is free again: the next call is answered.
            granted = await asyncio.wait_for(c.acquire("after:1", "w", 30), 10)
            assert granted.acquired

    asyncio.run(main())
