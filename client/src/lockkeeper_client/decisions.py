"""Every decision of the client, without I/O: what an answer means, whether and
how long to wait before the next try.

The async client (``_async/``) and its generated sync twin (``_sync/``) send
requests and sleep; everything they decide comes from here, so both behave the
same by construction:

- ``*_outcome(response, ...)``: the API's answer to one call as the client's
  value or exception (status → outcome);
- ``TransientRetries``: the retry budget of one call against connection errors,
  timeouts and 502/503/504 (exponential backoff, full jitter, never shorter than a
  ``Retry-After``);
- ``contention_delay`` / ``rejoin_at_once``: the pauses of a wait for a held lock;
- ``server_max_wait``: the server's largest ``wait``, read from its 400.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

from lockkeeper_client.errors import (
    AccessDenied,
    AuthenticationFailed,
    ConfigurationError,
    FenceRejected,
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
    EXCLUSIVE,
    AcquireAttempt,
    LockEvent,
    LockGrant,
    LockKind,
    SessionInfo,
    SetAttempt,
    SetMember,
    SetRelease,
)

log = logging.getLogger("lockkeeper_client")

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 10.0
# Gateways answer 502/504 when the app behind them restarts; the app answers 503
# when its database does not.
TRANSIENT_STATUSES = frozenset({502, 503, 504})
# The server's problem types (``urn:lockkeeper:problem:<kind>``) say which 503 it
# is; of them only these two are not "try later": they answer the acquire.
PROBLEM_TYPE_PREFIX = "urn:lockkeeper:problem:"
ROOM_FULL_KIND = "waiting-room-full"  # this worker's waiting room: poll instead
CHANGED_HANDS_KIND = "lock-changed-hands"  # free again while deciding: ask now
# The titles of the same two 503s, for a server that sends no type (0.2 and
# before).
WAITING_ROOM_FULL = "Too many waiting acquires"
LOCK_CHANGED_HANDS = "Lock changed hands"
ACCESS_DENIED_TITLE = "Forbidden"  # the 403 of a token's scope
# The titles of the server's answers to an acquire in an unknown or expired session.
SESSION_ENDED = frozenset({"Session not found", "Session expired"})
SESSION_BOUND = "Lock bound to a session"  # the 409 of renewing a session's lock
_MAX_WAIT_MESSAGE = re.compile(r"at most ([0-9.]+(?:e[+-]?[0-9]+)?)")


def api_root(base_url: str) -> str:
    """The server's root URL; a trailing ``/api/v1`` is accepted too.

    :raise ConfigurationError: not an http(s) URL with a host.
    """
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigurationError(
            "base_url is empty: pass the server's root URL, e.g. "
            "http://locks.internal:8000"
        )
    parsed = httpx.URL(base_url.strip()) if "://" in base_url else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(
            f"base_url {base_url!r} is not an http:// or https:// URL with a host: "
            f"write it in full, e.g. http://{base_url.strip().split('://')[-1]}"
        )
    root = base_url.strip().rstrip("/")
    if root.endswith(API_PREFIX):
        root = root[: -len(API_PREFIX)]
    return root


def bearer(token: str) -> str:
    """The ``Authorization`` header of ``token``.

    :raise ConfigurationError: empty, or not something a header can carry.
    """
    if not isinstance(token, str) or not token.strip():
        raise ConfigurationError(
            "the API token is empty: pass a token made by "
            "`lockkeeper tokens create NAME` (check that LOCKKEEPER_TOKEN is set)"
        )
    if token != token.strip() or not token.isascii() or not token.isprintable():
        raise ConfigurationError(
            "the API token holds spaces, line breaks or non-ASCII characters: "
            "pass it as `lockkeeper tokens create` printed it (a token file's "
            "trailing newline included?)"
        )
    return f"Bearer {token}"


# The titles of the API's own 404s. A 404 titled otherwise (a routing "Not
# Found", or an HTML page from whatever answers there) means the base URL does
# not lead to the API.
API_NOT_FOUND_TITLES = frozenset({"Lock not found", "Session not found", "Not frozen"})


def not_the_api(response: httpx.Response) -> UnexpectedResponse | None:
    """An answer of the refusal kinds the API gives (404, 403, 409) that does not
    come from the API, as the error that says so; None when it is the API's."""
    problem = response.headers.get("Content-Type", "").startswith(
        "application/problem+json"
    )
    if problem and (
        response.status_code != 404 or _title(response) in API_NOT_FOUND_TITLES
    ):
        return None
    return UnexpectedResponse(
        None,
        f"HTTP {response.status_code} from {response.request.url} is not the "
        "Lockkeeper API's answer: is base_url the server's root (the URL "
        "before /api/v1)?",
        response.status_code,
    )


@functools.lru_cache(maxsize=4096)
def lock_path(resource: str) -> str:
    """The lock's path, its name percent-encoded (a worker names the same
    resources again and again: each encoded once)."""
    return "/locks/" + quote(resource, safe="")


def acquire_body(
    owner: str,
    ttl: float | None,
    wait: float | None = None,
    *,
    kind: LockKind = EXCLUSIVE,
    session: str | None = None,
    place: int | None = None,
    rejoin: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {"owner": owner}
    if session is not None:
        body["session"] = session  # its ttl is the session's
    elif ttl is not None:
        body["ttl"] = ttl
    if wait:
        body["wait"] = wait
        if place is not None:
            body["place"] = place
        if rejoin:
            body["rejoin"] = True
    body.update(kind.body())
    return body


def acquire_headers(
    wait: float | None, place: int | dict[str, int] | None
) -> dict[str, str] | None:
    """A retry presenting a kept place (a set's: its places; its room was
    full) closes its connection after its answer, so the next try reaches
    whichever server worker takes a new one, not the full one its connection
    stays with.

    The client asks for it: the server cannot. gunicorn drops a
    ``Connection: close`` the app sets on its answer (a hop-by-hop header is
    the server's, not the app's) but closes after an answer to a request that
    carries one. Behind a proxy it closes only the client's connection to the
    proxy: which worker serves the retry is the proxy's choice, and the kept
    place keeps the wait's order either way. A wait that ran out and rejoins
    presents its place too, and so opens a new connection once per request
    of the server's largest wait (30 s)."""
    return {"Connection": "close"} if wait and place else None


SESSIONS_PATH = "/sessions"


def session_path(session_id: str) -> str:
    return f"{SESSIONS_PATH}/{quote(session_id, safe='')}"


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


def _title(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("title") if isinstance(body, dict) else None


def _place(response: httpx.Response) -> int | None:
    """The place in line the server kept (``place``): a full waiting room's
    503, or the 409 of a wait that ran out and rejoins."""
    try:
        body = response.json()
    except ValueError:
        return None
    place = body.get("place") if isinstance(body, dict) else None
    return place if type(place) is int and place > 0 else None


def _places(response: httpx.Response) -> dict[str, int] | None:
    """A set's places in line the server kept (``places``), as ``_place``."""
    try:
        body = response.json()
    except ValueError:
        return None
    places = body.get("places") if isinstance(body, dict) else None
    if not isinstance(places, dict) or not places:
        return None
    if not all(type(place) is int and place > 0 for place in places.values()):
        return None
    return {str(resource): place for resource, place in places.items()}


def _setting(response: httpx.Response) -> str | None:
    """The server setting a refusal names as the cap it hit (``setting``)."""
    try:
        body = response.json()
    except ValueError:
        return None
    setting = body.get("setting") if isinstance(body, dict) else None
    return setting if isinstance(setting, str) else None


def problem_kind(response: httpx.Response) -> str | None:
    """The last part of the server's problem type (``waiting-room-full``, ...),
    or None when it sends none of its own (``about:blank``, not a problem)."""
    try:
        body = response.json()
    except ValueError:
        return None
    kind = body.get("type") if isinstance(body, dict) else None
    if isinstance(kind, str) and kind.startswith(PROBLEM_TYPE_PREFIX):
        return kind[len(PROBLEM_TYPE_PREFIX) :]
    return None


def _is_503(response: httpx.Response, kind: str, title: str) -> bool:
    """A 503 of ``kind``; by its ``title`` only from a server that types none."""
    if response.status_code != 503:
        return False
    found = problem_kind(response)
    return found == kind if found is not None else _title(response) == title


def is_waiting_room_full(response: httpx.Response) -> bool:
    return _is_503(response, ROOM_FULL_KIND, WAITING_ROOM_FULL)


def is_lock_changed_hands(response: httpx.Response) -> bool:
    """The 503 of an acquire whose holder went while the server decided: not
    an outage, and not a reason to wait (the lock is likely free)."""
    return _is_503(response, CHANGED_HANDS_KIND, LOCK_CHANGED_HANDS)


def _is_access_denied(response: httpx.Response) -> bool:
    """A 403 about the token (its scope), not about who holds the lock: a release
    by another holder is a 403 too, titled after the holder."""
    return response.status_code == 403 and _title(response) == ACCESS_DENIED_TITLE


def _json(response: httpx.Response, resource: str) -> dict[str, Any]:
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


def _lock_from(data: Any, resource: str) -> LockGrant:
    try:
        return LockGrant.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnexpectedResponse(
            resource, f"lock {resource!r}: malformed lock object {data!r}"
        ) from exc


def _lost(response: httpx.Response, resource: str, what: str) -> LockLost:
    detail, _ = problem_detail(response)
    return LockLost(
        resource, f"lock {resource!r} {what}: {detail}", response.status_code
    )


def failure(response: httpx.Response, resource: str, operation: str) -> LockClientError:
    """An answer outside the call's success, as the exception the caller can act
    on."""
    status = response.status_code
    detail, errors = problem_detail(response)
    message = f"{operation} of lock {resource!r} failed ({status}): {detail}"
    if status == 401:
        return AuthenticationFailed(resource, message, status)
    if status == 403:
        return AccessDenied(resource, message, status)
    if status == 429:
        return LockQuotaReached(
            resource, message, parse_retry_after(response.headers.get("Retry-After"))
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


# -- status → outcome, one function per call ------------------------------------------


def acquire_outcome(response: httpx.Response, resource: str) -> AcquireAttempt:
    """200: granted; 409: refused with the holder; 503 of a full waiting room:
    refused, poll instead; 503 "lock changed hands": refused with no holder,
    ask again now. (Every other 503 is retried, then ``ServiceUnavailable``.)"""
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if is_waiting_room_full(response):
        return AcquireAttempt(
            False,
            None,
            retry_after,
            waiting_room_full=True,
            waiting_room_cap=_setting(response),
            place=_place(response),
        )
    if is_lock_changed_hands(response):
        return AcquireAttempt(
            False, None, None, place=_place(response), changed_hands=True
        )
    if response.status_code in TRANSIENT_STATUSES:
        # Another 503 (busy, gone) here only from a call not retried: an outage
        # still, never a full room.
        raise TransientRetries.gave_up("acquire", resource, "", response=response)
    if response.status_code == 200:
        data = _json(response, resource)
        return AcquireAttempt(True, _lock_from(data.get("lock"), resource))
    if response.status_code == 404:
        _from_the_api(response)
    if response.status_code in (404, 409) and _title(response) in SESSION_ENDED:
        # A session-bound acquire whose session is unknown or expired: no wait
        # can help.
        detail, _ = problem_detail(response)
        raise SessionLost(
            resource,
            f"acquire of lock {resource!r}: the session has ended: {detail}",
            response.status_code,
        )
    if response.status_code == 409:
        data = _json(response, resource)
        if str(data.get("type", "")).endswith("limit-mismatch"):
            detail, _ = problem_detail(response)
            limit = data.get("limit")
            raise LimitMismatch(
                resource,
                f"acquire of lock {resource!r} refused: {detail}",
                limit if isinstance(limit, int) else None,
                data.get("mode") if isinstance(data.get("mode"), str) else None,
            )
        holder = data.get("lock")
        return AcquireAttempt(
            False,
            _lock_from(holder, resource) if holder else None,
            retry_after,
            place=_place(response),
        )
    raise failure(response, resource, "acquire")


def _from_the_api(response: httpx.Response) -> None:
    """:raise UnexpectedResponse: a refusal that is not the API's own."""
    wrong = not_the_api(response)
    if wrong is not None:
        raise wrong


def renew_outcome(response: httpx.Response, resource: str, owner: str) -> LockGrant:
    if response.status_code == 200:
        return _lock_from(_json(response, resource), resource)
    if response.status_code in (404, 409):
        _from_the_api(response)
        if _title(response) == SESSION_BOUND:
            detail, _ = problem_detail(response)
            raise SessionBoundLock(
                resource,
                f"lock {resource!r} is bound to a session: renew the session "
                f"(heartbeat), not the lock: {detail}",
                409,
            )
        raise _lost(response, resource, f"is no longer held by {owner!r}")
    raise failure(response, resource, "renew")


def release_outcome(
    response: httpx.Response, resource: str, owner: str, maybe_applied: bool
) -> None:
    if response.status_code in (200, 204):
        return
    if response.status_code in (403, 404) and not _is_access_denied(response):
        _from_the_api(response)
        if maybe_applied:
            # An earlier attempt may have released it before its reply was lost;
            # the lock is not ours either way, which is what was asked.
            log.info("release of %r: earlier attempt likely applied", resource)
            return
        raise _lost(response, resource, f"was no longer held by {owner!r}")
    raise failure(response, resource, "release")


def get_outcome(response: httpx.Response, resource: str) -> LockGrant:
    if response.status_code == 200:
        return _lock_from(_json(response, resource), resource)
    if response.status_code == 404:
        _from_the_api(response)
        detail, _ = problem_detail(response)
        raise LockMissing(resource, f"no lock on {resource!r}: {detail}", 404)
    raise failure(response, resource, "get")


def session_outcome(
    response: httpx.Response, session_id: str | None, operation: str
) -> SessionInfo:
    """201/200: the session; 404 (unknown, another token's) or 409 (expired):
    ``SessionLost``."""
    what = f"session {session_id!r}" if session_id else "session"
    if response.status_code in (200, 201):
        data = _json(response, what)
        try:
            return SessionInfo.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedResponse(
                what, f"{what}: malformed session object {data!r}"
            ) from exc
    if session_id is not None and response.status_code in (404, 409):
        _from_the_api(response)
        detail, _ = problem_detail(response)
        raise SessionLost(what, f"{what} has ended: {detail}", response.status_code)
    raise failure(response, what, operation)


def end_session_outcome(
    response: httpx.Response, session_id: str, maybe_applied: bool
) -> None:
    if response.status_code == 204:
        return
    if response.status_code == 404 and maybe_applied and not_the_api(response) is None:
        return  # an earlier attempt ended it before its reply was lost
    session_outcome(response, session_id, "end")


def fence_outcome(response: httpx.Response, resource: str, fence: int) -> LockGrant:
    if response.status_code == 200:
        return _lock_from(_json(response, resource), resource)
    if response.status_code == 409:
        _from_the_api(response)
        current = _json(response, resource).get("lock")
        raise FenceRejected(
            resource,
            f"fence {fence} is not the valid grant of {resource!r}: "
            f"{problem_detail(response)[0]}",
            _lock_from(current, resource) if current else None,
        )
    raise failure(response, resource, "fence check")


# -- sets: several locks as one -------------------------------------------------------

SETS_PATH = "/sets"


def set_label(resources: list[str]) -> str:
    """How a set is named in messages and errors: its resources, joined."""
    return "+".join(resources)


def set_members(members: list[SetMember | str]) -> list[SetMember]:
    """Members as given: a bare name is an exclusive member."""
    found = [m if isinstance(m, SetMember) else SetMember(m) for m in members]
    names = [m.resource for m in found]
    if not names:
        raise ValueError("a set names at least one resource")
    if len(set(names)) != len(names):
        raise ValueError(f"a set names each resource once, not {names!r}")
    return found


def set_acquire_body(
    owner: str,
    ttl: float | None,
    members: list[SetMember],
    session: str | None = None,
    wait: float | None = None,
    places: dict[str, int] | None = None,
    rejoin: bool = False,
) -> dict[str, Any]:
    """``places`` and ``rejoin`` (with ``wait``): one lock's ``place`` and
    ``rejoin`` for the set (``acquire_body``): {} asks for its places to be
    kept, the places kept before are presented."""
    body: dict[str, Any] = {"owner": owner, "members": [m.body() for m in members]}
    if ttl is not None:
        body["ttl"] = ttl
    if session is not None:
        body["session"] = session
    if wait:
        body["wait"] = wait
        if places is not None:
            body["places"] = places
        if rejoin:
            body["rejoin"] = True
    return body


def set_acquire_outcome(response: httpx.Response, label: str) -> SetAttempt:
    """200: every member granted; 409: refused whole, naming the member (a
    limit mismatch raises, as for one lock); 503 (a set asked to wait): the
    server's waiting room is full, poll instead."""
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if is_waiting_room_full(response):
        return SetAttempt(
            False,
            (),
            retry_after=retry_after,
            waiting_room_full=True,
            waiting_room_cap=_setting(response),
            places=_places(response),
        )
    if response.status_code == 200:
        data = _json(response, label)
        locks = data.get("locks")
        if not isinstance(locks, list):
            raise UnexpectedResponse(label, f"set {label!r}: no locks in {data!r}")
        named = data.get("set")
        return SetAttempt(
            True,
            tuple(_lock_from(lock, label) for lock in locks),
            set_id=named if isinstance(named, str) else None,
        )
    if response.status_code == 409:
        data = _json(response, label)
        if str(data.get("type", "")).endswith("limit-mismatch"):
            detail, _ = problem_detail(response)
            limit = data.get("limit")
            raise LimitMismatch(
                label,
                f"acquire of set {label!r} refused: {detail}",
                limit if isinstance(limit, int) else None,
                None,
            )
        if "refused" not in data:
            _from_the_api(response)
            raise failure(response, label, "acquire")
        holder = data.get("lock")
        refused = data.get("refused")
        return SetAttempt(
            False,
            (),
            refused if isinstance(refused, str) else None,
            _lock_from(holder, label) if holder else None,
            retry_after,
            places=_places(response),
        )
    raise failure(response, label, "acquire")


def set_renew_outcome(
    response: httpx.Response, label: str, owner: str
) -> tuple[LockGrant, ...]:
    if response.status_code == 200:
        data = _json(response, label)
        return tuple(_lock_from(lock, label) for lock in data.get("locks", ()))
    if response.status_code in (404, 409):
        _from_the_api(response)
        raise _lost(response, label, f"is no longer held whole by {owner!r}")
    raise failure(response, label, "renew")


def set_release_outcome(response: httpx.Response, label: str) -> SetRelease:
    if response.status_code == 200:
        data = _json(response, label)
        released = tuple(_lock_from(lock, label) for lock in data.get("released", ()))
        not_held = tuple(str(name) for name in data.get("not_held", ()))
        return SetRelease(released, not_held)
    raise failure(response, label, "release")


def set_not_acquired(
    label: str,
    wait: float,
    last: SetAttempt,
    *,
    turned_away: int = 0,
    cap: str | None = None,
    kept: bool = False,
) -> LockNotAcquired:
    """The end of a set's wait that was never granted whole. ``turned_away``:
    how many of its attempts found the server's waiting room full, whose
    ``cap`` (the setting) the message names, so the user knows which to
    raise. ``kept``: the server kept the set's places meanwhile."""
    holder = f" by {last.lock.owner!r}" if last.lock else ""
    member = f"; {last.refused!r} stayed held{holder}" if last.refused else ""
    message = f"set {label!r} was not free whole for {wait:g} s{member}"
    if turned_away:
        full = f"full ({cap})" if cap else "full"
        meanwhile = (
            "its places in line were kept meanwhile, polled for"
            if kept
            else "which had no place in line meanwhile"
        )
        message += (
            f"; the server's waiting room was {full} for {turned_away} of this "
            f"wait's attempts, {meanwhile}. Raise "
            f"{cap or 'the waiting room'} or run fewer waiting acquires at once"
        )
    return LockNotAcquired(label, message, last.lock)


def set_pause_as(last: SetAttempt) -> AcquireAttempt:
    """A set's refusal as ``contention_delay`` weighs one lock's: a set whose
    places were kept is asked again as soon as a kept place is."""
    kept = min(last.places.values()) if last.places else None
    return AcquireAttempt(False, last.lock, last.retry_after, place=kept)


def set_waits_again_at_once(
    last: SetAttempt, in_line_for: float, waited: float
) -> bool:
    """After a set's turn in the server's lines ran out: join them again at
    once (``rejoin_at_once``, for a set)."""
    return rejoin_at_once(
        AcquireAttempt(False, None, waiting_room_full=last.waiting_room_full),
        in_line_for,
        waited,
    )


# -- transient failures ---------------------------------------------------------------


@dataclass
class TransientRetries:
    """The retry budget of one API call against transient failures.

    ``retries`` attempts after the first, or, with ``retry_until`` (a
    ``time.monotonic()`` deadline), as many as fit before it. Full-jitter backoff:
    the n-th delay is uniform in ``[0, min(max_backoff, backoff * 2**(n-1))]``,
    never shorter than a 503's ``Retry-After``.
    """

    retries: int
    backoff: float
    max_backoff: float
    rng: random.Random
    retry_until: float | None = None
    attempts: int = 0
    # Whether an earlier attempt may have reached the server and been applied
    # (its reply lost): only a refused connection or a 503 (the app's "database
    # not answering") proves it was not.
    maybe_applied: bool = False
    started: float = field(default_factory=time.monotonic)

    def timeout(self, timeout: float) -> float:
        """The next request's timeout: never past ``retry_until``."""
        if self.retry_until is None:
            return timeout
        return min(timeout, max(self.retry_until - time.monotonic(), 0.1))

    def should_retry(self, response: httpx.Response, waiting: bool) -> bool:
        """A 502/503/504 is retried (the database busy or gone, a gateway, a
        schema being upgraded); a waiting acquire's "room full" 503 and an
        acquire's "lock changed hands" are answers (the caller polls, or asks
        again at once)."""
        if waiting and is_waiting_room_full(response):
            return False
        if is_lock_changed_hands(response):
            return False
        return response.status_code in TRANSIENT_STATUSES

    def next_delay(
        self,
        *,
        error: httpx.TransportError | None = None,
        response: httpx.Response | None = None,
    ) -> float | None:
        """After a failed attempt: seconds to pause before the next, or None when
        the budget is spent."""
        self.attempts += 1
        if not isinstance(error, httpx.ConnectError | httpx.ConnectTimeout) and not (
            response is not None and response.status_code == 503
        ):
            self.maybe_applied = True
        window = min(self.max_backoff, self.backoff * 2 ** (self.attempts - 1))
        delay = self.rng.uniform(0, window)
        if response is not None:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            if retry_after is not None:
                delay = max(delay, retry_after)
        if self.retry_until is None:
            return delay if self.attempts <= self.retries else None
        return delay if time.monotonic() + delay < self.retry_until else None

    @staticmethod
    def gave_up(
        method: str,
        resource: str,
        base_url: str,
        *,
        error: httpx.TransportError | None = None,
        response: httpx.Response | None = None,
    ) -> ServiceUnavailable:
        if response is not None:
            detail, _ = problem_detail(response)
            return ServiceUnavailable(
                resource,
                f"{method} of lock {resource!r}: the server kept answering "
                f"{response.status_code}: {detail}",
                response.status_code,
            )
        return ServiceUnavailable(
            resource,
            f"{method} of lock {resource!r}: cannot reach {base_url}: "
            f"{type(error).__name__}: {error}",
        )


# -- waiting for a held lock ----------------------------------------------------------


def server_max_wait(exc: InvalidRequest) -> float | None:
    """The server's largest ``wait`` from its 400, or None when it names none
    (an older server that does not know ``wait``)."""
    for name, message in exc.errors:
        if name == "wait":
            found = _MAX_WAIT_MESSAGE.search(message)
            return float(found.group(1)) if found else None
    return None


def smaller_server_wait(exc: InvalidRequest, asked: float) -> float:
    """After a waiting request's 400: the server's largest wait, when it
    names one below ``asked``; else 0 (a server that does not wait, or a
    400 about something else, which the plain request then answers)."""
    server_max = server_max_wait(exc)
    if server_max is None or server_max >= asked:
        return 0.0
    return server_max


def knows_no_places(exc: InvalidRequest, field: str = "place") -> bool:
    """An older server's 400 for the ``place`` field (a set's: ``places``)
    it does not know."""
    return any(name == field for name, _ in exc.errors)


def knows_no_rejoin(exc: InvalidRequest) -> bool:
    """An older server's 400 for the ``rejoin`` field it does not know."""
    return any(name == "rejoin" for name, _ in exc.errors)


def rejoins(deadline: float, sent_at: float, in_line_for: float) -> bool:
    """Whether a wait goes on after a request that waits ``in_line_for`` (the
    server's largest wait cut it short): that request asks the server to keep
    its place when it runs out, for the next to present."""
    return bool(in_line_for) and deadline - sent_at > in_line_for


# While the server keeps a turned-away wait's place (2 s), the wait asks
# again within this: soon, for once first in line the line waits for it.
KEPT_PLACE_POLL = 0.05


def rejoin_at_once(result: AcquireAttempt, in_line_for: float, waited: float) -> bool:
    """After a turn in the server's line that ran out: join the line again at
    once. A turn ends early only when the line is not to be had (the room is
    full) or something unexpected: never retry that at once."""
    return (
        bool(in_line_for)
        and not result.waiting_room_full
        and (waited >= in_line_for / 2)
    )


def contention_delay(
    result: AcquireAttempt,
    attempt_number: int,
    *,
    backoff: float,
    max_backoff: float,
    max_lock_poll: float,
    rng: random.Random,
    remaining: float,
) -> float:
    """The pause before asking again for a held lock: full jitter over a window
    that doubles up to ``max_lock_poll``, capped by the refusal's ``Retry-After``
    and by what is left of the wait. A refusal that kept the wait's place in
    line is asked again within ``KEPT_PLACE_POLL``, well before the place
    lapses."""
    if result.changed_hands:
        return 0.0  # the holder went while the server decided: free, ask now
    window = min(max_backoff, max_lock_poll, backoff * 2 ** (attempt_number - 1))
    if result.place is not None:
        window = min(window, KEPT_PLACE_POLL)
    delay = rng.uniform(0, window)
    if result.retry_after:
        delay = min(delay, result.retry_after)
    return max(min(delay, remaining), 0.0)


def not_acquired(
    resource: str,
    wait: float,
    last: AcquireAttempt,
    *,
    turned_away: int = 0,
    cap: str | None = None,
    kept: bool = False,
) -> LockNotAcquired:
    """The end of a wait that was never granted. ``turned_away``: how many of
    its attempts found the server's waiting room full, whose ``cap`` (the
    setting) the message names, so the user knows which cap to raise.
    ``kept``: the server kept the wait's place in line meanwhile; else a wait
    turned away had no place in line, and waiters in line went first."""
    holder = f" by {last.lock.owner!r}" if last.lock else ""
    message = f"lock {resource!r} stayed held{holder} for {wait:g} s"
    if turned_away:
        full = f"full ({cap})" if cap else "full"
        message += (
            f"; the server's waiting room was {full} for {turned_away} of this "
            "wait's attempts"
        )
        message += (
            " (its place in line was kept meanwhile, polled for). "
            if kept
            else ", and while turned away it had no place in line: waiters in "
            "line went first. "
        )
        message += (
            f"Raise {cap or 'the waiting room'} or run fewer waiting acquires at once"
        )
    return LockNotAcquired(resource, message, last.lock)


# Below this a hold is not worth a renew: release at once.
SHORTEST_HOLD = 0.01


def hold_left(held: LockGrant, now: LockGrant, seconds: float) -> float:
    """Seconds until ``held``'s grant is ``seconds`` old, by the database clock:
    ``now`` is the same lock as the server reports it at this moment (its
    ``expires_at`` minus its ``ttl_remaining`` is the server's time). Negative
    when that moment has passed; 0 when the lock is no longer this grant."""
    if (now.owner, now.fence) != (held.owner, held.fence):
        return 0.0
    server_now = now.expires_at.timestamp() - now.ttl_remaining
    return held.acquired_at.timestamp() + seconds - server_now


# After a waiting acquire was cancelled and its release found nothing granted:
# look once more when the server surely noticed the closed connection (it looks
# every 0.25 s) and so can no longer grant it.
LATE_GRANT_WITHIN = 0.5


def renewal_retry_interval(renew_every: float, max_backoff: float) -> float:
    """After a renew that failed transiently: try again sooner than usual."""
    return min(renew_every, max_backoff) / 2


# -- following the audit log ----------------------------------------------------------

EVENTS_PATH = "/events"
# How long a followed stream may stay silent before it counts as dropped: the
# server sends a comment line at least every 15 s.
DEFAULT_WATCH_IDLE = 45.0


def watch_retries(
    backoff: float, max_backoff: float, rng: random.Random, give_up_after: float | None
) -> TransientRetries:
    """The reconnects of a followed stream, apart from the ordinary calls' few
    retries: a restart or failover takes seconds, and a follower waits it out.
    As many as it takes (``give_up_after`` None), else for that many seconds;
    each pause doubles up to ``max_backoff``, never shorter than a Retry-After."""
    if give_up_after is None:
        return TransientRetries(_UNBOUNDED, backoff, max_backoff, rng)
    return TransientRetries(
        _UNBOUNDED,
        backoff,
        max_backoff,
        rng,
        retry_until=time.monotonic() + give_up_after,
    )


_UNBOUNDED = 2**62


def watch_params(filters: dict[str, str | None]) -> dict[str, str]:
    """The query of ``GET /events?follow=true`` for ``filters`` (None: absent)."""
    params = {"follow": "true"}
    params.update({name: value for name, value in filters.items() if value is not None})
    return params


def watch_headers(last_id: int | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream"}
    if last_id is not None:
        headers["Last-Event-ID"] = str(last_id)
    return headers


def watch_message(message_id: str, data: str) -> tuple[int | None, LockEvent | None]:
    """A stream message as (the id to resume after, the event it carries).

    The opening message carries an id and no event; after a comment line the
    SSE parser repeats the last id with no data, which carries nothing new.
    """
    if not data:
        return (int(message_id) if message_id.isdigit() else None), None
    try:
        event = LockEvent.from_json(json.loads(data))
    except (KeyError, TypeError, ValueError) as exc:
        raise UnexpectedResponse(
            EVENTS_PATH, f"watch: not an event in the stream: {data[:200]!r}"
        ) from exc
    return event.id, event


def watch_failure(response: httpx.Response) -> LockClientError:
    """A stream refused for good (401, 403, 400, ...)."""
    return failure(response, EVENTS_PATH, "watch")
