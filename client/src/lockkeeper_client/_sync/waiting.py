# Generated from _async/ by client/scripts/make_sync.py: edit that.
"""Waiting for a held lock: in the server's line, retried until the wait ends.

The server grants waiting acquires in order of arrival and hands a released lock
over at once, so a wait is spent in its line, in requests of at most
``client.max_server_wait`` seconds, one after another. When the server's waiting
room is full (503) or it cannot be reached, the client backs off (exponential,
full jitter, each delay capped by the ``Retry-After`` of the refusal) and asks to
join the line again: a plain acquire would never be granted while others wait in
line (it may not jump it), so a client turned away by a full room keeps asking
for a place rather than polling. Each request asks the server to keep its place
if the room turns it away (``place``): the server then keeps it for 2 s
and names it, and the next try (within ``KEPT_PLACE_POLL``) presents it, so a
wait turned away is not overtaken by those who came after it. Against a server
that does not wait (an older one) every attempt is such a plain acquire; one
that does not keep places is asked without. A wait longer than the server's
largest is a run of requests; each but the last asks the server to keep its
place when it runs out (``rejoin``), and the next presents it at once, so a
long wait is not put behind those who came after it at every request. A wait
never lasts longer than asked.

A wait cancelled by its caller (an asyncio ``timeout()`` or ``cancel()``; a
``KeyboardInterrupt`` in the blocking client) while a request was out may have
been granted at the server meanwhile: it releases what it may hold, in a release
the cancel cannot interrupt, before the cancel goes on; a grant the server makes
after that release (it notices the closed connection within a quarter second)
is released by a second look then, in the background.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from lockkeeper_client import decisions
from lockkeeper_client._concurrency import (
    Background,
    shielded,
    sleep,
)
from lockkeeper_client.errors import (
    InvalidRequest,
    LockClientError,
    LockLost,
    ServiceUnavailable,
)
from lockkeeper_client.grants import EXCLUSIVE, AcquireAttempt, LockKind

if TYPE_CHECKING:
    from lockkeeper_client._sync.port import LockPort


class GrantWait:
    """One wait of up to ``wait`` seconds for ``resource``; ``run()`` returns the
    grant. ``sent_at`` is the ``time.monotonic()`` at which the granted request
    left: the lock surely ends no later than that plus its ttl."""

    def __init__(
        self,
        client: LockPort,
        resource: str,
        *,
        owner: str,
        ttl: float | None,
        wait: float | None,
        session: str | None = None,
        kind: LockKind = EXCLUSIVE,
    ):
        self.client = client
        self.session = session
        self.resource = resource
        self.owner = owner
        self.ttl = ttl
        self.wait = math.inf if wait is None else wait  # None: until granted
        self.kind = kind
        self.sent_at = 0.0
        self._in_line_for = 0.0  # the wait of the last attempt (0: a plain one)
        # The place in line the server kept for this wait, 0 for "keep one if
        # turned away", None: the server keeps none.
        self._place: int | None = 0
        self._kept = False  # a place was kept at least once
        self._rejoin = True  # False: the server keeps no place of a wait run out
        self._unreachable: ServiceUnavailable | None = None
        self._follow_up: Background | None = None

    def run(self) -> AcquireAttempt:
        """:raise LockNotAcquired: another owner held it for the whole wait.
        :raise ServiceUnavailable: the service could not be reached in that time.
        """
        started = time.monotonic()
        deadline = started + self.wait
        attempt_number = 0
        turned_away = 0  # attempts that found the server's waiting room full
        cap = None  # the setting the last of them named
        while True:
            attempt_number += 1
            result = self._attempt(deadline)
            if result.acquired:
                return result
            if self._place is not None:
                self._place = result.place or 0
                self._kept = self._kept or result.place is not None
            if result.waiting_room_full:
                turned_away += 1
                cap = result.waiting_room_cap or cap
            now = time.monotonic()
            if now - started >= self.wait:
                if result.lock is None and self._unreachable is not None:
                    raise self._unreachable
                raise decisions.not_acquired(
                    self.resource,
                    self.wait,
                    result,
                    turned_away=turned_away,
                    cap=cap,
                    kept=self._kept,
                )
            if decisions.rejoin_at_once(result, self._in_line_for, now - self.sent_at):
                continue
            client = self.client
            sleep(
                decisions.contention_delay(
                    result,
                    attempt_number,
                    backoff=client.backoff,
                    max_backoff=client.max_backoff,
                    max_lock_poll=client.max_lock_poll,
                    rng=client.rng,
                    remaining=self.wait - (now - started),
                )
            )

    def _attempt(self, deadline: float) -> AcquireAttempt:
        """One acquire: waiting in the server's line for the rest of the wait (at
        most ``client.max_server_wait``), or a plain one when the server does
        not wait."""
        client = self.client
        while True:
            self.sent_at = time.monotonic()
            chunk = min(deadline - self.sent_at, client.max_server_wait)
            self._in_line_for = chunk if chunk >= 0.001 else 0.0
            rejoin = self._rejoin and self._place is not None
            try:
                result = client.acquire(
                    self.resource,
                    self.owner,
                    self.ttl,
                    wait=self._in_line_for,
                    session=self.session,
                    limit=self.kind.limit,
                    shared=self.kind.shared,
                    place=self._place if self._in_line_for else None,
                    rejoin=rejoin
                    and decisions.rejoins(deadline, self.sent_at, self._in_line_for),
                )
            except InvalidRequest as exc:
                if not self._in_line_for:
                    raise
                if self._place is not None and decisions.knows_no_places(exc):
                    self._place = None  # an older server: ask without
                    continue
                if rejoin and decisions.knows_no_rejoin(exc):
                    self._rejoin = False  # an older server: ask without
                    continue
                server_max = decisions.server_max_wait(exc)
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
            except Exception:
                raise
            except BaseException:
                # Cancelled (or interrupted) with the request out: the server
                # may have granted it, or may grant it before it notices.
                shielded(self._release_what_may_be_granted)
                raise
            self._unreachable = None
            return result

    def _release_what_may_be_granted(self) -> None:
        if not self._release_if_granted():
            # Nothing granted yet: the server may still grant the request until
            # it notices the closed connection. Look once more then, in the
            # background: the cancel goes on at once.
            self._follow_up = Background(
                self._release_late_grant, name=f"lockkeeper-cancel:{self.resource}"
            )

    def _release_late_grant(self) -> None:
        sleep(decisions.LATE_GRANT_WITHIN)
        self._release_if_granted()

    def _release_if_granted(self) -> bool:
        """Release the grant this wait may hold; whether there was one (or the
        service could not be asked: the grant, if any, ends with its ttl)."""
        try:
            self.client.release(self.resource, self.owner)
        except LockLost:
            return False
        except LockClientError:
            return True
        return True
