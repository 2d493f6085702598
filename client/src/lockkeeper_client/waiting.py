"""Waiting for a held lock: in the server's line, retried until the wait ends.

The server grants waiting acquires in order of arrival and hands a released lock
over at once, so a wait is spent in its line, in requests of at most
``client.max_server_wait`` seconds, one after another. When the server's waiting
room is full (503) or it cannot be reached, the client backs off (exponential,
full jitter, each delay capped by the ``Retry-After`` of the refusal) and asks to
join the line again: a plain acquire would never be granted while others wait in
line (it may not jump it), so a client turned away by a full room keeps asking
for a place rather than polling. Against a server that does not wait (an older
one) every attempt is such a plain acquire. A wait never lasts longer than asked.
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

from lockkeeper_client.errors import InvalidRequest, LockNotAcquired, ServiceUnavailable
from lockkeeper_client.grants import AcquireAttempt

if TYPE_CHECKING:
    from lockkeeper_client.http import LockClient

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
        self._in_line_for = 0.0  # the wait of the last attempt (0: a plain one)
        self._unreachable: ServiceUnavailable | None = None

    def run(self) -> AcquireAttempt:
        """:raise LockNotAcquired: another owner held it for the whole wait.
        :raise ServiceUnavailable: the service could not be reached in that time.
        """
        deadline = time.monotonic() + self.wait
        retrying = Retrying(
            retry=retry_if_result(lambda result: not result.acquired),
            wait=self._delay,
            stop=stop_after_delay(self.wait),
        )
        try:
            return retrying(self._attempt, deadline)
        except RetryError as exc:
            last = exc.last_attempt.result()
            if last.lock is None and self._unreachable is not None:
                raise self._unreachable from None
            raise self._not_acquired(last) from None

    def _attempt(self, deadline: float) -> AcquireAttempt:
        """One acquire: waiting in the server's line for the rest of the wait (at
        most ``client.max_server_wait``), or a plain one when the server does
        not wait."""
        client = self.client
        while True:
            self.sent_at = time.monotonic()
            chunk = min(deadline - self.sent_at, client.max_server_wait)
            self._in_line_for = chunk if chunk >= 0.001 else 0.0
            try:
                result = client.acquire(
                    self.resource, self.owner, self.ttl, wait=self._in_line_for
                )
            except InvalidRequest as exc:
                if not self._in_line_for:
                    raise
                server_max = server_max_wait(exc)
                if server_max is None or server_max >= client.max_server_wait:
                    server_max = 0.0  # the server does not wait: plain acquires
                client.max_server_wait = server_max
                continue  # at once, with a wait the server takes
            except ServiceUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise
                # Unreachable for a moment: count it as a refusal and wait on.
                self._unreachable = exc
                return AcquireAttempt(False, None, None)
            self._unreachable = None
            return result

    def _delay(self, state: RetryCallState) -> float:
        """0 after a turn in line that ran out (join the line again at once);
        else the backoff of a poll."""
        assert state.outcome is not None  # called after an attempt
        result: AcquireAttempt = state.outcome.result()
        waited = time.monotonic() - self.sent_at
        # A turn in line ends early only when the server's line is not to be had
        # (the room is full) or something unexpected: never retry that at once.
        if self._in_line_for and not result.waiting_room_full:
            if waited >= self._in_line_for / 2:
                return 0.0
        return self._contention_delay(state)

    def _contention_delay(self, state: RetryCallState) -> float:
        assert state.outcome is not None
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
        remaining = self.wait - (state.seconds_since_start or 0.0)
        return max(min(delay, remaining), 0.0)

    def _not_acquired(self, last: AcquireAttempt) -> LockNotAcquired:
        holder = f" by {last.lock.owner!r}" if last.lock else ""
        return LockNotAcquired(
            self.resource,
            f"lock {self.resource!r} stayed held{holder} for {self.wait:g} s",
            last.lock,
        )
