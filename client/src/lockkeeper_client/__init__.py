"""Worker client for the Lockkeeper JSON API.

``LockClient`` (blocking) and ``AsyncLockClient`` (asyncio) speak the ``/api/v1``
contract over HTTP and need nothing of the server's code or database: a worker
installs this distribution (``lockkeeper-client``, with httpx), names the server
and a token, and takes locks::

    client = LockClient("http://locks.internal:8000", token)
    with client.lock("job:42", ttl=30, wait=10) as lock:
        run_job(fence=lock.fence)
        if lock.lost.is_set():
            ...  # stop writing: someone else may hold job:42 now

    async with AsyncLockClient(url, token) as client:
        async with client.lock("job:42", ttl=30, wait=10) as lock:
            await run_job(fence=lock.fence)

    # At most 4 report builds at once (a counting semaphore), each its own fence;
    # many readers of a cache, one rebuild at a time (a shared lock):
    with client.lock("report-builds", limit=4) as holder: ...
    with client.lock("cache:prices", shared=True) as reader: ...

    # Several locks as one, all or none (no deadlock whatever the order):
    with client.lock_all(["acct:1", "acct:2"], ttl=30, wait=10) as both: ...

Where each part lives:

- ``_async/``: the behaviour, written once as asyncio code (the client, the held
  lock and its renewal task, waiting in line); ``_sync/`` is generated from it;
- ``decisions.py``: every decision without I/O (status → outcome, retries,
  backoff), shared by both;
- ``grants.py``: what the server answers (``LockGrant``, ``AcquireAttempt``);
- ``guard.py``: ``guard(conn, lock)``, the fence check inside the caller's own
  database transaction (when its data lives in the lock database);
- ``errors.py``: one exception per thing the caller can do about a failure.
"""

from lockkeeper_client._async.client import AsyncLockClient
from lockkeeper_client._async.held import AsyncHeldLock
from lockkeeper_client._async.held_set import AsyncHeldSet
from lockkeeper_client._async.session import (
    AsyncLeadership,
    AsyncLockSession,
    AsyncSessionLock,
)
from lockkeeper_client._sync.client import LockClient
from lockkeeper_client._sync.held import HeldLock
from lockkeeper_client._sync.held_set import HeldSet
from lockkeeper_client._sync.session import Leadership, LockSession, SessionLock
from lockkeeper_client.decisions import API_PREFIX, DEFAULT_TIMEOUT
from lockkeeper_client.errors import (
    AccessDenied,
    AlreadyHeld,
    AuthenticationFailed,
    ConfigurationError,
    FenceRejected,
    GuardNotInstalled,
    GuardOutsideTransaction,
    GuardRefused,
    InvalidRequest,
    LimitMismatch,
    LockClientError,
    LockFrozen,
    LockLost,
    LockMissing,
    LockNotAcquired,
    LockQuotaReached,
    ServiceUnavailable,
    SessionBoundLock,
    SessionLost,
    UnexpectedResponse,
)
from lockkeeper_client.grants import (
    AcquireAttempt,
    LockEvent,
    LockGrant,
    LockKind,
    SessionInfo,
    SetAttempt,
    SetMember,
    SetRelease,
    default_owner,
)
from lockkeeper_client.guard import guard

__all__ = [
    "API_PREFIX",
    "DEFAULT_TIMEOUT",
    "AccessDenied",
    "AlreadyHeld",
    "AcquireAttempt",
    "AsyncHeldLock",
    "AsyncHeldSet",
    "AsyncLeadership",
    "AsyncLockClient",
    "AsyncLockSession",
    "AsyncSessionLock",
    "AuthenticationFailed",
    "ConfigurationError",
    "FenceRejected",
    "GuardNotInstalled",
    "GuardOutsideTransaction",
    "GuardRefused",
    "HeldLock",
    "HeldSet",
    "InvalidRequest",
    "Leadership",
    "LimitMismatch",
    "LockClient",
    "LockClientError",
    "LockEvent",
    "LockFrozen",
    "LockGrant",
    "LockKind",
    "LockLost",
    "LockMissing",
    "LockNotAcquired",
    "LockQuotaReached",
    "LockSession",
    "ServiceUnavailable",
    "SessionBoundLock",
    "SessionInfo",
    "SessionLock",
    "SessionLost",
    "SetAttempt",
    "SetMember",
    "SetRelease",
    "UnexpectedResponse",
    "default_owner",
    "guard",
]
