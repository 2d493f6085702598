# Generated from _async/ by client/scripts/make_sync.py: edit that.
"""The set of a ``with client.lock_all(...)`` block: several locks taken as
one, renewed as one in the background, released as one."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from lockkeeper_client import decisions
from lockkeeper_client._concurrency import (
    Background,
    Event,
    shielded,
    sleep,
    wait_event,
)
from lockkeeper_client.errors import (
    AlreadyHeld,
    InvalidRequest,
    LockClientError,
    LockLost,
    ServiceUnavailable,
)
from lockkeeper_client.grants import LockGrant, SetAttempt, SetMember

if TYPE_CHECKING:
    from lockkeeper_client._sync.port import SetPort

log = logging.getLogger("lockkeeper_client")


class HeldSet:
    """The locks behind ``with client.lock_all([...]) as held``.

    - ``held.locks``: each member's grant, in the order named;
      ``held.fences``: resource → fence; ``held.set_id``: the set's id, which
      each of its events names (the dashboard's page of the set).
    - Entering waits at most ``wait`` seconds (None: until granted) for the
      whole set in the server's lines, a place in every member's line and
      none of them held meanwhile, in requests of at most the server's
      largest wait, one after another, each but the last asking the server
      to keep the set's places when it runs out (``rejoin``), the next
      presenting them; when the server's waiting room is full (503) it asks
      again soon, presenting the places the server kept for it meanwhile
      (as one lock's wait, ``waiting``). Raises ``LockNotAcquired`` naming
      the member that stayed held. A cancel while a request is out releases
      what the set may hold.
    - ``held.lost`` is set when a renewal of the set is refused (a member was
      lost) or the ttl ran out by the local clock before one reached the
      server; ``held.check()`` raises ``LockLost`` then, and ``on_lost(held)``
      is called once, from the renewer.
    - Leaving releases every member still held and raises ``LockLost`` if any
      was lost during the block (unless ``raise_on_lost=False``).
    """

    def __init__(
        self,
        client: SetPort,
        members: list[SetMember],
        *,
        ttl: float,
        wait: float | None,
        owner: str,
        on_lost: Callable[[HeldSet], None] | None = None,
        renew_every: float | None = None,
        raise_on_lost: bool = True,
    ):
        self.label = decisions.set_label([m.resource for m in members])
        if not ttl > 0:
            raise ValueError(f"ttl for {self.label!r} must be positive, not {ttl!r}")
        if wait is not None and wait < 0:
            raise ValueError(f"wait for {self.label!r} must not be negative")
        if renew_every is not None and not 0 < renew_every < ttl:
            raise ValueError(
                f"renew_every for {self.label!r} must be above 0 and below the ttl"
            )
        self.client = client
        self.members = members
        self.resources = [m.resource for m in members]
        self.owner = owner
        self.ttl = ttl
        self.wait = math.inf if wait is None else wait
        self.raise_on_lost = raise_on_lost
        self.on_lost = on_lost
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        self.lost = Event()
        self.lost_reason: str | None = None
        self.locks: tuple[LockGrant, ...] = ()
        self.set_id: str | None = None
        self._valid_until = 0.0
        self._stop = Event()
        self._renewer: Background | None = None
        self._released = False
        # The server's largest wait, as far as this set knows (learnt from
        # its 400); 0: it waits for none, poll.
        self._server_wait = client.max_server_wait
        # The places in line the server kept for this wait ({}: "keep them
        # if turned away"), None: the server keeps none; ``_rejoin`` False:
        # it keeps none of a wait run out.
        self._places: dict[str, int] | None = {}
        self._rejoin = True
        self._follow_up: Background | None = None

    @property
    def fences(self) -> dict[str, int]:
        return {lock.resource: lock.fence for lock in self.locks}

    def __enter__(self) -> HeldSet:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
        if exc_type is None and self.raise_on_lost:
            self.check()

    def check(self) -> None:
        """:raise LockLost: a member was lost, or the set's ttl ran out by the
        local clock without a renewal reaching the server."""
        if (
            not self.lost.is_set()
            and self.locks
            and not self._released
            and time.monotonic() >= self._valid_until
        ):
            self._mark_lost(f"set {self.label!r} expired before it was renewed")
        if self.lost.is_set():
            raise LockLost(self.label, self.lost_reason or "the set was lost")

    def acquire(self) -> None:
        """Ask for the whole set until granted, at most ``wait`` seconds.

        :raise LockNotAcquired: a member stayed held for the whole wait.
        """
        for resource in self.resources:
            if (resource, self.owner) in self.client.holding:
                raise AlreadyHeld(
                    resource,
                    f"lock {resource!r} is already held by {self.owner!r} in an "
                    "enclosing block of this client: locks are not re-entrant",
                )
        started = time.monotonic()
        deadline = started + self.wait
        attempt_number = 0
        turned_away = 0  # attempts that found the server's waiting room full
        cap = None  # the setting the last of them named
        kept = False  # the server kept the set's places at least once
        while True:
            attempt_number += 1
            sent_at = time.monotonic()
            # In the server's lines for the rest of the wait, at most its
            # largest wait per request (a plain ask when it waits for none).
            chunk = min(deadline - sent_at, self._server_wait)
            in_line_for = chunk if chunk >= 0.001 else 0.0
            rejoin = self._rejoin and self._places is not None
            try:
                result = self.client.acquire_all(
                    self.members,
                    self.owner,
                    self.ttl,
                    wait=in_line_for or None,
                    places=self._places if in_line_for else None,
                    rejoin=rejoin and decisions.rejoins(deadline, sent_at, in_line_for),
                )
            except InvalidRequest as exc:
                if not in_line_for:
                    raise
                if self._places is not None and decisions.knows_no_places(
                    exc, "places"
                ):
                    self._places = None  # an older server: ask without
                    continue
                if rejoin and decisions.knows_no_rejoin(exc):
                    self._rejoin = False  # an older server: ask without
                    continue
                self._server_wait = decisions.smaller_server_wait(
                    exc, self._server_wait
                )
                continue  # at once, with a wait the server takes
            except ServiceUnavailable:
                if time.monotonic() >= deadline:
                    raise
                result = SetAttempt(False, ())
            except Exception:
                raise
            except BaseException:
                # Cancelled (or interrupted) with the request out: the server
                # may have granted the set, or may before it notices.
                shielded(self._release_what_may_be_granted)
                raise
            if result.acquired:
                break
            if self._places is not None:
                self._places = result.places or {}
                kept = kept or result.places is not None
            if result.waiting_room_full:
                turned_away += 1
                cap = result.waiting_room_cap or cap
            now = time.monotonic()
            if now >= deadline:
                raise decisions.set_not_acquired(
                    self.label,
                    self.wait,
                    result,
                    turned_away=turned_away,
                    cap=cap,
                    kept=kept,
                )
            if decisions.set_waits_again_at_once(result, in_line_for, now - sent_at):
                continue
            client = self.client
            sleep(
                decisions.contention_delay(
                    decisions.set_pause_as(result),
                    attempt_number,
                    backoff=client.backoff,
                    max_backoff=client.max_backoff,
                    max_lock_poll=client.max_lock_poll,
                    rng=client.rng,
                    remaining=deadline - now,
                )
            )
        for resource in self.resources:
            self.client.holding.add((resource, self.owner))
        self._granted(result.locks, sent_at)
        self.set_id = result.set_id
        self._renewer = Background(
            self._renew_until_stopped, name=f"lockkeeper-renew:{self.label}"
        )

    def _release_what_may_be_granted(self) -> None:
        """A wait cancelled with its request out: release the set it may hold
        now, and look once more after ``LATE_GRANT_WITHIN`` (the server ends
        a set's wait when it notices the closed connection), in the
        background: the cancel goes on at once."""
        self._release_if_granted()
        self._follow_up = Background(
            self._release_late_grant, name=f"lockkeeper-cancel:{self.label}"
        )

    def _release_late_grant(self) -> None:
        sleep(decisions.LATE_GRANT_WITHIN)
        self._release_if_granted()

    def _release_if_granted(self) -> None:
        """Release the members this wait may hold (a release of none is
        harmless; a server that cannot be asked: they end with the ttl)."""
        try:
            self.client.release_all(self.resources, self.owner)
        except LockClientError as exc:
            log.warning("%s; a set granted to a cancelled wait ends with its ttl", exc)

    def release(self) -> None:
        """Stop renewing and release every member still held."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        for resource in self.resources:
            self.client.holding.discard((resource, self.owner))
        if not self.locks or self._released:
            return
        self._released = True
        try:
            released = self.client.release_all(self.resources, self.owner)
        except LockClientError as exc:
            log.warning("%s; the set's locks end when their ttl runs out", exc)
            return
        if released.not_held and not self.lost.is_set():
            self._mark_lost(
                f"set {self.label!r}: {', '.join(released.not_held)} no longer "
                f"held by {self.owner!r} at its release"
            )

    def _granted(self, locks: tuple[LockGrant, ...], sent_at: float) -> None:
        self.locks = locks
        # Measured from when the request left: never later than any member's
        # expiry at the server.
        self._valid_until = sent_at + min(lock.ttl_remaining for lock in locks)

    def _renew_until_stopped(self) -> None:
        interval = self.renew_every
        while True:
            until_expiry = max(self._valid_until - time.monotonic(), 0.0)
            if wait_event(self._stop, min(interval, until_expiry)):
                return
            sent_at = time.monotonic()
            if sent_at >= self._valid_until:
                self._mark_lost(f"set {self.label!r} expired before it was renewed")
                return
            try:
                locks = self.client.renew_all(
                    self.resources,
                    self.owner,
                    self.ttl,
                    retry_until=self._valid_until,
                )
            except LockLost as exc:
                self._mark_lost(str(exc))
                return
            except LockClientError as exc:
                if time.monotonic() >= self._valid_until:
                    self._mark_lost(f"set {self.label!r} expired: {exc}")
                    return
                log.warning("renewing %r failed, retrying: %s", self.label, exc)
                interval = decisions.renewal_retry_interval(
                    self.renew_every, self.client.max_backoff
                )
                continue
            self._granted(locks, sent_at)
            interval = self.renew_every

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        log.warning("%s", reason)
        if self.on_lost is not None and not self._released:
            try:
                self.on_lost(self)
            except Exception:
                log.exception("on_lost callback for %r failed", self.label)
