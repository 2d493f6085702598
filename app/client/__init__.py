"""Worker client for the Lockkeeper JSON API.

``LockClient`` speaks the ``/api/v1`` contract over HTTP and needs nothing of the
server's code or database: a worker installs this module and httpx, names the
server and a token, and takes locks::

    client = LockClient("http://locks.internal:8000", token)
    with client.lock("job:42", ttl=30, wait=10) as lock:
        run_job(fence=lock.fence)
        if lock.lost.is_set():
            ...  # stop writing: someone else may hold job:42 now

Transient failures (connection errors, timeouts, 502/503/504) are retried by
tenacity with exponential backoff and full jitter (the delay is uniform in
``[0, backoff * 2**n]``, as tenacity's ``wait_random_exponential``, but drawn from
the client's ``rng`` and bounded by ``Retry-After``). Every other failure is one
exception class below, and each message names the resource.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    stop_before_delay,
)

from app.timestamps import parse_rfc3339

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 10.0
# Gateways answer 502/504 when the app behind them restarts; the app answers 503
# when its database does not.
TRANSIENT_STATUSES = frozenset({502, 503, 504})


# -- results -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lock:
    """A lock as the server reported it."""

    resource: str
    owner: str
    fence: int
    acquired_at: datetime
    expires_at: datetime
    ttl_remaining: float
    state: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lock:
        return cls(
            resource=data["resource"],
            owner=data["owner"],
            fence=int(data["fence"]),
            acquired_at=parse_rfc3339(data["acquired_at"]),
            expires_at=parse_rfc3339(data["expires_at"]),
            ttl_remaining=float(data["ttl_remaining"]),
            state=data["state"],
        )


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """``acquired`` with the caller's lock, or refused with the current holder.

    On a refusal ``retry_after`` is the server's ``Retry-After`` (seconds until the
    holder's lock expires unless it renews). ``lock`` is None only when the server
    named no holder (it released between the attempt and the look).
    """

    acquired: bool
    lock: Lock | None
    retry_after: float | None = None
    # A waiting acquire found the server's waiting room full (503): poll instead.
    waiting_room_full: bool = False


# The title of the server's 503 for "too many waiting acquires in this worker".
WAITING_ROOM_FULL = "Too many waiting acquires"
_MAX_WAIT_MESSAGE = re.compile(r"must be at most ([0-9.]+) seconds")


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


# -- exceptions ----------------------------------------------------------------


class LockClientError(Exception):
    """Base of every failure the client reports; ``resource`` names the lock."""

    def __init__(self, resource: str | None, message: str, status: int | None = None):
        self.resource = resource
        self.status = status
        super().__init__(message)


class InvalidRequest(LockClientError):
    """The server rejected the request as malformed (400, 413, 415); fix the call.

    ``errors`` holds the server's ``(field, message)`` pairs.
    """

    def __init__(self, resource, message, status=None, errors=()):
        super().__init__(resource, message, status)
        self.errors = list(errors)


class AuthenticationFailed(LockClientError):
    """The token is missing, wrong or revoked (401)."""


class LockNotFound(LockClientError):
    """No valid lock on the resource (``get`` answered 404)."""


class LockNotAcquired(LockClientError):
    """The lock stayed held by someone else for the whole ``wait``.

    ``holder`` is the last holder the server named, when it named one.
    """

    def __init__(self, resource, message, holder: Lock | None = None):
        super().__init__(resource, message, 409)
        self.holder = holder


class LockFrozen(LockClientError):
    """An operator froze the resource's prefix (423): no new grants until the
    freeze ends; locks already held can still be renewed and released.

    ``freeze`` is the server's description: ``prefix``, ``reason``, ``actor``,
    ``frozen_at`` and ``ends_at`` (None: until unfrozen).
    """

    def __init__(self, resource, message, freeze: dict[str, Any] | None = None):
        super().__init__(resource, message, 423)
        self.freeze = freeze or {}


class FenceRejected(LockClientError):
    """``check_fence``: the fence is not the valid grant of the resource (409).

    ``current`` is the lock as it is now (None when nobody holds it).
    """

    def __init__(self, resource, message, current: Lock | None = None):
        super().__init__(resource, message, 409)
        self.current = current


class LockLost(LockClientError):
    """The caller no longer holds the lock: it expired, was force-released or was
    taken by another owner. Renew and release answer this; stop using the fence."""


class ServiceUnavailable(LockClientError):
    """The server could not be reached, or kept answering 502/503/504, for as long
    as the retry budget allowed."""


class UnexpectedResponse(LockClientError):
    """An answer outside the API contract (a 500, or a body that is not the JSON
    the contract promises)."""


class _Transient(Exception):
    """A 502/503/504 answer, retried like a connection error."""

    def __init__(self, response: httpx.Response):
        self.response = response
        self.retry_after = parse_retry_after(response.headers.get("Retry-After"))
        super().__init__(f"HTTP {response.status_code}")


def _problem_detail(response: httpx.Response) -> tuple[str, list[tuple[str, str]]]:
    """The human part of an RFC 9457 problem body, and its field errors."""
    try:
        body = response.json()
    except ValueError:
        return (response.text.strip()[:200] or response.reason_phrase), []
    if not isinstance(body, dict):
        return response.reason_phrase, []
    errors = [
        (str(item.get("field")), str(item.get("message")))
        for item in body.get("errors") or []
        if isinstance(item, dict)
    ]
    detail = str(body.get("detail") or body.get("title") or response.reason_phrase)
    return detail, errors


# -- the client ----------------------------------------------------------------


class LockClient:
    """Blocking HTTP client for one Lockkeeper server; safe to share between threads.

    :param base_url: the server, e.g. ``http://locks.internal:8000`` (a trailing
        ``/api/v1`` is accepted too).
    :param token: an API token (``lockkeeper tokens create NAME``).
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
        root = base_url.rstrip("/")
        if root.endswith(API_PREFIX):
            root = root[: -len(API_PREFIX)]
        self.base_url = root
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_lock_poll = max_lock_poll
        self.max_server_wait = max_server_wait
        self.rng = rng or random.Random()
        self._http = httpx.Client(
            base_url=root + API_PREFIX,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
            },
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LockClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- single requests ---------------------------------------------------------

    def acquire(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        wait: float | None = None,
    ) -> AcquireResult:
        """Try once to take ``resource`` for ``owner``.

        Without ``wait`` it never waits for a holder. With ``wait`` > 0 the server
        keeps the request in the resource's line (granted in order of arrival) for
        up to ``wait`` seconds; when that server worker's waiting room is full the
        result has ``waiting_room_full`` set and the caller should poll.

        A same-owner acquire of a still-valid lock keeps its fence, so a retry of an
        acquire whose reply was lost does not fence out its own caller.
        """
        body: dict[str, Any] = {"owner": owner}
        if ttl is not None:
            body["ttl"] = ttl
        if wait:
            body["wait"] = wait
        response, _ = self._send(
            "POST", resource, json=body, waiting=float(wait or 0.0)
        )
        if response.status_code == 503:  # only returned for a full waiting room
            return AcquireResult(
                False,
                None,
                parse_retry_after(response.headers.get("Retry-After")),
                waiting_room_full=True,
            )
        if response.status_code == 200:
            data = self._json(response, resource)
            return AcquireResult(True, self._lock_from(data.get("lock"), resource))
        if response.status_code == 409:
            data = self._json(response, resource)
            holder = data.get("lock")
            return AcquireResult(
                False,
                self._lock_from(holder, resource) if holder else None,
                parse_retry_after(response.headers.get("Retry-After")),
            )
        raise self._failure(response, resource, "acquire")

    def renew(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        retry_until: float | None = None,
    ) -> Lock:
        """Extend ``owner``'s lock to ``now + ttl``; same fence and acquired_at.

        Renew is idempotent, so a renew whose reply was lost is simply sent again.

        :param retry_until: a ``time.monotonic()`` deadline for transient retries
            (the renewer passes the lock's expiry: retrying later is pointless).
        :raise LockLost: the lock expired, or another owner holds it (404/409).
        """
        body: dict[str, Any] = {"owner": owner}
        if ttl is not None:
            body["ttl"] = ttl
        response, _ = self._send("PATCH", resource, json=body, retry_until=retry_until)
        if response.status_code == 200:
            return self._lock_from(self._json(response, resource), resource)
        if response.status_code in (404, 409):
            detail, _ = _problem_detail(response)
            raise LockLost(
                resource,
                f"lock {resource!r} is no longer held by {owner!r}: {detail}",
                response.status_code,
            )
        raise self._failure(response, resource, "renew")

    def release(self, resource: str, owner: str) -> None:
        """Release ``owner``'s lock.

        :raise LockLost: the lock had expired or was held by another owner
            (404/403): whatever the caller did since it was lost was unprotected.
        """
        response, maybe_applied = self._send("DELETE", resource, json={"owner": owner})
        if response.status_code in (200, 204):
            return
        if response.status_code in (403, 404):
            if maybe_applied:
                # An earlier attempt may have released it before its reply was
                # lost; the lock is not ours either way, which is what was asked.
                log.info("release of %r: earlier attempt likely applied", resource)
                return
            detail, _ = _problem_detail(response)
            raise LockLost(
                resource,
                f"lock {resource!r} was no longer held by {owner!r}: {detail}",
                response.status_code,
            )
        raise self._failure(response, resource, "release")

    def get(self, resource: str) -> Lock:
        """The valid lock on ``resource``.

        :raise LockNotFound: nobody holds it (absent or expired).
        """
        response, _ = self._send("GET", resource)
        if response.status_code == 200:
            return self._lock_from(self._json(response, resource), resource)
        if response.status_code == 404:
            detail, _ = _problem_detail(response)
            raise LockNotFound(resource, f"no lock on {resource!r}: {detail}", 404)
        raise self._failure(response, resource, "get")

    def check_fence(self, resource: str, fence: int) -> Lock:
        """Ask whether ``fence`` is the valid grant of ``resource`` right now, for
        a store that cannot compare fences itself; returns that lock.

        :raise FenceRejected: another grant, a lapsed one, or none is in place.
        """
        response, _ = self._send("GET", resource, params={"fence": str(int(fence))})
        if response.status_code == 200:
            return self._lock_from(self._json(response, resource), resource)
        if response.status_code == 409:
            data = self._json(response, resource)
            current = data.get("lock")
            raise FenceRejected(
                resource,
                f"fence {fence} is not the valid grant of {resource!r}: "
                f"{_problem_detail(response)[0]}",
                self._lock_from(current, resource) if current else None,
            )
        raise self._failure(response, resource, "fence check")

    # -- the context manager -----------------------------------------------------

    def lock(
        self,
        resource: str,
        ttl: float = 30.0,
        wait: float = 10.0,
        *,
        owner: str | None = None,
        on_lost: Callable[[HeldLock], None] | None = None,
        renew_every: float | None = None,
    ) -> HeldLock:
        """A context manager that holds ``resource`` for the ``with`` block.

        Entering waits at most ``wait`` seconds for the lock (raising
        ``LockNotAcquired``), then renews it every ``renew_every`` seconds (default
        ``ttl / 3``) in a background thread; leaving releases it. See ``HeldLock``.
        """
        return HeldLock(
            self,
            resource,
            ttl=ttl,
            wait=wait,
            owner=owner or default_owner(),
            on_lost=on_lost,
            renew_every=renew_every,
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
    ) -> tuple[httpx.Response, bool]:
        """One API call with transient failures retried.

        Returns the response and whether an earlier attempt may have reached the
        server and been applied (its reply lost): only a refused connection or a
        503 (the app's "database not answering") proves it was not. ``waiting``:
        the seconds a waiting acquire may stay at the server (added to the
        timeout); its "waiting room full" 503 is returned, not retried.
        """
        path = "/locks/" + quote(resource, safe="")
        maybe_applied = False
        if retry_until is None:
            stop = stop_after_attempt(self.retries + 1)
        else:
            stop = stop_before_delay(max(retry_until - time.monotonic(), 0.0))

        def note_failure(state: RetryCallState) -> None:
            nonlocal maybe_applied
            failure = state.outcome.exception() if state.outcome else None
            if isinstance(failure, httpx.ConnectError | httpx.ConnectTimeout):
                return
            if isinstance(failure, _Transient) and failure.response.status_code == 503:
                return
            maybe_applied = True

        retrying = Retrying(
            retry=retry_if_exception_type((httpx.TransportError, _Transient)),
            wait=self._transient_delay,
            stop=stop,
            after=note_failure,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    timeout = self.timeout
                    if retry_until is not None:
                        timeout = min(timeout, max(retry_until - time.monotonic(), 0.1))
                    response = self._http.request(
                        method,
                        path,
                        json=json,
                        params=params,
                        timeout=timeout + waiting,
                    )
                    if waiting and _is_waiting_room_full(response):
                        return response, maybe_applied
                    if response.status_code in TRANSIENT_STATUSES:
                        raise _Transient(response)
        except _Transient as exc:
            detail, _ = _problem_detail(exc.response)
            raise ServiceUnavailable(
                resource,
                f"{method} of lock {resource!r}: the server kept answering "
                f"{exc.response.status_code}: {detail}",
                exc.response.status_code,
            ) from exc
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                resource,
                f"{method} of lock {resource!r}: cannot reach {self.base_url}: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        return response, maybe_applied

    def _transient_delay(self, state: RetryCallState) -> float:
        """Full-jitter backoff; a 503's ``Retry-After`` is the least we wait."""
        window = min(self.max_backoff, self.backoff * 2 ** (state.attempt_number - 1))
        delay = self.rng.uniform(0, window)
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, _Transient) and failure.retry_after is not None:
            delay = max(delay, failure.retry_after)
        return delay

    def _json(self, response: httpx.Response, resource: str) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError as exc:
            raise UnexpectedResponse(
                resource,
                f"lock {resource!r}: HTTP {response.status_code} without a JSON body",
                response.status_code,
            ) from exc
        if not isinstance(data, dict):
            raise UnexpectedResponse(
                resource,
                f"lock {resource!r}: HTTP {response.status_code} body is not an object",
                response.status_code,
            )
        return data

    def _lock_from(self, data: Any, resource: str) -> Lock:
        try:
            return Lock.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedResponse(
                resource, f"lock {resource!r}: malformed lock object {data!r}"
            ) from exc

    def _failure(
        self, response: httpx.Response, resource: str, operation: str
    ) -> LockClientError:
        status = response.status_code
        detail, errors = _problem_detail(response)
        message = f"{operation} of lock {resource!r} failed ({status}): {detail}"
        if status == 401:
            return AuthenticationFailed(resource, message, status)
        if status == 423:
            try:
                freeze = response.json().get("freeze")
            except (ValueError, AttributeError):
                freeze = None
            return LockFrozen(
                resource, message, freeze if isinstance(freeze, dict) else None
            )
        if status in (400, 413, 415, 422):
            if errors:
                message += " [" + "; ".join(f"{f}: {m}" for f, m in errors) + "]"
            return InvalidRequest(resource, message, status, errors)
        return UnexpectedResponse(resource, message, status)


def _server_max_wait(exc: InvalidRequest) -> float | None:
    """The server's largest ``wait`` from its 400, or None when it names none
    (an older server that does not know ``wait``)."""
    for field, message in exc.errors:
        if field == "wait":
            found = _MAX_WAIT_MESSAGE.search(message)
            return float(found.group(1)) if found else None
    return None


def _is_waiting_room_full(response: httpx.Response) -> bool:
    if response.status_code != 503:
        return False
    try:
        return response.json().get("title") == WAITING_ROOM_FULL
    except (ValueError, AttributeError):
        return False


def default_owner() -> str:
    """A fresh owner token: readable on the dashboard, unguessable by other workers."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"


# -- a lock held for a block -----------------------------------------------------


class HeldLock:
    """The lock behind ``with client.lock(...) as lock``.

    - ``lock.fence``, ``lock.expires_at``, ``lock.owner``: the current grant.
    - ``lock.lost``: a ``threading.Event`` set when a renew is refused (404/409) or
      the service could not be reached before the lock expired. ``on_lost(lock)``
      is called once, from the renewal thread, at that moment.
    - Leaving the block releases the lock unless it was lost. Leaving never raises
      a lock error of its own: a loss is reported by ``lost``, a release that
      cannot reach the service is logged (the lock then ends with its ttl), and an
      exception raised inside the block propagates unchanged.

    Waiting for a held lock happens in the server's line (requests with
    ``"wait"``, each at most ``client.max_server_wait`` seconds): the server grants
    in order of arrival and hands a released lock over at once. When the server's
    waiting room is full (503), or the server does not wait (an older server), it
    polls instead: exponential backoff with full jitter, each delay capped by the
    ``Retry-After`` of the refusal (the holder's remaining ttl). It never waits
    longer than ``wait``.
    """

    def __init__(
        self,
        client: LockClient,
        resource: str,
        *,
        ttl: float,
        wait: float,
        owner: str,
        on_lost: Callable[[HeldLock], None] | None = None,
        renew_every: float | None = None,
    ):
        if not ttl > 0:
            raise ValueError(f"ttl for {resource!r} must be positive, not {ttl!r}")
        if wait < 0:
            raise ValueError(f"wait for {resource!r} must not be negative")
        self.client = client
        self.resource = resource
        self.owner = owner
        self.ttl = ttl
        self.wait = wait
        self.on_lost = on_lost
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.current: Lock | None = None
        self._valid_until = 0.0  # time.monotonic() by which the lock surely expired
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._sent_at = 0.0
        self._unreachable: ServiceUnavailable | None = None

    @property
    def fence(self) -> int:
        return self._held().fence

    @property
    def expires_at(self) -> datetime:
        return self._held().expires_at

    def _held(self) -> Lock:
        if self.current is None:
            raise RuntimeError(f"lock {self.resource!r} has not been acquired")
        return self.current

    def __enter__(self) -> HeldLock:
        self.acquire()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.release()
        return False

    def acquire(self) -> None:
        """Wait up to ``wait`` seconds for the lock, then start renewing it.

        :raise LockNotAcquired: another owner held it for the whole wait.
        :raise ServiceUnavailable: the service could not be reached in that time.
        """
        deadline = time.monotonic() + self.wait
        result = self._wait_in_line(deadline)
        if result is None:
            result = self._poll(deadline)
        self._granted(result.lock, sent_at=self._sent_at)
        self._renewer = threading.Thread(
            target=self._renew_until_stopped,
            name=f"lockkeeper-renew:{self.resource}",
            daemon=True,
        )
        self._renewer.start()

    def _wait_in_line(self, deadline: float) -> AcquireResult | None:
        """Wait in the server's line in chunks until granted or ``deadline``.

        Returns the grant, or None when the rest of the wait must poll (the
        waiting room is full, the server does not wait, or no wait was asked).
        :raise LockNotAcquired: the whole wait ran out in line.
        """
        client = self.client
        last: AcquireResult | None = None
        while True:
            remaining = deadline - time.monotonic()
            chunk = min(remaining, client.max_server_wait)
            if chunk < 0.001:
                if last is None:
                    return None  # wait=0: one plain try, by the polling path
                holder = f" by {last.lock.owner!r}" if last.lock else ""
                raise LockNotAcquired(
                    self.resource,
                    f"lock {self.resource!r} stayed held{holder} for {self.wait:g} s",
                    last.lock,
                )
            self._sent_at = time.monotonic()
            try:
                last = client.acquire(self.resource, self.owner, self.ttl, wait=chunk)
            except InvalidRequest as exc:
                server_max = _server_max_wait(exc)
                if server_max is None or server_max >= client.max_server_wait:
                    client.max_server_wait = 0.0  # the server does not wait: poll
                    return None
                client.max_server_wait = server_max
                continue
            except ServiceUnavailable:
                return None  # the polling path retries for the rest of the wait
            if last.acquired:
                return last
            if last.waiting_room_full:
                return None

    def _poll(self, deadline: float) -> AcquireResult:
        retrying = Retrying(
            retry=retry_if_result(lambda result: not result.acquired),
            wait=self._contention_delay,
            stop=stop_after_delay(max(deadline - time.monotonic(), 0.0)),
        )
        try:
            return retrying(self._attempt, deadline)
        except RetryError as exc:
            last = exc.last_attempt.result()
            if last.lock is None and self._unreachable is not None:
                raise self._unreachable from None
            holder = f" by {last.lock.owner!r}" if last.lock else ""
            raise LockNotAcquired(
                self.resource,
                f"lock {self.resource!r} stayed held{holder} for {self.wait:g} s",
                last.lock,
            ) from None

    def release(self) -> None:
        """Stop renewing and release the lock, unless it was lost already."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.current is None or self.lost.is_set():
            return
        try:
            self.client.release(self.resource, self.owner)
        except LockLost as exc:
            # Lost between the last renew and the release: report it, do not raise.
            self._mark_lost(str(exc), notify=False)
        except LockClientError as exc:
            log.warning("%s; the lock ends when its ttl runs out", exc)

    def _attempt(self, deadline: float) -> AcquireResult:
        self._sent_at = time.monotonic()
        try:
            result = self.client.acquire(self.resource, self.owner, self.ttl)
        except ServiceUnavailable as exc:
            if time.monotonic() >= deadline:
                raise
            # Unreachable for a moment: count it as a refusal and wait on.
            self._unreachable = exc
            return AcquireResult(False, None, None)
        self._unreachable = None
        return result

    def _contention_delay(self, state: RetryCallState) -> float:
        result: AcquireResult = state.outcome.result()
        client = self.client
        window = min(
            client.max_backoff,
            client.max_lock_poll,
            client.backoff * 2 ** (state.attempt_number - 1),
        )
        delay = client.rng.uniform(0, window)
        if result.retry_after:
            delay = min(delay, result.retry_after)
        remaining = self.wait - state.seconds_since_start
        return max(min(delay, remaining), 0.0)

    def _granted(self, lock: Lock | None, sent_at: float) -> None:
        if lock is None:
            raise UnexpectedResponse(self.resource, "a grant without a lock object")
        self.current = lock
        # Measured from when the request left: never later than the server's expiry.
        self._valid_until = sent_at + lock.ttl_remaining

    def _renew_until_stopped(self) -> None:
        interval = self.renew_every
        while not self._stop.wait(interval):
            sent_at = time.monotonic()
            try:
                lock = self.client.renew(
                    self.resource, self.owner, self.ttl, retry_until=self._valid_until
                )
            except LockLost as exc:
                self._mark_lost(str(exc))
                return
            except LockClientError as exc:
                if time.monotonic() >= self._valid_until:
                    self._mark_lost(
                        f"lock {self.resource!r} expired before it could be renewed: "
                        f"{exc}"
                    )
                    return
                log.warning("renewing %r failed, retrying: %s", self.resource, exc)
                interval = min(self.renew_every, self.client.max_backoff) / 2
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
