# Generated from _async/ by client/scripts/make_sync.py: edit that.
"""What a held lock and a wait need of a client: three calls and its tuning;
and what a client needs of a transport that answers in its own process.

``AsyncHeldLock`` and ``AsyncGrantWait`` take this port, not the client class:
they depend on what they use, and anything that speaks the lock API (a test
double, another transport) can stand in."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lockkeeper_client.grants import (
    AcquireAttempt,
    LockGrant,
    SetAttempt,
    SetMember,
    SetRelease,
)


class LockPort(Protocol):
    backoff: float
    max_backoff: float
    max_lock_poll: float
    # Learnt from the server's 400 by a wait, kept for the next one.
    max_server_wait: float
    rng: random.Random
    # (resource, owner) of the held-lock blocks of this client now: a second
    # one is refused (not re-entrant).
    holding: set[tuple[str, str]]

    def acquire(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        wait: float | None = None,
        session: str | None = None,
        limit: int | None = None,
        shared: bool = False,
        place: int | None = None,
        rejoin: bool = False,
    ) -> AcquireAttempt: ...

    def renew(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        retry_until: float | None = None,
    ) -> LockGrant: ...

    def release(
        self, resource: str, owner: str, *, run: Mapping[str, Any] | None = None
    ) -> None: ...

    def get(self, resource: str) -> LockGrant: ...


class SetPort(Protocol):
    """What a held set needs of a client: the three calls of sets and the
    tuning of a wait."""

    backoff: float
    max_backoff: float
    max_lock_poll: float
    max_server_wait: float
    rng: random.Random
    holding: set[tuple[str, str]]

    def acquire_all(
        self,
        members: Sequence[SetMember | str],
        owner: str,
        ttl: float | None = None,
        *,
        wait: float | None = None,
        places: dict[str, int] | None = None,
        rejoin: bool = False,
    ) -> SetAttempt: ...

    def renew_all(
        self,
        resources: Sequence[str],
        owner: str,
        ttl: float | None = None,
        *,
        retry_until: float | None = None,
    ) -> tuple[LockGrant, ...]: ...

    def release_all(self, resources: Sequence[str], owner: str) -> SetRelease: ...


class DirectCalls(Protocol):
    """A transport that answers the client's calls in this process (the
    embedded mode's) may offer this: the client then calls it with the call's
    parts instead of sending an HTTP request through it, and reads its answer
    as a response (``status_code``, ``headers``, ``json()``). Over a network
    the request is the cost that matters; in process, building and parsing it
    and its JSON would cost as much CPU as the lock's own work. The followed
    event stream (``watch()``) still goes through the transport's requests."""

    def lockkeeper_request(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: dict[str, str] | None,
        headers: dict[str, str],
    ) -> Any: ...
