"""Waiting for a held lock: first in the server's line, then by polling.

The server grants waiting acquires in order of arrival and hands a released lock
over at once, so a wait is spent in its line, in requests of at most
``client.max_server_wait`` seconds. When the server's waiting room is full (503),
the server does not wait (an older one), or it cannot be reached, the rest of the
wait polls: exponential backoff with full jitter, each delay capped by the
``Retry-After`` of the refusal (the holder's remaining ttl). A wait never lasts
longer than asked.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_result,
    stop_after_delay,
)

from app.client.errors import InvalidRequest, LockNotAcquired, ServiceUnavailable
from app.client.grants import AcquireAttempt

if TYPE_CHECKING:
    from app.client.http import LockClient

_MAX_WAIT_MESSAGE = re.compile(r"at most ([0-9.]+(?:e[+-]?[0-9]+)?)")


def server_max_wait(exc: InvalidRequest) -> float | None:
    """The server's largest ``wait`` from its 400, or None when it names none
    (an older server that does not know ``wait``)."""
    for field, message in exc.errors:
        if field == "wait":
            found = _MAX_WAIT_MESSAGE.search(message)
            return float(found.group(1)) if found else None
    return None


class GrantWait:
    """One wait of up to ``wait`` seconds for ``resource``; ``run()`` returns the
    grant. ``sent_at`` is the ``time.monotonic()`` at which the granted request
    left: the lock surely ends no later than that plus its ttl."""

    def __init__(
        self, client: LockClient, resource: str, *, owner: str, ttl: float, wait: float
    ):
        self.client = client
        self.resource = resource
        self.owner = owner
        self.ttl = ttl
        self.wait = wait
        self.sent_at = 0.0
        self._unreachable: ServiceUnavailable | None = None

    def run(self) -> AcquireAttempt:
        """:raise LockNotAcquired: another owner held it for the whole wait.
        :raise ServiceUnavailable: the service could not be reached in that time.
        """
        deadline = time.monotonic() + self.wait
        result = self._in_line(deadline)
        if result is None:
            result = self._poll(deadline)
        return result

    def _in_line(self, deadline: float) -> AcquireAttempt | None:
        """Wait in the server's line in chunks until granted or ``deadline``.

        Returns the grant, or None when the rest of the wait must poll (the
        waiting room is full, the server does not wait, or no wait was asked).
        :raise LockNotAcquired: the whole wait ran out in line.
        """
        client = self.client
        last: AcquireAttempt | None = None
        while True:
            remaining = deadline - time.monotonic()
            chunk = min(remaining, client.max_server_wait)
            if chunk < 0.001:
                if last is None:
                    return None  # wait=0: one plain try, by the polling path
                raise self._not_acquired(last)
            self.sent_at = time.monotonic()
            try:
                last = client.acquire(self.resource, self.owner, self.ttl, wait=chunk)
            except InvalidRequest as exc:
                server_max = server_max_wait(exc)
                if server_max is None or server_max >= client.max_server_wait:
                    client.max_server_wait = 0.0  # the server does not wait: poll
                    return None
                client.max_server_wait = server_max
                continue
            except ServiceUnavailable:
                return None  # the polling path retries for the rest of the wait
            if last.acquired:
                return last
            if last.waiting_room_full:
                return None

    def _poll(self, deadline: float) -> AcquireAttempt:
        retrying = Retrying(
            retry=retry_if_result(lambda result: not result.acquired),
            wait=self._contention_delay,
            stop=stop_after_delay(max(deadline - time.monotonic(), 0.0)),
        )
        try:
            return retrying(self._attempt, deadline)
        except RetryError as exc:
            last = exc.last_attempt.result()
            if last.lock is None and self._unreachable is not None:
                raise self._unreachable from None
            raise self._not_acquired(last) from None

    def _attempt(self, deadline: float) -> AcquireAttempt:
        self.sent_at = time.monotonic()
        try:
            result = self.client.acquire(self.resource, self.owner, self.ttl)
        except ServiceUnavailable as exc:
            if time.monotonic() >= deadline:
                raise
            # Unreachable for a moment: count it as a refusal and wait on.
            self._unreachable = exc
            return AcquireAttempt(False, None, None)
        self._unreachable = None
        return result

    def _contention_delay(self, state: RetryCallState) -> float:
        result: AcquireAttempt = state.outcome.result()
        client = self.client
        window = min(
            client.max_backoff,
            client.max_lock_poll,
            client.backoff * 2 ** (state.attempt_number - 1),
        )
        delay = client.rng.uniform(0, window)
        if result.retry_after:
            delay = min(delay, result.retry_after)
        remaining = self.wait - state.seconds_since_start
        return max(min(delay, remaining), 0.0)

    def _not_acquired(self, last: AcquireAttempt) -> LockNotAcquired:
        holder = f" by {last.lock.owner!r}" if last.lock else ""
        return LockNotAcquired(
            self.resource,
            f"lock {self.resource!r} stayed held{holder} for {self.wait:g} s",
            last.lock,
        )
