"""Both clients behind one blocking surface, so one behavioural suite runs on each.

``connect("sync", url, token)`` is a ``LockClient``. ``connect("async", ...)`` is
an ``AsyncLockClient`` whose coroutines run on an event loop in a thread of its
own (anyio's blocking portal): the test calls ``client.acquire(...)`` or enters
``with client.lock(...) as lock`` exactly as with the blocking client, and
``lock.lost`` is the ``asyncio.Event`` the async lock sets, read from the test's
thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from typing import Any

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from lockkeeper_client import AsyncHeldLock, AsyncLockClient, LockClient

FLAVOURS = ("sync", "async")
# The same two faces on the in-process transport (``lockkeeper_core.embedded``): no
# server between the client and the database.
EMBEDDED_FLAVOURS = ("embedded-sync", "embedded-async")


class _SeenSync(httpx.HTTPTransport):
    def __init__(self, sent: threading.Event):
        super().__init__()
        self.sent = sent

    def handle_request(self, request):
        if request.method == "POST":
            self.sent.set()
        return super().handle_request(request)


class _SeenAsync(httpx.AsyncHTTPTransport):
    def __init__(self, sent: threading.Event):
        super().__init__()
        self.sent = sent

    async def handle_async_request(self, request):
        if request.method == "POST":
            self.sent.set()
        return await super().handle_async_request(request)


class BlockingEvent:
    """An ``asyncio.Event`` read from another thread, as a ``threading.Event``."""

    def __init__(self, portal: BlockingPortal, event: asyncio.Event):
        self._portal = portal
        self.event = event

    def is_set(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        async def wait() -> bool:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), timeout)
            return self.event.is_set()

        return self._portal.call(wait)


class BlockingHeld:
    """An ``AsyncHeldLock`` driven through the portal."""

    def __init__(self, portal: BlockingPortal, held: AsyncHeldLock):
        self._portal = portal
        self.held = held
        self.lost = BlockingEvent(portal, held.lost)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.held, name)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.held

    __hash__ = object.__hash__

    def acquire(self) -> None:
        self._portal.call(self.held.acquire)

    def release(self) -> None:
        self._portal.call(self.held.release)

    def __enter__(self) -> BlockingHeld:
        self.acquire()
        return self

    def check(self) -> None:
        self._portal.call(self._check)

    def extend(self, ttl: float | None = None) -> None:
        self._portal.call(self.held.extend, ttl)

    def locked(self) -> float:
        return self._portal.call(self.held.locked)

    async def _check(self) -> None:
        self.held.check()

    def __exit__(self, *exc_info: Any) -> None:
        self._portal.call(self.held.__aexit__, *exc_info)


class BlockingAsyncClient:
    """An ``AsyncLockClient`` with the blocking client's surface."""

    def __init__(self, portal: BlockingPortal, client: AsyncLockClient, stop):
        self._portal = portal
        self.client = client
        self._stop = stop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if inspect.iscoroutinefunction(attribute):

            def call(*args, **kwargs):
                return self._portal.call(functools.partial(attribute, *args, **kwargs))

            return call
        return attribute

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name == "client":
            super().__setattr__(name, value)
        else:
            setattr(self.client, name, value)

    def lock(self, *args, **kwargs) -> BlockingHeld:
        return BlockingHeld(self._portal, self.client.lock(*args, **kwargs))

    def lock_all(self, *args, **kwargs) -> BlockingHeld:
        """A held set (``AsyncHeldSet``) behind the same blocking surface."""
        return BlockingHeld(self._portal, self.client.lock_all(*args, **kwargs))

    def close(self) -> None:
        if self._stop is None:
            return
        try:
            self._portal.call(self.client.aclose)
        finally:
            self._stop()
            self._stop = None

    def __enter__(self) -> BlockingAsyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _embedded(flavour: str, database: str, acquire_sent: threading.Event | None):
    from lockkeeper_core.embedded import AsyncEmbeddedTransport, EmbeddedTransport

    # The client's calls come in through ``lockkeeper_request``, not as HTTP
    # requests (only the followed event stream is one).
    class SeenSync(EmbeddedTransport):
        def lockkeeper_request(self, method, path, **parts):
            if method == "POST" and acquire_sent is not None:
                acquire_sent.set()
            return super().lockkeeper_request(method, path, **parts)

    class SeenAsync(AsyncEmbeddedTransport):
        async def lockkeeper_request(self, method, path, **parts):
            if method == "POST" and acquire_sent is not None:
                acquire_sent.set()
            return await super().lockkeeper_request(method, path, **parts)

    return (SeenSync if flavour == "embedded-sync" else SeenAsync)(database)


def connect(
    flavour: str,
    url: str,
    token: str,
    *,
    acquire_sent: threading.Event | None = None,
    database: str | None = None,
    **options: Any,
) -> LockClient | BlockingAsyncClient:
    """A client of ``flavour``; ``acquire_sent`` is set once an acquire has gone
    out to the server. The embedded flavours answer in process on ``database``
    (``url`` is then only the client's label)."""
    if flavour in EMBEDDED_FLAVOURS:
        assert database is not None, "an embedded client needs its database"
        options["transport"] = _embedded(flavour, database, acquire_sent)
        flavour = flavour.removeprefix("embedded-")
        acquire_sent = None
    if flavour == "sync":
        if acquire_sent is not None:
            options["transport"] = _SeenSync(acquire_sent)
        return LockClient(url, token, **options)
    if acquire_sent is not None:
        options["transport"] = _SeenAsync(acquire_sent)
    portal_context = start_blocking_portal()
    portal = portal_context.__enter__()

    async def make() -> AsyncLockClient:
        return AsyncLockClient(url, token, **options)

    return BlockingAsyncClient(
        portal, portal.call(make), lambda: portal_context.__exit__(None, None, None)
    )
