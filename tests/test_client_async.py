"""``AsyncLockClient`` as asyncio code uses it (anyio's pytest plugin, asyncio):
many tasks of one event loop, ``async with``, ``lock.lost`` awaited.

The behaviours both clients share are tested once, against both, in
tests/test_client.py; this file is what only the asyncio face has."""

from __future__ import annotations

import asyncio
import time

import pytest
from lockkeeper_client import AsyncLockClient, LockLost, LockMissing, LockNotAcquired


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_sixteen_tasks_of_one_loop_take_turns_and_never_overlap(
    live_server, backend
):
    inside = 0
    most_inside = 0
    fences = []

    async def worker(client: AsyncLockClient) -> None:
        nonlocal inside, most_inside
        async with client.lock("job:async", ttl=10, wait=60) as lock:
            inside += 1
            most_inside = max(most_inside, inside)
            fences.append(lock.fence)
            await asyncio.sleep(0.01)  # other tasks run meanwhile: the loop is free
            inside -= 1

    async with AsyncLockClient(live_server.url, live_server.token) as client:
        await asyncio.gather(*(worker(client) for _ in range(16)))
        with pytest.raises(LockMissing):
            await client.get("job:async")
    assert most_inside == 1
    assert len(fences) == 16
    assert fences == sorted(fences)  # granted in turn, each a later fence


@pytest.mark.anyio
async def test_lost_is_an_asyncio_event_a_task_can_await(live_server):
    async with AsyncLockClient(live_server.url, live_server.token) as client:
        lock = client.lock("job:42", ttl=1, renew_every=0.05)

        async def block():
            async with lock:
                assert isinstance(lock.lost, asyncio.Event)
                await asyncio.to_thread(live_server.force_release, "job:42")
                await asyncio.wait_for(lock.lost.wait(), 5)
                assert "job:42" in lock.lost_reason

        with pytest.raises(LockLost, match="job:42"):
            await block()


@pytest.mark.anyio
async def test_waiting_for_a_held_lock_does_not_block_the_event_loop(live_server):
    async with AsyncLockClient(live_server.url, live_server.token) as client:
        assert (await client.acquire("job:busy", "holder", ttl=30)).acquired
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.get_running_loop().create_task(tick())
        start = time.monotonic()
        with pytest.raises(LockNotAcquired):
            async with client.lock("job:busy", ttl=5, wait=0.5):
                pytest.fail("the block must not run without the lock")
        ticker.cancel()
        waited = time.monotonic() - start
    assert waited >= 0.5
    assert ticks >= 10  # the loop kept running other tasks while it waited


class _ImportRecorder:
    """A meta path finder that finds nothing and records every name asked for: a
    name asked for again and again is an import that failed (Python does not
    cache a failed import) and searched the whole path each time."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name, path=None, target=None):
        self.asked.append(name)
        return None


@pytest.mark.anyio
async def test_a_request_of_the_async_client_imports_nothing(live_server):
    """httpcore asks ``import sniffio`` in every request of its async pool and
    falls back to asyncio when that fails; since anyio stopped depending on
    sniffio, a missing sniffio made every request search the import path (a
    fifth of the async client's CPU per request on a keep-alive connection).
    The client depends on sniffio for that reason."""
    import sys

    recorder = _ImportRecorder()
    async with AsyncLockClient(live_server.url, live_server.token) as client:
        await client.acquire("job:imports", "w-1", 10)  # warm: lazy imports done
        await client.release("job:imports", "w-1")
        sys.meta_path.insert(0, recorder)
        try:
            for _ in range(5):
                await client.acquire("job:imports", "w-1", 10)
                await client.release("job:imports", "w-1")
        finally:
            sys.meta_path.remove(recorder)
    assert recorder.asked == []


@pytest.mark.anyio
async def test_synchronized_decorates_a_coroutine_function(live_server):
    async with AsyncLockClient(live_server.url, live_server.token) as client:

        @client.synchronized("job:async-sync", ttl=5, wait=1)
        async def job(n: int) -> str:
            return (await client.get("job:async-sync")).owner + f":{n}"

        assert (await job(3)).endswith(":3")
        with pytest.raises(LockMissing):
            await client.get("job:async-sync")
