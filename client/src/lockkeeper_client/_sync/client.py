# Generated from _async/ by client/scripts/make_sync.py: edit that.
"""The client class: one method per API call, transient failures retried.

Each call is one request; transient failures (connection errors, timeouts,
502/503/504) are retried as ``decisions.TransientRetries`` decides. Every other
answer outside the call's success becomes one exception of ``errors.py``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import httpx

from lockkeeper_client import decisions
from lockkeeper_client._concurrency import sleep
from lockkeeper_client._sync.held import HeldLock
from lockkeeper_client._sync.held_set import HeldSet
from lockkeeper_client._sync.port import DirectCalls
from lockkeeper_client._sync.session import Leadership, LockSession
from lockkeeper_client._sync.watch import follow_events
from lockkeeper_client._transports import fast_streams
from lockkeeper_client.decisions import API_PREFIX, DEFAULT_TIMEOUT
from lockkeeper_client.errors import LockMissing
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

F = TypeVar("F", bound=Callable[..., Any])


class LockClient:
    """HTTP client for one Lockkeeper server.

    :param base_url: the server, e.g. ``http://locks.internal:8000`` (a trailing
        ``/api/v1`` is accepted too).
    :param token: an API token (``lockkeeper tokens create NAME``).
    :raise ConfigurationError: an empty token or one no header can carry, a URL
        without ``http://``/``https://`` or a host. (A base path that does not
        lead to the API shows at the first call: ``UnexpectedResponse``.)
    :param timeout: seconds for one HTTP request.
    :param retries: attempts after the first for a transient failure.
    :param backoff: the first retry window in seconds; each further retry doubles it
        (full jitter: the delay is uniform in ``[0, window]``) up to ``max_backoff``.
    :param max_lock_poll: the largest window while waiting for a held lock. Kept
        short: a waiter whose window had grown to seconds would lose every race to
        one that just released and polls again within ``backoff``.
    :param rng: the source of jitter (tests pass a seeded or fixed one).
    :param max_server_wait: ``lock()`` waits in the server's line in requests of at
        most this many seconds (the server's ``LOCKKEEPER_MAX_WAIT``, 30 by
        default; a smaller server maximum is learnt from its 400). 0: never wait
        server-side, poll.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        retries: int = 4,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        max_lock_poll: float = 0.5,
        max_server_wait: float = 30.0,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = decisions.api_root(base_url)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_lock_poll = max_lock_poll
        self.max_server_wait = max_server_wait
        self.rng = rng or random.Random()
        self.holding: set[tuple[str, str]] = set()
        authorization = decisions.bearer(token)
        self._http = httpx.Client(
            base_url=self.base_url + API_PREFIX,
            headers={"Authorization": authorization, "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )
        if transport is None:
            fast_streams(self._http)
        # A transport that answers in this process takes the calls directly.
        self._direct: DirectCalls | None = (
            transport if hasattr(transport, "lockkeeper_request") else None
        )
        self._authorization = {"Authorization": authorization}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LockClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- single requests ---------------------------------------------------------

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
    ) -> AcquireAttempt:
        """Try once to take ``resource`` for ``owner``.

        ``session``: the id of a session of this token and owner to bind the
        grant to, instead of a ``ttl`` (see ``session()``).

        ``limit``: take one of that many holders of a counting semaphore;
        ``shared``: a shared (read) grant, coexisting with other shared grants.
        A resource in use with another limit or kind raises ``LimitMismatch``.
        Acquiring again with the other mode changes the caller's own grant: to
        shared always (same fence), to exclusive only while it is the sole
        holder (a new fence).

        Without ``wait`` it never waits for a holder. With ``wait`` > 0 the server
        keeps the request in the resource's line (granted in order of arrival) for
        up to ``wait`` seconds; when that server worker's waiting room is full the
        result has ``waiting_room_full`` set and the caller should poll.
        ``place`` (with ``wait``): 0 asks the server to keep this request's
        place in line if its room turns it away (the result's ``place`` names
        it, kept for 2 s); pass that number on the next try to wait from
        there instead of at the end of the line (``lock()`` does this). Such a
        retry closes its connection after its answer: a connection stays with
        the server worker that took it, whose room was full, and the next try
        on a new one may reach a worker with room. ``rejoin`` (with ``wait``):
        the caller waits on after this request, so if its wait runs out the
        server keeps its place (the result's ``place``, kept for 2 s) for the
        next try to present (``lock()`` asks for it when its wait is longer
        than the server's largest).

        A same-owner acquire of a still-valid lock keeps its fence, so a retry of an
        acquire whose reply was lost does not fence out its own caller.

        A holder that went while the server decided (its "lock changed hands"
        503) is asked about again at once, up to ``retries`` times, by an
        acquire without ``wait``; a waiting one returns it (``changed_hands``,
        ``lock`` None): its caller decides whether time is left to ask again.
        """
        changed_hands = 0
        while True:
            response, _ = self._send(
                "POST",
                resource,
                json=decisions.acquire_body(
                    owner,
                    ttl,
                    wait,
                    kind=LockKind(limit, shared),
                    session=session,
                    place=place,
                    rejoin=rejoin,
                ),
                waiting=float(wait or 0.0),
                headers=decisions.acquire_headers(wait, place),
            )
            if (
                wait
                or changed_hands >= self.retries
                or not decisions.is_lock_changed_hands(response)
            ):
                return decisions.acquire_outcome(response, resource)
            changed_hands += 1

    def renew(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        retry_until: float | None = None,
    ) -> LockGrant:
        """Extend ``owner``'s lock to ``now + ttl``; same fence and acquired_at.

        Renew is idempotent, so a renew whose reply was lost is simply sent again.

        :param retry_until: a ``time.monotonic()`` deadline for transient retries
            (the renewer passes the lock's expiry: retrying later is pointless).
        :raise LockLost: the lock expired, or another owner holds it (404/409).
        """
        response, _ = self._send(
            "PATCH",
            resource,
            json=decisions.acquire_body(owner, ttl),
            retry_until=retry_until,
        )
        return decisions.renew_outcome(response, resource, owner)

    def release(
        self, resource: str, owner: str, *, run: Mapping[str, Any] | None = None
    ) -> None:
        """Release ``owner``'s lock.

        ``run``: how the work done under the lock ended (``exit_status``, and
        optionally ``duration`` in seconds and ``host``), kept with the release in
        the audit log.

        :raise LockLost: the lock had expired or was held by another owner
            (404/403): whatever the caller did since it was lost was unprotected.
        """
        body: dict[str, Any] = {"owner": owner}
        if run is not None:
            body["run"] = dict(run)
        response, maybe_applied = self._send("DELETE", resource, json=body)
        decisions.release_outcome(response, resource, owner, maybe_applied)

    def acquire_all(
        self,
        members: Sequence[SetMember | str],
        owner: str,
        ttl: float | None = None,
        *,
        session: str | None = None,
        wait: float | None = None,
        places: dict[str, int] | None = None,
        rejoin: bool = False,
    ) -> SetAttempt:
        """Try once to take every member at once for ``owner``: granted whole
        (each its own grant and fence) or refused whole, naming the member
        that refused (``SetAttempt.refused``). A bare name is an exclusive
        member; ``SetMember(resource, LockKind(limit, shared))`` another kind.
        ``session``: the id of a session of ``owner`` to bind every member to,
        instead of a ``ttl``: its heartbeat renews them and its end releases
        them. ``SetAttempt.set_id`` names the set its events carry.

        With ``wait`` > 0 the server keeps the set in every member's line
        (holding none of them meanwhile) for up to ``wait`` seconds, at most
        its LOCKKEEPER_MAX_WAIT (past it a 400); when that server worker's
        waiting room is full the result has ``waiting_room_full`` set and the
        caller should poll (``lock_all()`` does both). ``places`` and
        ``rejoin`` (with ``wait``): ``acquire``'s ``place`` and ``rejoin`` for
        the set: {} asks the server to keep its place in every member's line
        (``SetAttempt.places`` names them), which the next attempt presents.
        """
        found = decisions.set_members(list(members))
        label = decisions.set_label([m.resource for m in found])
        response, _ = self._send(
            "POST",
            label,
            json=decisions.set_acquire_body(
                owner, ttl, found, session, wait, places, rejoin
            ),
            path=decisions.SETS_PATH,
            waiting=float(wait or 0.0),
            headers=decisions.acquire_headers(wait, places),
        )
        return decisions.set_acquire_outcome(response, label)

    def renew_all(
        self,
        resources: Sequence[str],
        owner: str,
        ttl: float | None = None,
        *,
        retry_until: float | None = None,
    ) -> tuple[LockGrant, ...]:
        """Renew every member of ``owner``'s set to ``now + ttl``, or none.

        :raise LockLost: a member is no longer held (404/409): none renewed.
        """
        label = decisions.set_label(list(resources))
        body: dict[str, Any] = {"owner": owner, "resources": list(resources)}
        if ttl is not None:
            body["ttl"] = ttl
        response, _ = self._send(
            "PATCH", label, json=body, path=decisions.SETS_PATH, retry_until=retry_until
        )
        return decisions.set_renew_outcome(response, label, owner)

    def release_all(self, resources: Sequence[str], owner: str) -> SetRelease:
        """Release every member ``owner`` still holds; names the others."""
        label = decisions.set_label(list(resources))
        response, _ = self._send(
            "DELETE",
            label,
            json={"owner": owner, "resources": list(resources)},
            path=decisions.SETS_PATH,
        )
        return decisions.set_release_outcome(response, label)

    def get(self, resource: str) -> LockGrant:
        """The valid lock on ``resource``.

        :raise LockMissing: nobody holds it (absent or expired).
        """
        response, _ = self._send("GET", resource)
        return decisions.get_outcome(response, resource)

    def check_fence(self, resource: str, fence: int) -> LockGrant:
        """Ask whether ``fence`` is the valid grant of ``resource`` right now, for
        a store that cannot compare fences itself; returns that lock.

        :raise FenceRejected: another grant, a lapsed one, or none is in place.
        """
        response, _ = self._send("GET", resource, params={"fence": str(int(fence))})
        return decisions.fence_outcome(response, resource, fence)

    # -- sessions ------------------------------------------------------------------

    def create_session(self, owner: str, ttl: float) -> SessionInfo:
        """Start a session of ``owner`` that expires ``ttl`` seconds from now
        unless renewed. Not retried after a reply may have been lost (a retry
        would start a second session): a transient failure raises."""
        response, _ = self._send(
            "POST",
            "",
            path=decisions.SESSIONS_PATH,
            json={"owner": owner, "ttl": ttl},
            retry=False,
        )
        return decisions.session_outcome(response, None, "start")

    def heartbeat(
        self, session_id: str, *, retry_until: float | None = None
    ) -> SessionInfo:
        """Renew the session and every lock bound to it.

        :raise SessionLost: it has expired or ended (404/409).
        """
        response, _ = self._send(
            "PATCH",
            "",
            path=decisions.session_path(session_id),
            retry_until=retry_until,
        )
        return decisions.session_outcome(response, session_id, "heartbeat")

    def get_session(self, session_id: str) -> SessionInfo:
        """The session with its live locks. :raise SessionLost: it has ended."""
        response, _ = self._send("GET", "", path=decisions.session_path(session_id))
        return decisions.session_outcome(response, session_id, "read")

    def end_session(self, session_id: str) -> None:
        """End the session: every lock bound to it is released."""
        response, maybe_applied = self._send(
            "DELETE", "", path=decisions.session_path(session_id)
        )
        decisions.end_session_outcome(response, session_id, maybe_applied)

    def session(
        self,
        ttl: float = 15.0,
        *,
        owner: str | None = None,
        heartbeat_every: float | None = None,
        on_lost: Callable[[LockSession], None] | None = None,
        raise_on_lost: bool = True,
    ) -> LockSession:
        """A context manager holding a session for the ``with`` block: it
        heartbeats every ``heartbeat_every`` seconds (default ``ttl / 3``, below
        ``ttl``) in the background, ``s.lock(resource)`` binds a lock to it,
        ``s.lost`` is set when it ends under the caller; leaving ends it
        (releasing its locks) and raises ``SessionLost`` if it was lost, unless
        ``raise_on_lost=False``."""
        return LockSession(
            self,
            ttl=ttl,
            owner=owner or default_owner(),
            heartbeat_every=heartbeat_every,
            on_lost=on_lost,
            raise_on_lost=raise_on_lost,
        )

    def leadership(
        self,
        name: str,
        *,
        ttl: float = 15.0,
        wait: float | None = None,
        owner: str | None = None,
        on_lost: Callable[[LockSession], None] | None = None,
        raise_on_lost: bool = True,
    ) -> Leadership:
        """A context manager that waits in line for the lock ``name`` (up to
        ``wait`` seconds; None: until granted) bound to a session of its own, and
        leads for the ``with`` block: ``lead.lost`` is set if the session ends
        under it (then another may lead; ``on_lost(session)`` is called once
        then); leaving hands the lock over, and raises ``SessionLost`` if the
        lead was lost meanwhile (unless ``raise_on_lost=False``)."""
        return Leadership(
            self,
            name,
            ttl=ttl,
            wait=wait,
            owner=owner or default_owner(),
            on_lost=on_lost,
            raise_on_lost=raise_on_lost,
        )

    def leader(self, name: str) -> str | None:
        """The owner that leads ``name`` now, or None."""
        try:
            return (self.get(name)).owner
        except LockMissing:
            return None

    # -- the context manager -----------------------------------------------------

    def lock(
        self,
        resource: str,
        ttl: float = 30.0,
        wait: float | None = 10.0,
        *,
        owner: str | None = None,
        on_lost: Callable[[HeldLock], None] | None = None,
        renew_every: float | None = None,
        limit: int | None = None,
        shared: bool = False,
        raise_on_lost: bool = True,
    ) -> HeldLock:
        """A context manager that holds ``resource`` for the ``with`` block.

        Entering waits at most ``wait`` seconds for the lock (raising
        ``LockNotAcquired``; None: until granted, as ``leadership()``), then
        renews it every ``renew_every`` seconds (default
        ``ttl / 3``; it must be below ``ttl``) in the background; leaving releases
        it, and raises ``LockLost`` if the lock was lost meanwhile (unless
        ``raise_on_lost=False``: then the loss is only logged and left in
        ``lock.lost``). See ``HeldLock``. ``limit``: one of that many holders of a
        semaphore; ``shared``: a shared (read) lock. Waiting is first come, first
        served across both.
        """
        return HeldLock(
            self,
            resource,
            ttl=ttl,
            wait=wait,
            owner=owner or default_owner(),
            on_lost=on_lost,
            renew_every=renew_every,
            kind=LockKind(limit, shared),
            raise_on_lost=raise_on_lost,
        )

    def lock_all(
        self,
        members: Sequence[SetMember | str],
        ttl: float = 30.0,
        wait: float | None = 10.0,
        *,
        owner: str | None = None,
        on_lost: Callable[[HeldSet], None] | None = None,
        renew_every: float | None = None,
        raise_on_lost: bool = True,
    ) -> HeldSet:
        """A context manager that holds every member for the ``with`` block,
        taken as one (all or none, never one waiting for another: no
        deadlock between blocks that name the same resources in other
        orders), renewed as one, released as one. See ``HeldSet``."""
        return HeldSet(
            self,
            decisions.set_members(list(members)),
            ttl=ttl,
            wait=wait,
            owner=owner or default_owner(),
            on_lost=on_lost,
            renew_every=renew_every,
            raise_on_lost=raise_on_lost,
        )

    def synchronized(
        self,
        resource: str,
        ttl: float = 30.0,
        wait: float | None = 10.0,
        **options: Any,
    ) -> Callable[[F], F]:
        """A decorator: each call of the function runs holding ``resource``
        (pottery's ``synchronize``; a coroutine function for
        ``AsyncLockClient``): ``lock(resource, ttl, wait, **options)`` around
        the call, so a wait that runs out raises ``LockNotAcquired`` and a loss
        raises ``LockLost`` at the call's end."""

        def decorate(function: F) -> F:
            @functools.wraps(function)
            def run(*args: Any, **kwargs: Any) -> Any:
                with self.lock(resource, ttl, wait, **options):
                    return function(*args, **kwargs)

            return cast(F, run)

        return decorate

    # -- following the audit log ---------------------------------------------------

    def watch(
        self,
        *,
        resource: str | None = None,
        prefix: str | None = None,
        owner: str | None = None,
        action: str | None = None,
        actor: str | None = None,
        after: int | None = None,
        idle_timeout: float = decisions.DEFAULT_WATCH_IDLE,
        give_up_after: float | None = None,
    ) -> Iterator[LockEvent]:
        """Every new event of the audit log (matching the filters, within the
        token's scope), oldest first, as it is written; it runs until the caller
        stops iterating, across server restarts and failovers.

        ``after``: start after this event id (a value saved from ``event.id``);
        None starts from now. A dropped connection, a stream the server ended
        (a graceful shutdown), a stream silent for ``idle_timeout`` seconds (the
        server sends a comment every 15 s) or a 502/503/504 is followed by a
        reconnect, resuming after the last id seen: no event is missed or
        repeated. Reconnects back off on their own (``backoff`` doubling up to
        ``max_backoff``, not the ordinary calls' ``retries``) and go on for as
        long as it takes; ``give_up_after`` seconds of failing in a row raise
        ``ServiceUnavailable`` instead.
        """
        filters = {
            "resource": resource,
            "prefix": prefix,
            "owner": owner,
            "action": action,
            "actor": actor,
        }
        return follow_events(
            self._http,
            decisions.watch_params(filters),
            after=after,
            new_retries=lambda: decisions.watch_retries(
                self.backoff, self.max_backoff, self.rng, give_up_after
            ),
            timeout=httpx.Timeout(self.timeout, read=idle_timeout),
            base_url=self.base_url,
        )

    # -- plumbing ----------------------------------------------------------------

    def _send(
        self,
        method: str,
        resource: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        retry_until: float | None = None,
        waiting: float = 0.0,
        path: str | None = None,
        retry: bool = True,
        headers: dict[str, str] | None = None,
    ) -> tuple[httpx.Response, bool]:
        """One API call with transient failures retried.

        Returns the response and whether an earlier attempt may have reached the
        server and been applied (its reply lost). ``waiting``: the seconds a
        waiting acquire may stay at the server (added to the timeout); its
        "waiting room full" 503 is returned, not retried. ``path``: another
        path than the lock's; ``retry`` False: no retry at all; ``headers``:
        the request's own.
        """
        retries = decisions.TransientRetries(
            self.retries if retry else 0,
            self.backoff,
            self.max_backoff,
            self.rng,
            retry_until=retry_until,
        )
        where = path if path is not None else decisions.lock_path(resource)
        while True:
            try:
                if self._direct is not None:
                    response = self._direct.lockkeeper_request(
                        method,
                        where,
                        json=json,
                        params=params,
                        headers={**self._authorization, **(headers or {})},
                    )
                else:
                    response = self._http.request(
                        method,
                        where,
                        json=json,
                        params=params,
                        headers=headers,
                        timeout=retries.timeout(self.timeout) + waiting,
                    )
            except httpx.TransportError as exc:
                delay = retries.next_delay(error=exc)
                if delay is None:
                    raise retries.gave_up(
                        method, resource, self.base_url, error=exc
                    ) from exc
            else:
                if not retries.should_retry(response, bool(waiting)):
                    return response, retries.maybe_applied
                delay = retries.next_delay(response=response)
                if delay is None:
                    raise retries.gave_up(
                        method, resource, self.base_url, response=response
                    )
            sleep(delay)
