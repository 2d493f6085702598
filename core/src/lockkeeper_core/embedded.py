"""The embedded mode: the lock core in a worker's own process, answering the
worker client's requests without a server or a network hop.

A worker switches by one constructor argument, its code unchanged::

    from lockkeeper_client import LockClient
    from lockkeeper_core.embedded import EmbeddedTransport

    client = LockClient("http://embedded", TOKEN, transport=EmbeddedTransport(DB_URL))

(``AsyncEmbeddedTransport`` for ``AsyncLockClient``.) Everything the client
does over HTTP (``lock()``, acquire/renew/release, waiting in line, ``limit=``
and ``shared=``, sessions, heartbeats, ``leadership()``, retries) runs as it
does there: the transport answers each request the way the server's API does
(``lockkeeper_core.wire``), so the client's decisions are the same code either way.

One world with the server: the same tables, fences, audit events and waiting
line (a waiter here and one on a server share one line per resource, which
lives in the database). The caller acts as the API token it presents: the
token is looked up by its hash as the server looks it up (a few seconds'
cache, as ``LOCKKEEPER_TOKEN_CACHE_SECONDS``); read-only tokens and scopes are
refused here as the API's guard refuses them, and quotas, freezes and a token
revoked or expired by the grant are decided in the grant's transaction,
exactly as over HTTP.

The audit log is served in process too, read from the events table as the
server reads it: its pages (``GET /events``, ``GET /locks/<resource>/events``,
``lockkeeper_core.event_pages``) and ``watch()`` (``GET /events?follow=true``,
``EventStream``). Not served: the lists of locks and the operator's actions;
they need the server (a 501 problem names it).

The asyncio transport never blocks the event loop: each request runs the core
in a thread of its own pool; a waiting acquire whose caller is cancelled stops
waiting at its next look (``still_wanted``), and the client releases what a
cancelled acquire may have been granted, as over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import httpx
from sqlalchemy import (
    Connection,
    Engine,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session as OrmSession

from lockkeeper_core import wire
from lockkeeper_core.core import LockSettings, clock_for
from lockkeeper_core.engine import engine_for
from lockkeeper_core.errors import (
    AccessRefused,
    InvalidInput,
    LockError,
    NotOwner,
    TokenEnded,
)
from lockkeeper_core.event_pages import list_events, page_query, stream_start
from lockkeeper_core.event_streams import AsyncEventStream, EventStream
from lockkeeper_core.follow import (
    EventFilter,
    start_position,
)
from lockkeeper_core.identity import TOKEN_CACHE_SECONDS, Tokens
from lockkeeper_core.in_transaction import InTransaction, in_transaction_commands
from lockkeeper_core.schema import require_schema
from lockkeeper_core.service import LockService

API_PREFIX = "/api/v1"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A followed stream's look at the events between wake-ups, as the server's
# ``LOCKKEEPER_STREAM_POLL_INTERVAL`` (PostgreSQL's NOTIFY wakes it sooner).
STREAM_POLL_INTERVAL = 0.1
EVENT_STREAM = "text/event-stream"
PROBLEM = "application/problem+json"


class Answer:
    """The API's answer to one call, as the client reads a response: its
    ``status_code``, ``headers`` and ``json()`` (the body object itself, not
    encoded and parsed again). ``to_httpx()`` is the same answer as the HTTP
    response an httpx transport returns. ``stream``: a followed event stream's
    messages (``EventStream``), for the httpx transports only."""

    __slots__ = ("body", "headers", "path", "status_code", "stream")

    def __init__(
        self,
        status: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
        stream: EventStream | None = None,
    ):
        self.status_code = status
        self.body = body
        self.headers = headers if headers is not None else {}
        self.stream = stream
        self.path = ""

    def json(self) -> Any:
        if self.body is None:
            raise ValueError("this answer has no body")
        return self.body

    @property
    def text(self) -> str:
        return "" if self.body is None else json.dumps(self.body)

    @property
    def reason_phrase(self) -> str:
        try:
            return HTTPStatus(self.status_code).phrase
        except ValueError:
            return ""

    @property
    def request(self) -> Any:
        """What the client names in an unexpected answer's message."""
        return SimpleNamespace(url=f"embedded:{API_PREFIX}{self.path}")

    def to_httpx(self) -> httpx.Response:
        if self.stream is not None:
            return httpx.Response(
                self.status_code, headers=self.headers, stream=self.stream
            )
        if self.body is None:
            return httpx.Response(self.status_code, headers=self.headers)
        return httpx.Response(
            self.status_code,
            headers=self.headers,
            content=json.dumps(self.body).encode(),
        )


# A worker names the same resources again and again: each path part decoded
# once (the client encodes ``:`` and every other character but letters, digits
# and ``_.-~``).
_unquoted = lru_cache(maxsize=4096)(unquote)


def _problem(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None, **extra
) -> Answer:
    body = {
        "type": extra.pop("type", "about:blank"),
        "title": title,
        "status": status,
        "detail": detail or title,
        **extra,
    }
    return Answer(
        status,
        body,
        {"Content-Type": PROBLEM, **(headers or {})},
    )


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Answer:
    return Answer(status, body, {"Content-Type": "application/json", **(headers or {})})


def _seconds(fields: dict[str, Any], name: str) -> float | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput([(name, "must be a number of seconds")])
    return float(value)


def _place(fields: dict[str, Any]) -> int | None:
    """A waiting acquire's kept place in line (``lockkeeper_core.queue``)."""
    value = fields.get("place")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput([("place", "must be an integer of 0 or more")])
    return value


def _rejoin(fields: dict[str, Any]) -> bool:
    """Whether a waiting acquire's wait goes on after it (``lockkeeper_core.queue``)."""
    value = fields.get("rejoin", False)
    if not isinstance(value, bool):
        raise InvalidInput([("rejoin", "must be true or false")])
    return value


class Embedded:
    """The lock service on the worker's engine, answering API requests.

    :param database: a SQLAlchemy URL (``postgresql://``, ``mariadb://`` and
        ``mysql://`` get the drivers the server ships) or the worker's
        ``Engine``.
    :param settings: the service's limits (ttl bounds, waiting room, ...).
    :param check_schema: refuse to start on a lock schema that is not the
        one this code needs (``SchemaNotReady`` names the command to run).
    :param stream_poll: seconds between a followed stream's looks at the
        events on MariaDB and SQLite (PostgreSQL's NOTIFY wakes it at once).
    """

    def __init__(
        self,
        database: str | Engine,
        *,
        settings: LockSettings | None = None,
        token_cache_seconds: float = TOKEN_CACHE_SECONDS,
        check_schema: bool = True,
        stream_poll: float = STREAM_POLL_INTERVAL,
    ):
        self.stream_poll = stream_poll
        self.engine = engine_for(database)
        # A URL's engine, or the core's own beside a worker's (MariaDB's at
        # READ COMMITTED): disposed of on close; the worker's own is not.
        self._own_engine = self.engine is not database
        if check_schema:
            require_schema(self.engine)
        self.service = LockService(
            self.engine, clock_for(self.engine, None), settings or LockSettings()
        )
        self.tokens = Tokens(self.engine, token_cache_seconds)
        # The followed streams open now: closing ends them.
        self.streams: set[EventStream] = set()

    def close(self) -> None:
        for stream in list(self.streams):
            stream.close()
        self.service.close()
        if self._own_engine:
            self.engine.dispose()

    def in_transaction(
        self, conn: Connection | OrmSession, token: str
    ) -> InTransaction:
        """The worker's commands inside ``conn``'s transaction (a SQLAlchemy
        ``Connection`` in a transaction, or an ORM ``Session``: its
        connection), acting as the API token ``token``.

        :raise TokenEnded: ``token`` is not a live API token.
        """
        if isinstance(conn, OrmSession):
            conn = conn.connection()
        identity = self.tokens.verify(token)
        if identity is None:
            raise TokenEnded("(the token given)")
        return InTransaction(self.service, conn, identity)

    # -- one request -------------------------------------------------------------

    def answer(
        self, request: httpx.Request, still_wanted: Callable[[], bool] | None = None
    ) -> httpx.Response:
        """The API's answer to ``request`` (its body read), as an HTTP
        response (``EmbeddedTransport``'s path)."""
        path = request.url.path
        if not path.startswith(API_PREFIX + "/"):
            return _problem(404, "Not Found", "not a path of the lock API").to_httpx()
        try:
            fields = json.loads(request.content) if request.content else None
        except ValueError:
            fields = ""  # not an object: refused as the API refuses it
        return self.call(
            request.method,
            path[len(API_PREFIX) :],
            fields,
            dict(request.url.params),
            request.headers,
            still_wanted,
        ).to_httpx()

    def call(
        self,
        method: str,
        path: str,
        fields: Any,
        query: dict[str, str] | None,
        headers: Any,
        still_wanted: Callable[[], bool] | None = None,
    ) -> Answer:
        """The API's answer to one call: ``path`` under ``/api/v1`` (its parts
        percent-encoded), ``fields`` the JSON body's value (None: no body),
        ``headers`` a mapping with ``Authorization``. The client's own calls
        come here without an HTTP request around them (``lockkeeper_request``
        of the transports). A database that cannot be reached is the
        server's 503, which the client retries."""
        try:
            answer = self._answer(
                method, path, fields, query or {}, headers, still_wanted
            )
        except DBAPIError as exc:
            answer = _problem(
                503,
                "Database unavailable",
                f"the lock database did not answer: {type(exc.orig).__name__}",
                {"Retry-After": "1"},
                type=wire.DATABASE_UNAVAILABLE,
            )
        answer.path = path
        if answer.headers.get("Content-Type") == PROBLEM:
            # As the server's problems name the path asked (``app.errors``).
            answer.body["instance"] = unquote(API_PREFIX + path)
        return answer

    def _answer(
        self,
        method: str,
        path: str,
        fields: Any,
        query: dict[str, str],
        headers: Any,
        still_wanted: Callable[[], bool] | None,
    ) -> Answer:
        parts = [_unquoted(part) for part in path[1:].split("/")]
        scheme, _, credential = (headers.get("Authorization") or "").partition(" ")
        identity = (
            self.tokens.verify(credential.strip())
            if scheme.lower() == "bearer"
            else None
        )
        if identity is None:
            return _problem(
                401,
                "Unauthorized",
                "send 'Authorization: Bearer <token>' with a live API token",
                {"WWW-Authenticate": wire.AUTHENTICATE},
            )
        if identity.read_only and method not in READ_METHODS:
            return _problem(403, "Forbidden", "this API token is read-only")
        if fields is None:
            fields = {}
        if not isinstance(fields, dict):
            return self._refused(InvalidInput([("body", "must be a JSON object")]))
        try:
            if parts[0] == "locks" and len(parts) in (2, 3):
                resource = parts[1]
                if not identity.covers(resource):
                    return _problem(
                        403,
                        "Forbidden",
                        "the resource is outside this API token's scope",
                    )
                if len(parts) == 3:
                    if parts[2] == "holders" and method == "GET":
                        return _json(200, self._holders(resource))
                    if parts[2] == "events" and method == "GET":
                        _, limit, cursor = page_query(query, filters=())
                        return self._page(
                            {"resource": resource}, identity, limit, cursor
                        )
                elif method == "POST":
                    return self._acquire(
                        resource, fields, identity, credential.strip(), still_wanted
                    )
                elif method == "GET":
                    return self._get(resource, query)
                elif method == "PATCH":
                    lock = self.service.renew(
                        resource,
                        fields.get("owner"),
                        _seconds(fields, "ttl"),
                        actor=identity.name,
                        token=identity.name,
                    )
                    return _json(200, wire.lock_to_json(lock))
                elif method == "DELETE":
                    return self._release(resource, fields, query, identity)
            elif parts[0] == "sessions" and len(parts) in (1, 2):
                return self._session(parts[1:], method, fields, identity)
            elif parts == ["sets"]:
                return self._set(
                    method, fields, identity, credential.strip(), still_wanted
                )
            elif parts == ["events"] and method == "GET":
                return self._events(query, headers, identity)
        except LockError as exc:
            return self._refused(exc, releasing=method == "DELETE")
        return _problem(
            501,
            "Not served in process",
            f"{method} {API_PREFIX}{path} needs the Lockkeeper server (the "
            "embedded mode serves locks, sets, sessions and the audit log only)",
        )

    def _refused(self, exc: LockError, *, releasing: bool = False) -> Answer:
        status, title, extra = wire.refusal(exc)
        if releasing and isinstance(exc, NotOwner):
            status = 403
        return _problem(
            status, title, str(exc), wire.refusal_headers(exc, status), **extra
        )

    def _acquire(self, resource, fields, identity, credential, still_wanted):
        result = self.service.acquire(
            resource,
            fields.get("owner"),
            _seconds(fields, "ttl"),
            actor=identity.name,
            wait=_seconds(fields, "wait"),
            still_wanted=still_wanted,
            token=identity.name,
            max_locks=identity.max_locks,
            token_live=lambda: self.tokens.verify(credential) is not None,
            session=fields.get("session"),
            limit=fields.get("limit", 1),
            mode=fields.get("mode", "exclusive"),
            place=_place(fields),
            rejoin=_rejoin(fields),
        )
        if result.acquired:
            return _json(
                200, {"acquired": True, "lock": wire.lock_to_json(result.lock)}
            )
        # A wait that ran out and rejoins: its place, kept for its next request.
        kept = {} if result.place is None else {"place": result.place}
        if result.lock is None and result.waiters:
            return _json(
                409,
                {"acquired": False, "lock": None, "waiters": result.waiters, **kept},
                {"Retry-After": "1"},
            )
        if result.lock is None:
            return _problem(
                503,
                "Lock changed hands",
                "the lock changed while deciding; retry now",
                {"Retry-After": "1"},
                type=wire.LOCK_CHANGED_HANDS,
                **kept,
            )
        retry_after = max(1, int(-(-result.lock.ttl_remaining // 1)))
        return _json(
            409,
            {
                "acquired": False,
                "lock": wire.lock_to_json(result.lock),
                "waiters": result.waiters,
                **kept,
            },
            {"Retry-After": str(retry_after)},
        )

    def _get(self, resource: str, query: dict[str, str]) -> Answer:
        fence = query.get("fence")
        if fence is not None:
            if not (fence.isascii() and fence.isdigit()) or int(fence) < 1:
                raise InvalidInput([("fence", "must be a positive integer")])
            lock = self.service.check_fence(resource, int(fence))
        else:
            lock = self.service.get(resource)
        return _json(200, wire.lock_to_json(lock))

    def _holders(self, resource: str) -> dict[str, Any]:
        found = self.service.holders(resource)
        return {
            "resource": found.resource,
            "limit": found.limit,
            "mode": found.mode,
            "holders": [wire.lock_to_json(lock) for lock in found.holders],
            "waiters": found.waiters,
        }

    def _release(self, resource, fields, query, identity) -> Answer:
        in_body, in_query = fields.get("owner"), query.get("owner")
        if in_body is not None and in_query is not None and in_body != in_query:
            raise InvalidInput([("owner", "differs between the body and the query")])
        owner = in_body if in_body is not None else in_query
        if owner is None:
            raise InvalidInput([("owner", "is required (in the body or as ?owner=)")])
        run = fields.get("run")
        self.service.release(
            resource,
            owner,
            actor=identity.name,
            token=identity.name,
            details=None if run is None else {"run": run},
        )
        return Answer(204)

    def _events(self, query, headers, identity) -> Answer:
        """``GET /events``: a page of the audit log, newest first, or with
        ``follow=true`` the log as it is written (Server-Sent Events, the
        server's messages), both read from the events table in this process,
        the query read and the events narrowed to the token's scope as the
        server reads and narrows them."""
        resource = query.get("resource")
        if resource is not None and not identity.covers(resource):
            return _problem(
                403, "Forbidden", "the resource is outside this API token's scope"
            )
        follow = query.get("follow", "false")
        found, limit, cursor = page_query(
            {name: value for name, value in query.items() if name != "follow"}
        )
        if follow not in ("true", "false"):
            raise InvalidInput([("follow", "must be one of true, false")])
        if follow == "false":
            return self._page(found, identity, limit, cursor)
        filters = EventFilter(**found, scope=identity.prefixes)
        filters.validate()
        return Answer(
            200,
            headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-store"},
            stream=EventStream(
                self.engine,
                self.service.queue,
                self.stream_poll,
                self.streams,
                filters,
                start_position(
                    self.engine, stream_start(headers.get("Last-Event-ID"), cursor)
                ),
            ),
        )

    def _page(self, found, identity, limit, cursor) -> Answer:
        """One page of events (``lockkeeper_core.event_pages``), as the
        server's ``{"events": [...], "next_cursor": ...}``."""
        page = list_events(
            self.engine,
            EventFilter(**found, scope=identity.prefixes),
            limit=limit,
            cursor=cursor,
        )
        return _json(
            200,
            {
                "events": [wire.event_to_json(event) for event in page.items],
                "next_cursor": page.next_cursor,
            },
        )

    def _set(self, method, fields, identity, credential, still_wanted) -> Answer:
        """A set's acquire, renewal or release (``app.api.sets``'s answers)."""
        if method == "POST":
            members = wire.set_members(fields)
            names = [m.resource for m in members]
        else:
            names = wire.set_resources(fields)
        if not all(isinstance(n, str) and identity.covers(n) for n in names):
            return _problem(
                403, "Forbidden", "the resource is outside this API token's scope"
            )
        owner = fields.get("owner")
        if method == "POST":
            result = self.service.acquire_set(
                members,
                owner,
                _seconds(fields, "ttl"),
                actor=identity.name,
                token=identity.name,
                max_locks=identity.max_locks,
                session=fields.get("session"),
                wait=_seconds(fields, "wait"),
                still_wanted=still_wanted,
                token_live=lambda: self.tokens.verify(credential) is not None,
                places=fields.get("places"),  # checked by the service
                rejoin=_rejoin(fields),
            )
            status, body, headers = wire.set_answer(result)
            return _json(status, body, headers)
        if method == "PATCH":
            locks = self.service.renew_set(
                names,
                owner,
                _seconds(fields, "ttl"),
                actor=identity.name,
                token=identity.name,
            )
            return _json(200, {"locks": [wire.lock_to_json(x) for x in locks]})
        if method == "DELETE":
            released = self.service.release_set(
                names, owner, actor=identity.name, token=identity.name
            )
            return _json(200, wire.set_release_to_json(released))
        raise InvalidInput([("method", "sets are taken, renewed and released")])

    def _session(self, rest, method, fields, identity) -> Answer:
        sessions = self.service.sessions
        if not rest:
            if method != "POST":
                raise InvalidInput([("method", "sessions are created with POST")])
            session = sessions.create(
                fields.get("owner"), _seconds(fields, "ttl"), token=identity.name
            )
            return _json(
                201,
                wire.session_to_json(session),
                {"Location": f"{API_PREFIX}/sessions/{session.id}"},
            )
        session_id = rest[0]
        if method == "GET":
            session = sessions.get(session_id, token=identity.name)
        elif method == "PATCH":
            session = sessions.heartbeat(session_id, token=identity.name)
        elif method == "DELETE":
            sessions.end(session_id, token=identity.name, actor=identity.name)
            return Answer(204)
        else:
            raise InvalidInput([("method", f"{method} is not a session method")])
        return _json(200, wire.session_to_json(session))


class EmbeddedTransport(httpx.BaseTransport):
    """``LockClient``'s transport to the lock core in this process (see the
    module's docstring). ``database``: a URL or the worker's ``Engine``;
    ``options``: ``Embedded``'s."""

    def __init__(self, database: str | Engine | Embedded, **options: Any):
        # An ``Embedded`` given is shared (several clients on one core): its
        # giver closes it; one made here closes with the transport.
        self._owns = not isinstance(database, Embedded)
        self.embedded = (
            database
            if isinstance(database, Embedded)
            else Embedded(database, **options)
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self.embedded.answer(request)

    def lockkeeper_request(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: dict[str, str] | None,
        headers: dict[str, str],
    ) -> Answer:
        """The client's call without an HTTP request around it: the client
        takes this path when its transport offers it (``DirectCalls``), and
        reads the ``Answer`` as it reads a response. Building and parsing an
        httpx request, its URL and its JSON both ways cost about as much CPU
        as the lock core's own work."""
        return self.embedded.call(method, path, json, params, headers)

    def close(self) -> None:
        if self._owns:
            self.embedded.close()


class AsyncEmbeddedTransport(httpx.AsyncBaseTransport):
    """``AsyncLockClient``'s transport to the lock core in this process: each
    request runs in a thread of its own pools, never on the event loop.

    ``threads``: the calls that may wait (a waiting acquire, a followed event
    stream) at once. ``call_threads``: the threads of the calls that answer at
    once (every other call), fewer: the loop's thread must win the GIL to
    resume each task, and every thread more that runs Python meanwhile makes
    it wait longer (16 tasks on 32 threads ran at 0.4 to 0.5x 16 plain
    threads; on 8 threads at 0.75 to 0.85x)."""

    def __init__(
        self,
        database: str | Engine | Embedded,
        *,
        threads: int = 32,
        call_threads: int = 8,
        **options: Any,
    ):
        # An ``Embedded`` given is shared (several clients on one core): its
        # giver closes it; one made here closes with the transport.
        self._owns = not isinstance(database, Embedded)
        self.embedded = (
            database
            if isinstance(database, Embedded)
            else Embedded(database, **options)
        )
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="lockkeeper")
        self._calls = ThreadPoolExecutor(
            max(1, min(call_threads, threads)), thread_name_prefix="lockkeeper-call"
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        response = await self._in_pool(self.embedded.answer, request)
        if isinstance(response.stream, EventStream):
            response = httpx.Response(
                response.status_code,
                headers=response.headers,
                stream=AsyncEventStream(response.stream, self._pool),
            )
        return response

    async def lockkeeper_request(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: dict[str, str] | None,
        headers: dict[str, str],
    ) -> Answer:
        """``EmbeddedTransport.lockkeeper_request``, in a pool's thread: a
        waiting acquire's in the waiting pool, any other call's in the pool of
        the calls that answer at once."""
        waits = isinstance(json, dict) and bool(json.get("wait"))
        return await self._in_pool(
            partial(self.embedded.call, method, path, json, params, headers),
            pool=self._pool if waits else self._calls,
        )

    async def _in_pool(
        self,
        work: Callable[..., Any],
        *args: Any,
        pool: ThreadPoolExecutor | None = None,
    ) -> Any:
        """``work(*args, still_wanted)`` in a thread of ``pool`` (the waiting
        pool by default)."""
        wanted = threading.Event()
        wanted.set()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                pool or self._pool, work, *args, wanted.is_set
            )
        except asyncio.CancelledError:
            # A waiting acquire stops at its next look; one being granted now
            # is released by the client (its cancel path, as over HTTP).
            wanted.clear()
            raise

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._close)

    def _close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)
        if self._owns:
            self.embedded.close()


__all__ = [
    "AccessRefused",
    "Answer",
    "AsyncEmbeddedTransport",
    "Embedded",
    "EmbeddedTransport",
    "EventStream",
    "InTransaction",
    "in_transaction_commands",
    "engine_for",
]
