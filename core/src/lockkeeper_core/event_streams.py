"""The audit log followed in process, for the embedded mode's ``watch()``: the
server's stream messages, read from the events table by the same follower
(``lockkeeper_core.follow``) that serves the server's stream."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from lockkeeper_core import wire
from lockkeeper_core.follow import (
    EventFilter,
    FollowPosition,
    FollowWakeup,
    follow_step,
)
from lockkeeper_core.queue import WaitQueue

# A quiet stream's longest sleep before it looks again (the server's keepalive).
STREAM_KEEPALIVE = 15.0


class EventStream(httpx.SyncByteStream):
    """One followed stream of the audit log, in process: the server's stream
    messages (``: open`` with the id it starts after, then ``id:``/``data:``
    per event), each read when the reader asks for more.

    Between looks it sleeps as the server's stream does (``FollowWakeup``:
    PostgreSQL's NOTIFY, else ``stream_poll``) in the reading thread: the
    blocking face's caller, or a thread of the asyncio transport's pool
    (``AsyncEventStream``). A database that stops answering ends the stream
    with a read error, which the client's ``watch()`` takes as a dropped
    connection: it reconnects after the last id it saw, missing nothing."""

    def __init__(
        self,
        engine: Engine,
        queue: WaitQueue,
        poll: float,
        streams: set[EventStream],
        filters: EventFilter,
        start: FollowPosition,
    ):
        self._engine = engine
        self._filters = filters
        self._position = start
        self._poll = poll
        self._wakeup = FollowWakeup(queue, self._engine, self._poll)
        self._opening: bytes | None = f": open\nid: {start.after}\n\n".encode()
        self.closed = threading.Event()
        # Held while a look or a sleep runs: the wake-up's registration is
        # undone by ``close`` only once none does.
        self._busy = threading.Lock()
        self._entered = False
        self._streams = streams  # the open ones, ended when their owner closes
        self._streams.add(self)

    def still_there(self) -> bool:
        return not self.closed.is_set()

    def next_chunk(self) -> bytes:
        """The next messages (several events at once when they are there),
        or b"" once the stream is closed."""
        with self._busy:
            if self.closed.is_set():
                return b""
            if self._opening is not None:
                opening, self._opening = self._opening, None
                self._wakeup.__enter__()
                self._entered = True
                return opening
            while not self.closed.is_set():
                try:
                    found, self._position = follow_step(
                        self._engine, self._filters, self._position
                    )
                except DBAPIError as exc:
                    raise httpx.ReadError(
                        f"the lock database did not answer: {type(exc.orig).__name__}"
                    ) from exc
                if found:
                    return "".join(
                        f"id: {event.id}\ndata: "
                        f"{json.dumps(wire.event_to_json(event))}\n\n"
                        for event in found
                    ).encode()
                position = self._position
                # Waiting for an open transaction to end: no NOTIFY says so.
                settling = position.pending is not None or position.hole is not None
                self._wakeup.wait(
                    self._poll if settling else STREAM_KEEPALIVE, self.still_there
                )
            return b""

    def __iter__(self):
        while chunk := self.next_chunk():
            yield chunk

    def close(self) -> None:
        self.closed.set()
        self._streams.discard(self)
        with self._busy:
            if self._entered:
                self._entered = False
                self._wakeup.__exit__(None, None, None)


class AsyncEventStream(httpx.AsyncByteStream):
    """``EventStream`` for the asyncio face: each look and sleep runs in a
    thread of the transport's pool, never on the event loop; a reader that
    stops (or is cancelled) ends the sleep at its next look."""

    def __init__(self, stream: EventStream, pool: ThreadPoolExecutor):
        self._stream = stream
        self._pool = pool

    async def __aiter__(self):
        loop = asyncio.get_running_loop()
        try:
            while chunk := await loop.run_in_executor(
                self._pool, self._stream.next_chunk
            ):
                yield chunk
        finally:
            self._stream.closed.set()

    async def aclose(self) -> None:
        self._stream.closed.set()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._stream.close)
