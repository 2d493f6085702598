"""A tooz coordination driver for Lockkeeper locks (``lockkeeper-client[tooz]``).

::

    coordinator = tooz.coordination.get_coordinator(
        "lockkeeper://locks.internal:8000/?token=lk_...", b"worker-7"
    )
    coordinator.start()
    with coordinator.get_lock(b"job:42"):
        ...

``lockkeeper://`` speaks HTTP, ``lockkeeper+https://`` HTTPS. The token comes from
the URL's ``token`` option, else from ``LOCKKEEPER_TOKEN``; ``ttl`` (seconds,
default 30) is each lock's ttl, renewed every ttl/3 while it is held.

It maps tooz's lock API onto ``LockClient`` and decides nothing itself:

- each ``Lock`` object is a holder of its own (owner ``<member id>:<random>``),
  as tooz expects: two ``Lock`` objects of one name exclude each other even in one
  coordinator, and a held ``Lock`` asked again answers False (not re-entrant);
- one ``Lock`` used from two threads: the second ``acquire()`` waits for the first
  to release (a local guard, as tooz's own database drivers keep), then asks the
  server;
- ``acquire(shared=True)`` takes a shared grant: shared Lock objects of one name
  hold it together, an exclusive one waits for all of them. As tooz's own
  drivers do, one Lock object asked for a shared lock again while it holds one
  answers True and must be released as often (one grant on the server);
- what Lockkeeper does not offer (groups, leaders, watchers, breaking another
  holder's lock) raises ``tooz.NotImplemented``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import tooz
from tooz import coordination, locking

from lockkeeper_client import (
    FenceRejected,
    HeldLock,
    LockClient,
    LockClientError,
    LockLost,
    LockMissing,
    LockNotAcquired,
    ServiceUnavailable,
    default_owner,
)

# A blocking acquire with no timeout waits in the server's line in turns of this.
_FOREVER_TURN = 30.0


def _not_offered(what: str) -> tooz.NotImplemented:
    return tooz.NotImplemented(f"Lockkeeper does not offer {what}")


class LockkeeperLock(locking.Lock):
    """One tooz lock: one Lockkeeper holder."""

    def __init__(self, name: bytes, client: LockClient, member_id: bytes, ttl: float):
        super().__init__(name)
        self._client = client
        self._resource = name.decode() if isinstance(name, bytes) else str(name)
        member = member_id.decode() if isinstance(member_id, bytes) else member_id
        self._owner = f"{member}:{default_owner().rsplit(':', 1)[-1]}"
        self._ttl = ttl
        self._local = threading.Lock()
        self._held: HeldLock | None = None
        # How often this object holds its shared grant (0: exclusive or none).
        self._shared_count = 0

    def acquire(
        self,
        blocking: bool | float = True,
        shared: bool = False,
        timeout: float | None = None,
    ) -> bool:
        if shared and self._shared_count:
            self._shared_count += 1  # the grant this object holds already
            return True
        if blocking is False:
            wait: float | None = 0.0
        elif blocking is True:
            wait = timeout  # None: until granted
        else:
            wait = float(blocking)
        deadline = None if wait is None else time.monotonic() + wait
        if wait == 0.0:
            guarded = self._local.acquire(blocking=False)
        else:
            guarded = self._local.acquire(timeout=-1 if wait is None else wait)
        if not guarded:
            return False
        try:
            while True:
                left = (
                    _FOREVER_TURN
                    if deadline is None
                    else max(deadline - time.monotonic(), 0.0)
                )
                held = self._client.lock(
                    self._resource,
                    ttl=self._ttl,
                    wait=left,
                    owner=self._owner,
                    shared=shared,
                )
                try:
                    held.acquire()
                except LockNotAcquired:
                    if deadline is None:
                        continue
                    raise
                self._held = held
                self._shared_count = 1 if shared else 0
                return True
        except LockNotAcquired:
            self._local.release()
            return False
        except ServiceUnavailable as exc:
            self._local.release()
            raise coordination.ToozConnectionError(str(exc)) from exc
        except BaseException:
            self._local.release()
            raise

    def release(self) -> bool:
        held = self._held
        if held is None:
            return False
        if self._shared_count > 1:
            self._shared_count -= 1
            return True
        self._shared_count = 0
        self._held = None
        try:
            held.release()
        finally:
            self._local.release()
        return not held.lost.is_set()

    def is_still_owner(self) -> bool:
        held = self._held
        if held is None:
            return False
        try:
            # Any live grant of the resource carrying our fence: with shared
            # grants the resource's first-ending grant may be another's.
            current = self._client.check_fence(self._resource, held.fence)
        except (FenceRejected, LockMissing, LockLost):
            return False
        return current.owner == self._owner

    def break_(self) -> bool:
        # Only an operator may end another holder's lock (force-release).
        raise _not_offered("breaking another holder's lock")


class LockkeeperDriver(coordination.CoordinationDriver):
    """``lockkeeper://host:port/?token=…``: locks only."""

    CHARACTERISTICS = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        # One database decides every lock, atomically.
        coordination.Characteristics.LINEARIZABLE,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]):
        super().__init__(member_id, parsed_url, options)
        scheme = "https" if parsed_url.scheme.endswith("+https") else "http"
        self._url = f"{scheme}://{parsed_url.netloc}{parsed_url.path.rstrip('/')}"
        token = (options.get("token") or [None])[0] or os.environ.get(
            "LOCKKEEPER_TOKEN"
        )
        if not token:
            raise tooz.ToozError(
                "lockkeeper:// needs an API token: ?token=… or LOCKKEEPER_TOKEN"
            )
        self._token: str = token
        self._ttl = float((options.get("ttl") or [30])[0])
        self._client: LockClient | None = None

    def _start(self) -> None:
        client = LockClient(self._url, self._token, retries=2)
        try:
            client.get("tooz:connection-check")
        except LockMissing:
            pass  # reached, authenticated: nobody holds it
        except LockClientError as exc:
            client.close()
            raise coordination.ToozConnectionError(str(exc)) from exc
        self._client = client

    def _stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def get_lock(self, name: bytes) -> LockkeeperLock:
        if self._client is None:
            raise tooz.ToozError("start the coordinator before taking locks")
        return LockkeeperLock(name, self._client, self._member_id, self._ttl)

    # The base class lets these succeed silently; Lockkeeper has no groups.
    def watch_join_group(self, group_id: bytes, callback: Any) -> None:
        raise _not_offered("groups")

    def unwatch_join_group(self, group_id: bytes, callback: Any) -> None:
        raise _not_offered("groups")

    def watch_leave_group(self, group_id: bytes, callback: Any) -> None:
        raise _not_offered("groups")

    def unwatch_leave_group(self, group_id: bytes, callback: Any) -> None:
        raise _not_offered("groups")

    def watch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        raise _not_offered("leader election")

    def unwatch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        raise _not_offered("leader election")
