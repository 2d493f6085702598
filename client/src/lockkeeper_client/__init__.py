"""Worker client for the Lockkeeper JSON API.

``LockClient`` speaks the ``/api/v1`` contract over HTTP and needs nothing of the
server's code or database (neither Flask nor SQLAlchemy is imported): a worker
installs this package with httpx and tenacity, names the server and a token, and
takes locks::

    client = LockClient("http://locks.internal:8000", token)
    with client.lock("job:42", ttl=30, wait=10) as lock:
        run_job(fence=lock.fence)
        if lock.lost.is_set():
            ...  # stop writing: someone else may hold job:42 now

Where each part lives:

- ``http.py``: ``LockClient``, one method per API call, transient failures retried;
- ``grants.py``: what the server answers (``LockGrant``, ``AcquireAttempt``);
- ``held.py``: ``HeldLock``, the ``with`` block and its renewal thread;
- ``waiting.py``: waiting for a held lock, in the server's line, then polling;
- ``errors.py``: one exception per thing the caller can do about a failure.
"""

from lockkeeper_client.errors import (
    AccessDenied,
    AuthenticationFailed,
    FenceRejected,
    InvalidRequest,
    LockClientError,
    LockFrozen,
    LockLost,
    LockMissing,
    LockNotAcquired,
    LockQuotaReached,
    ServiceUnavailable,
    UnexpectedResponse,
)
from lockkeeper_client.grants import AcquireAttempt, LockGrant, default_owner
from lockkeeper_client.held import HeldLock
from lockkeeper_client.http import API_PREFIX, DEFAULT_TIMEOUT, LockClient

__all__ = [
    "API_PREFIX",
    "DEFAULT_TIMEOUT",
    "AccessDenied",
    "AcquireAttempt",
    "AuthenticationFailed",
    "FenceRejected",
    "HeldLock",
    "InvalidRequest",
    "LockClient",
    "LockClientError",
    "LockFrozen",
    "LockGrant",
    "LockLost",
    "LockMissing",
    "LockNotAcquired",
    "LockQuotaReached",
    "ServiceUnavailable",
    "UnexpectedResponse",
    "default_owner",
]
