"""``client.watch(...)``: the followed audit log through both clients, against a
live server behind a TCP relay that the test cuts to force reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from lockkeeper_client import AccessDenied, AsyncLockClient, LockClient, LockEvent
from lockkeeper_core.models import LockEvent as EventRow
from sqlalchemy import select

from app.auth.service import create_token
from app.extensions import db

events_table = EventRow.__table__


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Relay:
    """127.0.0.1:port → the server: every byte both ways, until ``cut()`` shuts
    every relayed connection down (as a network failure would)."""

    def __init__(self, target: str):
        host, port = target.removeprefix("http://").split(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            outbound = socket.create_connection(self._target)
            with self._lock:
                self._open += [inbound, outbound]
                self.accepted += 1
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(
                    target=self._pump, args=(source, sink), daemon=True
                ).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            found, self._open = self._open, []
        for sock in found:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut()
        self._listener.close()


@pytest.fixture
def relay(live_server):
    found = Relay(live_server.url)
    yield found
    found.close()


def streams_open(server) -> int:
    """The server's open streams: a stream started "from now" counts once its
    starting point is taken."""
    text = httpx.get(server.url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("lockkeeper_open_streams"))
    return int(float(line.split()[-1]))


def grant(server, resource: str) -> None:
    with server.service() as locks:
        assert locks.acquire(resource, "w", 30).acquired


def event_ids(server, prefix: str) -> list[int]:
    with server.app.app_context(), db.engine.connect() as conn:
        return list(
            conn.scalars(
                select(events_table.c.id)
                .where(events_table.c.resource.startswith(prefix))
                .order_by(events_table.c.id)
            )
        )


def test_watch_resumes_after_a_dropped_connection_without_gaps_or_repeats(
    live_server, relay
):
    got: list[LockEvent] = []
    done = threading.Event()
    client = LockClient(relay.url, live_server.token, backoff=0.05)

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
        wait_until(lambda: streams_open(live_server) == 1, what="the stream to open")
        for n in range(5):
            grant(live_server, f"w:{n}")
        grant(live_server, "other:1")  # outside the filter
        wait_until(lambda: len(got) == 5, what="the first five")
        relay.cut()
        for n in range(5, 10):
            grant(live_server, f"w:{n}")  # while it reconnects
        assert done.wait(20)
    finally:
        client.close()
    assert relay.accepted >= 2
    assert [event.id for event in got] == event_ids(live_server, "w:")
    assert [event.resource for event in got] == [f"w:{n}" for n in range(10)]
    assert all(event.action == "acquired" for event in got)


def test_watch_of_an_out_of_scope_resource_is_access_denied(live_server):
    with live_server.app.app_context():
        scoped = create_token("scoped", prefixes=["team-a:"])
    with LockClient(live_server.url, scoped) as client:
        with pytest.raises(AccessDenied):
            next(iter(client.watch(resource="team-b:1")))


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_async_watch_resumes_after_a_dropped_connection(live_server, relay):
    got: list[LockEvent] = []

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

    async with AsyncLockClient(relay.url, live_server.token, backoff=0.05) as client:
        task = asyncio.create_task(consume(client))
        await until(lambda: streams_open(live_server) == 1, "the stream to open")
        for n in range(3):
            await asyncio.to_thread(grant, live_server, f"a:{n}")
        await until(lambda: len(got) == 3, "the first three")
        relay.cut()
        for n in range(3, 6):
            await asyncio.to_thread(grant, live_server, f"a:{n}")
        await asyncio.wait_for(task, 20)
    assert relay.accepted >= 2
    assert [event.id for event in got] == event_ids(live_server, "a:")
