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
    AsyncBackground,
    AsyncEvent,
    async_sleep,
    async_wait_event,
)
from lockkeeper_client.errors import (
    AlreadyHeld,
    LockClientError,
    LockLost,
    ServiceUnavailable,
)
from lockkeeper_client.grants import AcquireAttempt, LockGrant, SetAttempt, SetMember

if TYPE_CHECKING:
    from lockkeeper_client._async.port import AsyncSetPort

log = logging.getLogger("lockkeeper_client")


class AsyncHeldSet:
    """The locks behind ``with client.lock_all([...]) as held``.

    - ``held.locks``: each member's grant, in the order named;
      ``held.fences``: resource → fence; ``held.set_id``: the set's id, which
      each of its events names (the dashboard's page of the set).
    - Entering asks for the whole set until it is granted whole, at most
      ``wait`` seconds (None: until granted), backing off between refusals (a
      set does not wait in the server's line: it is asked again, and holds
      nothing meanwhile). Raises ``LockNotAcquired`` naming the member that
      stayed held.
    - ``held.lost`` is set when a renewal of the set is refused (a member was
      lost) or the ttl ran out by the local clock before one reached the
      server; ``held.check()`` raises ``LockLost`` then, and ``on_lost(held)``
      is called once, from the renewer.
    - Leaving releases every member still held and raises ``LockLost`` if any
      was lost during the block (unless ``raise_on_lost=False``).
    """

    def __init__(
        self,
        client: AsyncSetPort,
        members: list[SetMember],
        *,
        ttl: float,
        wait: float | None,
        owner: str,
        on_lost: Callable[[AsyncHeldSet], None] | None = None,
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
        self.lost = AsyncEvent()
        self.lost_reason: str | None = None
        self.locks: tuple[LockGrant, ...] = ()
        self.set_id: str | None = None
        self._valid_until = 0.0
        self._stop = AsyncEvent()
        self._renewer: AsyncBackground | None = None
        self._released = False

    @property
    def fences(self) -> dict[str, int]:
        return {lock.resource: lock.fence for lock in self.locks}

    async def __aenter__(self) -> AsyncHeldSet:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()
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

    async def acquire(self) -> None:
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
        attempt_number = 0
        while True:
            attempt_number += 1
            sent_at = time.monotonic()
            try:
                result = await self.client.acquire_all(
                    self.members, self.owner, self.ttl
                )
            except ServiceUnavailable:
                if time.monotonic() - started >= self.wait:
                    raise
                result = SetAttempt(False, ())
            if result.acquired:
                break
            waited = time.monotonic() - started
            if waited >= self.wait:
                raise decisions.set_not_acquired(self.label, self.wait, result)
            client = self.client
            await async_sleep(
                decisions.contention_delay(
                    AcquireAttempt(False, result.lock, result.retry_after),
                    attempt_number,
                    backoff=client.backoff,
                    max_backoff=client.max_backoff,
                    max_lock_poll=client.max_lock_poll,
                    rng=client.rng,
                    remaining=self.wait - waited,
                )
            )
        for resource in self.resources:
            self.client.holding.add((resource, self.owner))
        self._granted(result.locks, sent_at)
        self.set_id = result.set_id
        self._renewer = AsyncBackground(
            self._renew_until_stopped, name=f"lockkeeper-renew:{self.label}"
        )

    async def release(self) -> None:
        """Stop renewing and release every member still held."""
        self._stop.set()
        if self._renewer is not None:
            await self._renewer.join()
        for resource in self.resources:
            self.client.holding.discard((resource, self.owner))
        if not self.locks or self._released:
            return
        self._released = True
        try:
            released = await self.client.release_all(self.resources, self.owner)
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

    async def _renew_until_stopped(self) -> None:
        interval = self.renew_every
        while True:
            until_expiry = max(self._valid_until - time.monotonic(), 0.0)
            if await async_wait_event(self._stop, min(interval, until_expiry)):
                return
            sent_at = time.monotonic()
            if sent_at >= self._valid_until:
                self._mark_lost(f"set {self.label!r} expired before it was renewed")
                return
            try:
                locks = await self.client.renew_all(
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
