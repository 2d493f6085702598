"""The HTTP face of the client: ``LockClient``, one method per API call.

Each call is one request; transient failures (connection errors, timeouts,
502/503/504) are retried by tenacity with exponential backoff and full jitter (the
delay is uniform in ``[0, backoff * 2**n]``, as tenacity's
``wait_random_exponential``, but drawn from the client's ``rng`` and never shorter
than a ``Retry-After``). Every other answer outside the call's success becomes one
exception of ``errors.py``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
)
from tenacity.stop import stop_base

from lockkeeper_client.errors import (
    AccessDenied,
    AuthenticationFailed,
    FenceRejected,
    InvalidRequest,
    LockClientError,
    LockFrozen,
    LockLost,
    LockMissing,
    LockQuotaReached,
    ServiceUnavailable,
    UnexpectedResponse,
)
from lockkeeper_client.grants import AcquireAttempt, LockGrant, default_owner
from lockkeeper_client.held import HeldLock

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 10.0
# Gateways answer 502/504 when the app behind them restarts; the app answers 503
# when its database does not.
TRANSIENT_STATUSES = frozenset({502, 503, 504})
# The title of the server's 503 for "too many waiting acquires in this worker".
WAITING_ROOM_FULL = "Too many waiting acquires"
ACCESS_DENIED_TITLE = "Forbidden"  # the 403 of a token's scope


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


class _Transient(Exception):
    """A 502/503/504 answer, retried like a connection error."""

    def __init__(self, response: httpx.Response):
        self.response = response
        self.retry_after = parse_retry_after(response.headers.get("Retry-After"))
        super().__init__(f"HTTP {response.status_code}")


def problem_detail(response: httpx.Response) -> tuple[str, list[tuple[str, str]]]:
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


def _is_access_denied(response: httpx.Response) -> bool:
    """A 403 about the token (its scope), not about who holds the lock: a release
    by another holder is a 403 too, titled after the holder."""
    if response.status_code != 403:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("title") == ACCESS_DENIED_TITLE


def _lost(response: httpx.Response, resource: str, what: str) -> LockLost:
    detail, _ = problem_detail(response)
    return LockLost(
        resource, f"lock {resource!r} {what}: {detail}", response.status_code
    )


def _is_waiting_room_full(response: httpx.Response) -> bool:
    if response.status_code != 503:
        return False
    try:
        return bool(response.json().get("title") == WAITING_ROOM_FULL)
    except (ValueError, AttributeError):
        return False


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
    ) -> AcquireAttempt:
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
            return AcquireAttempt(
                False,
                None,
                parse_retry_after(response.headers.get("Retry-After")),
                waiting_room_full=True,
            )
        if response.status_code == 200:
            data = self._json(response, resource)
            return AcquireAttempt(True, self._lock_from(data.get("lock"), resource))
        if response.status_code == 409:
            data = self._json(response, resource)
            holder = data.get("lock")
            return AcquireAttempt(
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
    ) -> LockGrant:
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
            raise _lost(response, resource, f"is no longer held by {owner!r}")
        raise self._failure(response, resource, "renew")

    def release(self, resource: str, owner: str) -> None:
        """Release ``owner``'s lock.

        :raise LockLost: the lock had expired or was held by another owner
            (404/403): whatever the caller did since it was lost was unprotected.
        """
        response, maybe_applied = self._send("DELETE", resource, json={"owner": owner})
        if response.status_code in (200, 204):
            return
        if response.status_code in (403, 404) and not _is_access_denied(response):
            if maybe_applied:
                # An earlier attempt may have released it before its reply was
                # lost; the lock is not ours either way, which is what was asked.
                log.info("release of %r: earlier attempt likely applied", resource)
                return
            raise _lost(response, resource, f"was no longer held by {owner!r}")
        raise self._failure(response, resource, "release")

    def get(self, resource: str) -> LockGrant:
        """The valid lock on ``resource``.

        :raise LockMissing: nobody holds it (absent or expired).
        """
        response, _ = self._send("GET", resource)
        if response.status_code == 200:
            return self._lock_from(self._json(response, resource), resource)
        if response.status_code == 404:
            detail, _ = problem_detail(response)
            raise LockMissing(resource, f"no lock on {resource!r}: {detail}", 404)
        raise self._failure(response, resource, "get")

    def check_fence(self, resource: str, fence: int) -> LockGrant:
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
                f"{problem_detail(response)[0]}",
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
        stop: stop_base
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
            detail, _ = problem_detail(exc.response)
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

    def _lock_from(self, data: Any, resource: str) -> LockGrant:
        try:
            return LockGrant.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedResponse(
                resource, f"lock {resource!r}: malformed lock object {data!r}"
            ) from exc

    def _failure(
        self, response: httpx.Response, resource: str, operation: str
    ) -> LockClientError:
        status = response.status_code
        detail, errors = problem_detail(response)
        message = f"{operation} of lock {resource!r} failed ({status}): {detail}"
        if status == 401:
            return AuthenticationFailed(resource, message, status)
        if status == 403:
            return AccessDenied(resource, message, status)
        if status == 429:
            return LockQuotaReached(
                resource,
                message,
                parse_retry_after(response.headers.get("Retry-After")),
            )
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
