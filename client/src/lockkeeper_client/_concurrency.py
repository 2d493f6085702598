"""The few primitives that differ between the asyncio client and the blocking one,
each written twice side by side. ``_async/`` uses the ``Async…``/``async_…``
names; the generated ``_sync/`` code uses the plain names (scripts/unasync.py maps
one onto the other)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

AsyncEvent = asyncio.Event
Event = threading.Event


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


async def async_wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; whether it is set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
    return event.is_set()


def wait_event(event: threading.Event, timeout: float) -> bool:
    return event.wait(timeout)


async def async_shielded(run: Callable[[], Awaitable[None]]) -> None:
    """Run ``run()`` to its end even when the caller is cancelled meanwhile: a
    second cancel ends the caller's wait, never the work."""
    await asyncio.shield(asyncio.ensure_future(run()))


def shielded(run: Callable[[], None]) -> None:
    run()


class AsyncBackground:
    """A coroutine function running as a task of the current loop until it ends."""

    def __init__(self, run: Callable[[], Awaitable[None]], name: str):
        async def main() -> None:
            await run()

        self._task = asyncio.get_running_loop().create_task(main(), name=name)

    async def join(self) -> None:
        await self._task


class Background:
    """A function running in a daemon thread until it returns."""

    def __init__(self, run: Callable[[], None], name: str):
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
