"""The lock of a ``with client.lock(...)`` block, renewed in the background."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from lockkeeper_client import decisions
from lockkeeper_client._async.waiting import AsyncGrantWait
from lockkeeper_client._concurrency import (
    AsyncBackground,
    AsyncEvent,
    async_wait_event,
)
from lockkeeper_client.errors import (
    AlreadyHeld,
    LockClientError,
    LockLost,
    LockMissing,
    UnexpectedResponse,
)
from lockkeeper_client.grants import EXCLUSIVE, LockGrant, LockKind

if TYPE_CHECKING:
    from lockkeeper_client._async.port import AsyncLockPort

log = logging.getLogger("lockkeeper_client")


class AsyncHeldLock:
    """The lock behind ``with client.lock(...) as lock``.

    - ``lock.fence``, ``lock.expires_at``, ``lock.owner``: the current grant.
    - ``lock.lost``: an event (``threading.Event`` for ``LockClient``,
      ``asyncio.Event`` for ``AsyncLockClient``) set when a renew is refused
      (404/409), or when the lock's ttl ran out by the local clock before a renew
      reached the server (whether or not one was tried). ``on_lost(lock)`` is
      called once, from the renewer, at that moment. ``lock.check()`` raises
      ``LockLost`` once it is lost: call it before each step that needs the lock.
    - Leaving the block releases the lock unless it was lost, and raises
      ``LockLost`` if it was lost at any moment of the block (or the release
      found it gone): what the block did since was not protected. With
      ``raise_on_lost=False`` the loss is only logged and left in ``lost``. An
      exception raised inside the block propagates unchanged (a loss is then
      logged, not raised over it); a release that cannot reach the service is
      logged (the lock then ends with its ttl).

    Entering waits for the lock as ``GrantWait`` does, at most ``wait`` seconds.
    The renewer is a thread for ``LockClient``, a task for ``AsyncLockClient``.
    """

    def __init__(
        self,
        client: AsyncLockPort,
        resource: str,
        *,
        ttl: float,
        wait: float | None,
        owner: str,
        on_lost: Callable[[AsyncHeldLock], None] | None = None,
        renew_every: float | None = None,
        kind: LockKind = EXCLUSIVE,
        raise_on_lost: bool = True,
    ):
        if not ttl > 0:
            raise ValueError(f"ttl for {resource!r} must be positive, not {ttl!r}")
        if wait is not None and wait < 0:
            raise ValueError(f"wait for {resource!r} must not be negative")
        if renew_every is not None and not 0 < renew_every < ttl:
            raise ValueError(
                f"renew_every for {resource!r} must be above 0 and below the ttl "
                f"({ttl:g} s) to leave room to renew, not {renew_every!r}; "
                "the default, ttl / 3, leaves two tries"
            )
        self.client = client
        self.resource = resource
        self.owner = owner
        self.ttl = ttl
        self.wait = wait
        self.kind = kind
        self.on_lost = on_lost
        self.raise_on_lost = raise_on_lost
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        self.lost = AsyncEvent()
        self.lost_reason: str | None = None
        self.current: LockGrant | None = None
        self._valid_until = 0.0  # time.monotonic() by which the lock surely expired
        self._stop = AsyncEvent()
        self._renewer: AsyncBackground | None = None
        self._released = False  # released, or left to end by itself

    @property
    def fence(self) -> int:
        return self._held().fence

    @property
    def expires_at(self) -> datetime:
        return self._held().expires_at

    def _held(self) -> LockGrant:
        if self.current is None:
            raise RuntimeError(f"lock {self.resource!r} has not been acquired")
        return self.current

    async def __aenter__(self) -> AsyncHeldLock:
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
        """:raise LockLost: the lock was lost (refused, taken over, or its ttl
        ran out by the local clock without a renew reaching the server)."""
        if (
            not self.lost.is_set()
            and self.current is not None
            and not self._released
            and time.monotonic() >= self._valid_until
        ):
            self._mark_lost(self._expired_reason("no renew reached the server"))
        if self.lost.is_set():
            raise LockLost(self.resource, self.lost_reason or "the lock was lost")

    async def acquire(self) -> None:
        """Wait up to ``wait`` seconds for the lock, then start renewing it.

        :raise LockNotAcquired: another owner held it for the whole wait.
        :raise ServiceUnavailable: the service could not be reached in that time.
        :raise LockQuotaReached: the token holds its quota of locks already.
        """
        held_here = (self.resource, self.owner)
        if held_here in self.client.holding:
            raise AlreadyHeld(
                self.resource,
                f"lock {self.resource!r} is already held by {self.owner!r} in an "
                "enclosing block of this client: locks are not re-entrant (use "
                "the held lock, or another owner)",
            )
        wait = AsyncGrantWait(
            self.client,
            self.resource,
            owner=self.owner,
            ttl=self.ttl,
            wait=self.wait,
            kind=self.kind,
        )
        granted = await wait.run()
        self.client.holding.add(held_here)
        self._granted(granted.lock, sent_at=wait.sent_at)
        self._renewer = AsyncBackground(
            self._renew_until_stopped, name=f"lockkeeper-renew:{self.resource}"
        )

    async def release(self, *, run: Mapping[str, Any] | None = None) -> None:
        """Stop renewing and release the lock, unless it was lost already;
        ``run``: how the work under it ended, kept with the release (see
        ``LockClient.release``)."""
        self._stop.set()
        if self._renewer is not None:
            await self._renewer.join()
        self.client.holding.discard((self.resource, self.owner))
        if self.current is None or self.lost.is_set() or self._released:
            return
        self._released = True
        try:
            await self.client.release(self.resource, self.owner, run=run)
        except LockLost as exc:
            # Lost between the last renew and the release: report it, do not raise.
            self._mark_lost(str(exc), notify=False)
        except LockClientError as exc:
            log.warning("%s; the lock ends when its ttl runs out", exc)

    async def extend(self, ttl: float | None = None) -> None:
        """Renew now, to ``ttl`` seconds from now (default: the lock's ttl); the
        background renewals go on with the lock's own ttl.

        :raise LockLost: the lock was lost (``lost`` is set then too).
        """
        self.check()
        sent_at = time.monotonic()
        try:
            lock = await self.client.renew(
                self.resource, self.owner, self.ttl if ttl is None else ttl
            )
        except LockLost as exc:
            self._mark_lost(str(exc))
            raise
        self._granted(lock, sent_at)

    async def locked(self) -> float:
        """Seconds this grant has left by the server's clock (0.0: it is not
        held any more, by this grant)."""
        if self.current is None or self.lost.is_set() or self._released:
            return 0.0
        try:
            now = await self.client.get(self.resource)
        except LockMissing:
            return 0.0
        if (now.owner, now.fence) != (self.current.owner, self.current.fence):
            return 0.0
        return max(now.ttl_remaining, 0.0)

    async def hold_at_least(self, seconds: float) -> None:
        """End the lock no sooner than ``seconds`` after it was granted, by the
        database's clock (ShedLock's ``lockAtLeastFor``): stop renewing and, if
        that moment is still ahead, renew once to end there, leaving the lock to
        expire instead of releasing it; else release it now. Hosts whose clocks
        disagree thus run a job once per window however fast it finishes.
        """
        self._stop.set()
        if self._renewer is not None:
            await self._renewer.join()
        self.client.holding.discard((self.resource, self.owner))
        if self.current is None or self.lost.is_set() or self._released:
            return
        try:
            left = decisions.hold_left(
                self.current, await self.client.get(self.resource), seconds
            )
            if left > decisions.SHORTEST_HOLD:
                self._granted(
                    await self.client.renew(self.resource, self.owner, left),
                    time.monotonic(),
                )
                self._released = True  # it ends by itself, when the hold does
                return
        except LockClientError as exc:
            log.warning("holding %r to its minimum failed: %s", self.resource, exc)
        await self.release()

    def _granted(self, lock: LockGrant | None, sent_at: float) -> None:
        if lock is None:
            raise UnexpectedResponse(self.resource, "a grant without a lock object")
        self.current = lock
        # Measured from when the request left: never later than the server's expiry.
        self._valid_until = sent_at + lock.ttl_remaining

    def _expired_reason(self, why: str) -> str:
        return f"lock {self.resource!r} expired before it could be renewed: {why}"

    async def _renew_until_stopped(self) -> None:
        interval = self.renew_every
        while True:
            # Awake by the local expiry at the latest: lost is set then even
            # when no renew was tried (or one is still on its way).
            until_expiry = max(self._valid_until - time.monotonic(), 0.0)
            if await async_wait_event(self._stop, min(interval, until_expiry)):
                return
            sent_at = time.monotonic()
            if sent_at >= self._valid_until:
                self._mark_lost(self._expired_reason("no renew was in time"))
                return
            try:
                lock = await self.client.renew(
                    self.resource, self.owner, self.ttl, retry_until=self._valid_until
                )
            except LockLost as exc:
                self._mark_lost(str(exc))
                return
            except LockClientError as exc:
                if time.monotonic() >= self._valid_until:
                    self._mark_lost(self._expired_reason(str(exc)))
                    return
                log.warning("renewing %r failed, retrying: %s", self.resource, exc)
                interval = decisions.renewal_retry_interval(
                    self.renew_every, self.client.max_backoff
                )
                continue
            self._granted(lock, sent_at)
            interval = self.renew_every

    def _mark_lost(self, reason: str, notify: bool = True) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        log.warning("%s", reason)
        if notify and self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                log.exception("on_lost callback for %r failed", self.resource)
