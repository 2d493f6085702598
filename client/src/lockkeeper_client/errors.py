"""Every failure the client reports: one class per thing the caller can do about it.

All derive from ``LockClientError``; each message names the resource. These are
the client's own names: the server's exceptions (``lockkeeper_core.errors``) are never
seen by a worker, only the HTTP answers they become.

Every one keeps its constructor's arguments as ``args`` (``str()`` is the
message alone), so it pickles with its type and fields, and Celery's JSON
results rebuild it by type too: a Celery caller, ``multiprocessing`` or a
``ProcessPoolExecutor`` gets the same exception back, never Celery's
``UnpickleableExceptionWrapper``. (Through JSON a ``LockGrant`` field, not JSON
itself, comes back as None.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lockkeeper_client.grants import LockGrant


def _grant(value: object) -> LockGrant | None:
    """A ``LockGrant`` field as given; anything else (Celery's JSON results turn
    it into its repr) as None."""
    return value if isinstance(value, LockGrant) else None


class LockClientError(Exception):
    """Base of every failure the client reports; ``resource`` names the lock."""

    def __init__(
        self, resource: str | None, message: str, status: int | None = None
    ) -> None:
        self.resource = resource
        self.status = status
        self.message = message
        super().__init__(resource, message, status)

    def __str__(self) -> str:
        return self.message


class InvalidRequest(LockClientError):
    """The server rejected the request as malformed (400, 413, 415); fix the call.

    ``errors`` holds the server's ``(field, message)`` pairs.
    """

    def __init__(
        self,
        resource: str | None,
        message: str,
        status: int | None = None,
        errors: Iterable[tuple[str, str]] = (),
    ):
        super().__init__(resource, message, status)
        self.errors = [(str(field), str(text)) for field, text in errors]
        self.args = (resource, message, status, self.errors)


class ConfigurationError(LockClientError, ValueError):
    """The client is set up wrong (an empty token, a URL without a scheme, a
    base path that is not the server's root): raised at once, with what to fix,
    never retried or reported as the service being down."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)
        self.args = (message,)


class AlreadyHeld(LockClientError):
    """A ``lock()`` of a resource this client already holds for the same owner
    in an enclosing block: locks are not re-entrant, and the inner block's exit
    would release the outer block's lock. Use the held lock, or another owner
    (the default: a fresh one per ``lock()``)."""


class SessionBoundLock(LockClientError):
    """``renew`` of a lock bound to a session (409): its expiry is the session's,
    so renew the session (``heartbeat``) instead. The lock is still held."""


class AuthenticationFailed(LockClientError):
    """The token is missing, wrong or revoked (401)."""


class AccessDenied(LockClientError):
    """The token may not do this (403): it is read-only and asked for a change, or
    the resource is outside the prefixes it was given. Not retried; fix the token.
    """


class LockQuotaReached(LockClientError):
    """The token already holds its quota of live locks (429); nothing was granted.

    Not retried: only releasing (or the expiry of) one of the token's own locks
    makes room. ``retry_after`` is the server's ``Retry-After``: seconds until the
    soonest of them expires.
    """

    def __init__(
        self, resource: str | None, message: str, retry_after: float | None = None
    ):
        super().__init__(resource, message, 429)
        self.retry_after = retry_after
        self.args = (resource, message, retry_after)


class LockMissing(LockClientError):
    """No valid lock on the resource (``get`` answered 404)."""


class LockNotAcquired(LockClientError):
    """The lock stayed held by someone else for the whole ``wait``.

    ``holder`` is the last holder the server named, when it named one.
    """

    def __init__(
        self, resource: str | None, message: str, holder: LockGrant | None = None
    ):
        super().__init__(resource, message, 409)
        self.holder = _grant(holder)
        self.args = (resource, message, self.holder)


class LimitMismatch(LockClientError):
    """The resource is in use with another limit or kind (409 ``limit-mismatch``):
    a semaphore of ``limit`` holders, or an exclusive/shared lock (``limit`` 1)
    where a semaphore was asked for. Ask with the resource's own terms, or wait
    until it is free."""

    def __init__(
        self, resource: str, message: str, limit: int | None, mode: str | None
    ) -> None:
        super().__init__(resource, message, 409)
        self.limit = limit
        self.mode = mode
        self.args = (resource, message, limit, mode)


class LockFrozen(LockClientError):
    """An operator froze the resource's prefix (423): no new grants until the
    freeze ends; locks already held can still be renewed and released.

    ``freeze`` is the server's description: ``prefix``, ``reason``, ``actor``,
    ``frozen_at`` and ``ends_at`` (None: until unfrozen).
    """

    def __init__(
        self,
        resource: str | None,
        message: str,
        freeze: dict[str, Any] | None = None,
    ):
        super().__init__(resource, message, 423)
        self.freeze = freeze or {}
        self.args = (resource, message, self.freeze)


class FenceRejected(LockClientError):
    """``check_fence``: the fence is not the valid grant of the resource (409).

    ``current`` is the lock as it is now (None when nobody holds it).
    """

    def __init__(
        self, resource: str | None, message: str, current: LockGrant | None = None
    ):
        super().__init__(resource, message, 409)
        self.current = _grant(current)
        self.args = (resource, message, self.current)


class LockLost(LockClientError):
    """The caller no longer holds the lock: it expired, was force-released or was
    taken by another owner. Renew and release answer this; stop using the fence."""


class SessionLost(LockLost):
    """The session ended under the caller: it expired (a heartbeat came too late,
    or none could reach the server in time), or it was ended. Every lock bound
    to it is lost with it."""


class ServiceUnavailable(LockClientError):
    """The server could not be reached, or kept answering 502/503/504, for as long
    as the retry budget allowed."""


class UnexpectedResponse(LockClientError):
    """An answer outside the API contract (a 500, or a body that is not the JSON
    the contract promises)."""


class GuardRefused(LockLost):
    """``guard`` refused the write: the grant of ``fence`` is not valid any more,
    by the database's clock. ``reason`` is ``"lost"`` (it ended: released,
    force-released, taken over, claimed), ``"expired"`` (its ttl passed) or
    ``"never held"`` (no grant of that fence on that resource is on record);
    ``sqlstate`` is the database's (LK001, LK002, LK003). Roll the transaction
    back: nothing it wrote may commit.
    """

    def __init__(
        self, resource: str, message: str, reason: str, fence: int, sqlstate: str
    ) -> None:
        super().__init__(resource, message)
        self.reason = reason
        self.fence = fence
        self.sqlstate = sqlstate
        self.args = (resource, message, reason, fence, sqlstate)


class GuardOutsideTransaction(LockClientError):
    """``guard`` was called outside a transaction (a connection in autocommit):
    the row lock would end with the call and guard nothing. Open a transaction
    first. On MariaDB the database says so (SQLSTATE LK004); on PostgreSQL,
    which cannot tell, the client does before it calls."""


class GuardNotInstalled(ConfigurationError):
    """``guard`` found no ``lockkeeper_guard`` routine in the connection's
    database: the connection is to another database than the lock service's
    (on MariaDB, or to none; on PostgreSQL, or with the lock schema off its
    search_path), or that database's schema predates the guard (``lockkeeper db
    upgrade``)."""

    def __init__(self, resource: str, message: str) -> None:
        LockClientError.__init__(self, resource, message)
        self.args = (resource, message)
