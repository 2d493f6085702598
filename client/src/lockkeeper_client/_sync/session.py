# Generated from _async/ by client/scripts/make_sync.py: edit that.
"""A session and its heartbeat, the locks bound to it, and leadership on top.

``with client.session(ttl=15) as s`` starts a session and heartbeats it in the
background (a thread for ``LockClient``, a task for ``AsyncLockClient``): one
request per interval renews every lock bound to it, however many. ``s.lock(name)``
binds a lock to it. ``s.lost`` is set when the session ends under the caller (a
heartbeat refused, or none reached the server before the session expired): every
bound lock is lost with it, at the same instant. Leaving ends the session, which
releases every bound lock in one request, and raises ``SessionLost`` (a bound
lock's block: ``LockLost``) if the session was lost meanwhile, unless
``raise_on_lost=False``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from lockkeeper_client import decisions
from lockkeeper_client._concurrency import (
    Background,
    Event,
    wait_event,
)
from lockkeeper_client._sync.waiting import GrantWait
from lockkeeper_client.errors import (
    LockClientError,
    LockLost,
    LockNotAcquired,
    SessionLost,
)
from lockkeeper_client.grants import LockGrant, SessionInfo

if TYPE_CHECKING:
    from lockkeeper_client._sync.client import LockClient

log = logging.getLogger("lockkeeper_client")


class LockSession:
    """The session behind ``with client.session(...) as s``.

    - ``s.id``, ``s.owner``, ``s.ttl``; ``s.info``: the session as last renewed.
    - ``s.lost``: set when the session ended under the caller; ``s.lost_reason``
      says why, and ``on_lost(s)`` is called once, from the heartbeat, then.
    - ``s.lock(resource, wait=10)``: a context manager holding a lock bound to
      the session (no renewal of its own); leaving it releases that lock.
    """

    def __init__(
        self,
        client: LockClient,
        *,
        ttl: float,
        owner: str,
        heartbeat_every: float | None = None,
        on_lost: Callable[[LockSession], None] | None = None,
        raise_on_lost: bool = True,
    ):
        if not ttl > 0:
            raise ValueError(f"a session's ttl must be positive, not {ttl!r}")
        if heartbeat_every is not None and not 0 < heartbeat_every < ttl:
            raise ValueError(
                f"heartbeat_every must be above 0 and below the session's ttl "
                f"({ttl:g} s) to leave room to renew, not {heartbeat_every!r}"
            )
        self.raise_on_lost = raise_on_lost
        self.client = client
        self.ttl = ttl
        self.owner = owner
        self.heartbeat_every = (
            heartbeat_every if heartbeat_every is not None else ttl / 3
        )
        self.on_lost = on_lost
        self.lost = Event()
        self.lost_reason: str | None = None
        self.info: SessionInfo | None = None
        self._valid_until = 0.0  # time.monotonic() by which it surely expired
        self._stop = Event()
        self._beater: Background | None = None
        self._ended = False

    @property
    def id(self) -> str:
        if self.info is None:
            raise RuntimeError("the session has not been started")
        return self.info.id

    def __enter__(self) -> LockSession:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.end()
        if exc_type is None:
            self.check()

    def check(self) -> None:
        """:raise SessionLost: the session ended under the caller (when it
        raises on loss: ``raise_on_lost``)."""
        if self.raise_on_lost and self.lost.is_set():
            raise SessionLost(
                f"session of {self.owner!r}", self.lost_reason or "the session ended"
            )

    def start(self) -> None:
        sent_at = time.monotonic()
        self.info = self.client.create_session(self.owner, self.ttl)
        self._valid_until = sent_at + self.info.ttl_remaining
        self._beater = Background(
            self._beat_until_stopped, name=f"lockkeeper-session:{self.owner}"
        )

    def end(self) -> None:
        """Stop the heartbeat and end the session (releasing its locks), unless
        it ended already. Never raises a lock error: a failure is logged (the
        session then ends with its ttl)."""
        self._stop.set()
        if self._beater is not None:
            self._beater.join()
        if self.info is None or self._ended:
            return
        self._ended = True
        if self.lost.is_set():
            return
        try:
            self.client.end_session(self.info.id)
        except LockClientError as exc:
            log.warning("%s; the session ends when its ttl runs out", exc)

    def lock(self, resource: str, wait: float = 10.0) -> SessionLock:
        return SessionLock(self, resource, wait=wait)

    def _beat_until_stopped(self) -> None:
        interval = self.heartbeat_every
        while not wait_event(self._stop, interval):
            sent_at = time.monotonic()
            try:
                info = self.client.heartbeat(self.id, retry_until=self._valid_until)
            except SessionLost as exc:
                self._mark_lost(str(exc))
                return
            except LockClientError as exc:
                if time.monotonic() >= self._valid_until:
                    self._mark_lost(
                        f"session {self.id!r} expired before a heartbeat reached "
                        f"the server: {exc}"
                    )
                    return
                log.warning(
                    "heartbeat of session %r failed, retrying: %s", self.id, exc
                )
                interval = decisions.renewal_retry_interval(
                    self.heartbeat_every, self.client.max_backoff
                )
                continue
            self.info = info
            self._valid_until = sent_at + info.ttl_remaining
            interval = self.heartbeat_every

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        log.warning("%s", reason)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                log.exception("on_lost callback of session %r failed", self.id)


class SessionLock:
    """A lock bound to a session: renewed by the session's heartbeat, lost with
    it (``lock.lost`` is the session's). Entering waits up to ``wait`` seconds
    (``LockNotAcquired``); leaving releases it unless the session was lost."""

    def __init__(self, session: LockSession, resource: str, *, wait: float):
        if wait < 0:
            raise ValueError(f"wait for {resource!r} must not be negative")
        self.session = session
        self.resource = resource
        self.wait = wait
        self.current: LockGrant | None = None
        self.lost = session.lost

    @property
    def fence(self) -> int:
        if self.current is None:
            raise RuntimeError(f"lock {self.resource!r} has not been acquired")
        return self.current.fence

    def __enter__(self) -> SessionLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
        if exc_type is None:
            self.check()

    def check(self) -> None:
        """:raise LockLost: the session, and so this lock, was lost."""
        if self.session.raise_on_lost and self.lost.is_set():
            raise LockLost(
                self.resource,
                f"lock {self.resource!r} was lost with its session: "
                f"{self.session.lost_reason or 'the session ended'}",
            )

    def acquire(self) -> None:
        session = self.session
        wait = GrantWait(
            session.client,
            self.resource,
            owner=session.owner,
            ttl=None,
            wait=self.wait,
            session=session.id,
        )
        self.current = (wait.run()).lock

    def release(self) -> None:
        if self.current is None or self.lost.is_set():
            return
        try:
            self.session.client.release(self.resource, self.session.owner)
        except LockLost as exc:
            log.warning("%s", exc)
        except LockClientError as exc:
            log.warning("%s; the lock ends with its session", exc)
        self.current = None


class Leadership:
    """``with client.leadership(name) as lead``: leads while the lock ``name``,
    bound to a session of its own, is held. ``lead.lost`` is set when the
    session ends under it (then another may lead); ``lead.fence`` is the term's
    fence, increasing from one leader to the next. Leaving ends the session,
    handing the lock to the next in line."""

    def __init__(
        self,
        client: LockClient,
        name: str,
        *,
        ttl: float,
        wait: float | None,
        owner: str,
        on_lost: Callable[[LockSession], None] | None = None,
        raise_on_lost: bool = True,
    ):
        self.client = client
        self.name = name
        self.wait = wait
        self.session = LockSession(
            client, ttl=ttl, owner=owner, on_lost=on_lost, raise_on_lost=raise_on_lost
        )
        self.lost = self.session.lost
        self.owner = owner
        self.current: LockGrant | None = None

    @property
    def fence(self) -> int:
        if self.current is None:
            raise RuntimeError(f"not leading {self.name!r}")
        return self.current.fence

    @property
    def lost_reason(self) -> str | None:
        return self.session.lost_reason

    def __enter__(self) -> Leadership:
        self.session.start()
        try:
            self._wait_for_the_lock()
        except BaseException:
            self.session.end()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.session.end()
        if exc_type is None:
            self.check()

    def check(self) -> None:
        """:raise SessionLost: the lead was lost (its session ended)."""
        if self.session.raise_on_lost and self.lost.is_set():
            raise SessionLost(
                self.name,
                f"the lead of {self.name!r} was lost: "
                f"{self.session.lost_reason or 'the session ended'}",
            )

    def _wait_for_the_lock(self) -> None:
        deadline = None if self.wait is None else time.monotonic() + self.wait
        while True:
            if self.lost.is_set():
                raise SessionLost(
                    self.name, self.session.lost_reason or "the session ended"
                )
            chunk = self.client.max_server_wait or 1.0
            if deadline is not None:
                chunk = max(0.0, min(chunk, deadline - time.monotonic()))
            try:
                granted = GrantWait(
                    self.client,
                    self.name,
                    owner=self.owner,
                    ttl=None,
                    wait=chunk,
                    session=self.session.id,
                ).run()
            except LockNotAcquired:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                continue
            self.current = granted.lock
            return
