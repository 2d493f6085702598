"""One exception per broken contract, each naming its subject."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockkeeper_core.results import Freeze, Lock


class LockError(Exception):
    """Base of every refusal the service reports to a caller."""


class InvalidInput(LockError):
    """One or more fields are malformed; nothing was changed."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors))


class LockNotFound(LockError):
    def __init__(self, resource: str, detail: str | None = None):
        self.resource = resource
        super().__init__(detail or f"no lock is held on {resource!r}")


class LockExpired(LockError):
    """The caller's lock expired; someone else may hold the resource by now."""

    def __init__(self, resource: str, owner: str):
        self.resource = resource
        self.owner = owner
        super().__init__(f"the lock on {resource!r} held by {owner!r} has expired")


class NotOwner(LockError):
    def __init__(self, resource: str, holder: Lock):
        self.resource = resource
        self.holder = holder
        super().__init__(f"{resource!r} is held by another owner")


class LockHeld(LockError):
    """The resource is validly held by someone else (a claim without force)."""

    def __init__(self, resource: str, holder: Lock):
        self.resource = resource
        self.holder = holder
        super().__init__(
            f"{resource!r} is held by {holder.owner!r} until its ttl runs out"
        )


class HeldByHolders(LockHeld):
    """A claim of a resource held by holders that may take none of them: a
    semaphore with no free place, or shared grants claimed without the shared
    mode (``why`` says which). ``holder``: the grant that ends first."""

    def __init__(self, resource: str, holder: Lock, why: str):
        self.resource = resource
        self.holder = holder
        LockError.__init__(self, why)


class LockChanged(LockError):
    """The grant an operator confirmed (``expected_fence``) is no longer the lock's
    grant: it changed hands, or ended, between the confirmation and the action.
    ``holder`` is the lock as it is now (None when nobody holds it)."""

    def __init__(self, resource: str, expected_fence: int, holder: Lock | None):
        self.resource = resource
        self.expected_fence = expected_fence
        self.holder = holder
        now = (
            f"it is now held by {holder.owner!r} with fence {holder.fence}"
            if holder is not None
            else "nobody holds it now"
        )
        super().__init__(
            f"the lock on {resource!r} changed hands since fence {expected_fence} "
            f"was confirmed: {now}"
        )


class FenceMismatch(LockError):
    """``fence`` is not the valid grant of the resource. ``current``: the lock as
    it is now (stale included), None when nobody holds it."""

    def __init__(self, resource: str, fence: int, current: Lock | None):
        self.resource = resource
        self.fence = fence
        self.current = current
        if current is None:
            now = "nobody holds it"
        elif current.fence == fence:
            now = f"that grant has expired ({current.owner!r})"
        else:
            now = f"the valid grant is fence {current.fence} of {current.owner!r}"
            if current.state.value == "stale":
                now = f"the last grant, fence {current.fence}, has expired"
        super().__init__(f"fence {fence} is not the valid grant of {resource!r}: {now}")


class ResourceFrozen(LockError):
    """A freeze covers the resource: no new grant (renewals and releases go on)."""

    def __init__(self, resource: str, freeze: Freeze):
        self.resource = resource
        self.freeze = freeze
        until = (
            f"until {freeze.ends_at.isoformat()}"
            if freeze.ends_at is not None
            else "until unfrozen"
        )
        super().__init__(
            f"{resource!r} is frozen by the freeze of {freeze.prefix!r} {until}: "
            f"{freeze.reason}"
        )


class NotFrozen(LockError):
    def __init__(self, prefix: str):
        self.prefix = prefix
        super().__init__(f"no freeze of {prefix!r} is in force")


class QuotaExceeded(LockError):
    """A new grant would give the token more live locks than its quota."""

    def __init__(self, token: str | None, max_locks: int | None, retry_after: float):
        self.token = token
        self.max_locks = max_locks
        self.retry_after = retry_after
        super().__init__(
            f"the API token {token!r} already holds its quota of {max_locks} live "
            "locks; release some or wait for them to expire"
        )


class LimitMismatch(LockError):
    """The resource is in use (live holders or waiters) with another limit or
    mode kind than the acquire names; ``limit`` is the one in force."""

    def __init__(self, resource: str, limit: int, asked: int, holder: Lock | None):
        self.resource = resource
        self.limit = limit
        self.asked = asked
        self.holder = holder
        kind = "an exclusive or read/write lock" if limit == 1 else "a semaphore"
        super().__init__(
            f"{resource!r} is in use as {kind} of limit {limit}; this acquire "
            f"asked for limit {asked}: wait until it is free, or ask with limit "
            f"{limit}"
        )


class ServiceBusy(LockError):
    """The database kept refusing for reasons that are not the caller's (deadlocks)."""


class WaitersFull(LockError):
    """This server worker already has as many acquires waiting as it may
    (``LOCKKEEPER_MAX_WAITERS``), or the token as many as its share of them
    (``token`` given: ``LOCKKEEPER_MAX_WAITERS_PER_TOKEN``); ``setting`` names
    the cap. A request turned away has no place in line unless it asked for
    one to be kept (``place``: then the id of its kept place, which its retry
    presents; see ``lockkeeper_core.queue``; a set's: ``places``, one in each
    member's line): without one, while its client polls, the
    waiters in line go first, so past a cap waits lose their order."""

    def __init__(self, limit: int, *, token: str | None = None):
        self.limit = limit
        self.token = token
        self.place: int | None = None
        self.places: dict[str, int] | None = None
        if token is not None:
            self.setting = "LOCKKEEPER_MAX_WAITERS_PER_TOKEN"
            whose = f"the API token {token!r} already has"
            share = ", its share"
        else:
            self.setting = "LOCKKEEPER_MAX_WAITERS"
            whose = "this server worker already has"
            share = ""
        super().__init__(
            f"{whose} {limit} acquires waiting{share} ({self.setting}); retry "
            "presenting `place` (kept for 2 s when the acquire sent one), "
            "else while polling this acquire has no place in line and the "
            "waiters in line go first"
        )


class TokenEnded(LockError):
    """The API token was revoked or expired before the grant could commit (while
    its acquire waited in line, or in another worker that still cached it)."""

    def __init__(self, token: str | None):
        self.token = token
        super().__init__(
            f"the API token {token!r} was revoked or has expired; no lock was granted"
        )


class SessionBound(LockError):
    """A renewal of a session-bound grant: it is renewed by its session's
    heartbeat."""

    def __init__(self, resource: str, session_id: str):
        self.resource = resource
        self.session_id = session_id
        super().__init__(
            f"the lock on {resource!r} is bound to session {session_id!r}: it "
            "is renewed by "
            "the session's heartbeat (PATCH /api/v1/sessions/{id}); renew the "
            "session instead"
        )


class UnknownSession(LockError):
    """No session of this id belongs to the asking token (or it has ended)."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(f"no session {session_id!r} of this API token")


class SessionExpired(LockError):
    """The session ran out before this call: its grants are already stale, and a
    late heartbeat does not revive them."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(
            f"the session {session_id!r} has expired; its locks are stale: "
            "start a new session and acquire them again"
        )


class SessionQuotaReached(LockError):
    """The API token already has as many live sessions as it may
    (``LOCKKEEPER_MAX_SESSIONS_PER_TOKEN``); ``retry_after``: seconds until the
    soonest of them expires."""

    setting = "LOCKKEEPER_MAX_SESSIONS_PER_TOKEN"

    def __init__(self, token: str, limit: int, retry_after: float):
        self.token = token
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(
            f"the API token {token!r} already has {limit} live sessions, its share "
            f"({self.setting}): end one, or reuse one (a session holds any number "
            "of locks)"
        )


class AccessRefused(LockError):
    """The token may not do this (read-only, or the resource outside its
    scope): the API's 403."""
