"""Following the audit log: the iterator behind ``client.watch(...)``.

It reads ``GET /api/v1/events?follow=true`` and, when the connection drops (or
the stream stays silent past its idle timeout, or the server is briefly
unavailable), reconnects with ``Last-Event-ID`` set to the last id it saw, so
the caller gets every event once, in id order, across reconnects. The server's
opening message names where a stream starts, so even a drop before the first
event loses nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
from httpx_sse import aconnect_sse

from lockkeeper_client import decisions
from lockkeeper_client._concurrency import async_sleep
from lockkeeper_client.grants import LockEvent


async def follow_events(
    http: httpx.AsyncClient,
    params: dict[str, str],
    *,
    after: int | None,
    new_retries: Callable[[], decisions.TransientRetries],
    timeout: httpx.Timeout,
    base_url: str,
) -> AsyncIterator[LockEvent]:
    """Every event matching ``params`` after ``after`` (None: from now).

    :raise ServiceUnavailable: reconnecting failed for as long as
        ``new_retries()`` allows (by default: never). :raise AccessDenied,
        AuthenticationFailed, InvalidRequest: the server refused the stream.
    """
    last_id = after
    retries = new_retries()
    while True:
        error: httpx.TransportError | None = None
        refused: httpx.Response | None = None
        try:
            async with aconnect_sse(
                http,
                "GET",
                decisions.EVENTS_PATH,
                params=params,
                headers=decisions.watch_headers(last_id),
                timeout=timeout,
            ) as source:
                response = source.response
                if response.status_code in decisions.TRANSIENT_STATUSES:
                    await response.aread()
                    refused = response
                elif response.status_code != 200:
                    await response.aread()
                    raise decisions.watch_failure(response)
                else:
                    async for message in source.aiter_sse():
                        message_id, event = decisions.watch_message(
                            message.id, message.data
                        )
                        if message_id is not None:
                            last_id = message_id
                            retries = new_retries()  # it reads: a fresh budget
                        if event is not None:
                            yield event
        except httpx.TransportError as exc:  # a drop, or silence past the timeout
            error = exc
        if error is None and refused is None:
            continue  # the server ended the stream (a restart): at once again
        delay = retries.next_delay(error=error, response=refused)
        if delay is None:
            raise retries.gave_up(
                "GET", decisions.EVENTS_PATH, base_url, error=error, response=refused
            )
        await async_sleep(delay)
