"""The audit log over the API: one resource's events, or all of them, newest first;
or, with ``follow=true``, every new one as it is written (Server-Sent Events)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from flask import Response, current_app, g, jsonify, request, stream_with_context
from lockkeeper_core import wire
from lockkeeper_core.event_pages import stream_start
from lockkeeper_core.queue import client_still_there

from app.api.blueprint import bp
from app.api.schemas import event_to_json
from app.api.shapes import query
from app.audit.follow import FollowWakeup, follow_step, start_position
from app.audit.service import EventFilter, list_events
from app.errors import problem
from app.extensions import db, lock_service

STREAMS = "lockkeeper.api.streams"
STOPPING = "lockkeeper.api.streams-stopping"
EVENT_STREAM = "text/event-stream"
# What a stream ended by a shutdown tells its client: reconnect after this long
# (the SSE ``retry:`` field, in milliseconds), to another instance or this one
# started again.
RECONNECT_AFTER_MS = 1000


def _stopping(app) -> threading.Event:
    return app.extensions.setdefault(STOPPING, threading.Event())


def stop_streams(app) -> None:
    """The server is shutting down gracefully: every open stream of ``app`` ends
    within ``CLIENT_CHECK_INTERVAL`` with a reconnect hint, and new ones are
    refused (503), so the shutdown does not wait its ``graceful_timeout`` for
    them (``app.ops.gunicorn_conf`` calls this on SIGTERM, SIGINT and SIGQUIT).
    """
    _stopping(app).set()


def _page(filters: EventFilter):
    page = list_events(filters, limit=query()["limit"], cursor=query()["cursor"])
    return jsonify(
        events=[event_to_json(event) for event in page.items],
        next_cursor=page.next_cursor,
    )


@bp.get("/locks/<resource>/events")
def resource_events(resource: str):
    return _page(EventFilter(resource=resource, scope=g.token.prefixes))


@bp.get("/events")
def all_events():
    filters = dict(query())
    follow = filters.pop("follow") == "true"
    cursor = filters.pop("cursor")
    del filters["limit"]
    filters = EventFilter(**filters, scope=g.token.prefixes)
    if follow:
        return _follow(filters, cursor)
    return _page(filters)


# -- following -------------------------------------------------------------------


class Streams:
    """This worker's open streams: at most ``LOCKKEEPER_MAX_STREAMS``, each holding
    a server thread for its whole life (see docs/deploy.md, "Event streams"), and
    at most ``LOCKKEEPER_MAX_STREAMS_PER_TOKEN`` of them per API token (0: no
    share)."""

    def __init__(self, limit: int, metrics, per_token: int = 0):
        self.limit = limit
        self.per_token = per_token
        self._slots = threading.BoundedSemaphore(limit) if limit else None
        self._metrics = metrics
        self._by_token: dict[str, int] = {}
        self._by_token_lock = threading.Lock()

    def open(self, token: str | None = None) -> Callable[[], None] | str | None:
        """A place for one more stream of ``token`` (its release, to call once),
        or the setting that refused it: ``LOCKKEEPER_MAX_STREAMS_PER_TOKEN``
        (the token holds its share), else None (the worker is full)."""
        with self._by_token_lock:
            held = self._by_token.get(token or "", 0)
            if self.per_token and held >= self.per_token:
                return "LOCKKEEPER_MAX_STREAMS_PER_TOKEN"
            self._by_token[token or ""] = held + 1
        if self._slots is None or not self._slots.acquire(blocking=False):
            self._give_back(token)
            return None
        self._metrics.stream_opened()
        released = threading.Lock()

        def release() -> None:
            if released.acquire(blocking=False):
                self._metrics.stream_closed()
                self._slots.release()
                self._give_back(token)

        return release

    def _give_back(self, token: str | None) -> None:
        with self._by_token_lock:
            left = self._by_token.pop(token or "", 1) - 1
            if left > 0:
                self._by_token[token or ""] = left


def _streams() -> Streams:
    found = current_app.extensions.get(STREAMS)
    if found is None:
        from app.ops.metrics import app_metrics

        found = current_app.extensions.setdefault(
            STREAMS,
            Streams(
                current_app.config["LOCKKEEPER_MAX_STREAMS"],
                app_metrics(),
                current_app.config["LOCKKEEPER_MAX_STREAMS_PER_TOKEN"],
            ),
        )
    return found


def _follow(filters: EventFilter, cursor: str | None) -> Response:
    filters.validate()
    after = stream_start(request.headers.get("Last-Event-ID"), cursor)
    # Taken before the stream counts as open: once the open-streams gauge shows
    # it, every later event reaches it.
    position = start_position(after)
    stopping = _stopping(current_app)
    if stopping.is_set():
        response = problem(
            503,
            "Server stopping",
            "this server is shutting down; reconnect",
            type=wire.SERVER_STOPPING,
        )
        response.headers["Retry-After"] = "1"
        return response
    release = _streams().open(g.token.name)
    if isinstance(release, str):
        # 503 as the waiting room's share: a watcher retries it, since its own
        # dropped stream may not have ended here yet.
        response = problem(
            503,
            "Too many event streams for this token",
            f"this API token already has {_streams().per_token} event streams open"
            f" on this server ({release}); close one, or poll /api/v1/events",
            setting=release,
            type=wire.TOO_MANY_STREAMS,
        )
        response.headers["Retry-After"] = "5"
        return response
    if release is None:
        response = problem(
            503,
            "Too many event streams",
            f"this server already has {_streams().limit} event streams open"
            " (LOCKKEEPER_MAX_STREAMS); retry later, or poll /api/v1/events",
            setting="LOCKKEEPER_MAX_STREAMS",
            type=wire.TOO_MANY_STREAMS,
        )
        response.headers["Retry-After"] = "5"
        return response
    # The request's ORM session (its token lookup) must not stay open in a
    # transaction for the stream's life: each step reads on its own connection.
    db.session.close()
    config = current_app.config
    messages = _messages(
        filters,
        position,
        keepalive=config["LOCKKEEPER_STREAM_KEEPALIVE"],
        poll=config["LOCKKEEPER_STREAM_POLL_INTERVAL"],
        still_there=client_still_there(request.environ),
        release=release,
        lifetime=config["LOCKKEEPER_STREAM_MAX_SECONDS"],
        stopping=stopping,
    )
    response = Response(stream_with_context(messages), mimetype=EVENT_STREAM)
    # Whatever ends the response (the client gone, the server stopping) frees
    # its place, even if the generator never ran.
    response.call_on_close(release)
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"  # nginx: pass each message on
    return response


def _messages(
    filters: EventFilter,
    position,
    *,
    keepalive: float,
    poll: float,
    still_there: Callable[[], bool],
    release: Callable[[], None],
    lifetime: float,
    stopping: threading.Event,
) -> Iterator[str]:
    client_there = still_there

    def still_there() -> bool:
        return not stopping.is_set() and client_there()

    if lifetime:
        # The stream ends then (the client reconnects with Last-Event-ID).
        ends = time.monotonic() + lifetime
        live = still_there

        def still_there() -> bool:
            return time.monotonic() < ends and live()

    try:
        with FollowWakeup(lock_service().queue, poll) as wakeup:
            yield from _follow_loop(
                filters, position, wakeup, keepalive, still_there, poll
            )
        if stopping.is_set():
            # Ended by a shutdown: the client reconnects (Last-Event-ID) soon.
            yield f"retry: {RECONNECT_AFTER_MS}\n\n"
    finally:
        release()


def _follow_loop(
    filters, position, wakeup, keepalive, still_there, poll_for_settling
) -> Iterator[str]:
    # Where the stream starts, as an id with no data (no event): a client that
    # reconnects with it as Last-Event-ID misses nothing, even before any event.
    yield f": open\nid: {position.after}\n\n"
    last_sent = time.monotonic()
    while still_there():
        found, position = follow_step(filters, position)
        if found:
            # The same JSON as the pages of /events, one line each.
            dumps = current_app.json.dumps
            yield "".join(
                f"id: {event.id}\ndata: {dumps(event_to_json(event))}\n\n"
                for event in found
            )
            last_sent = time.monotonic()
            if position.after < position.settled:
                continue  # more settled events to read at once
        if time.monotonic() - last_sent >= keepalive:
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        until_keepalive = keepalive - (time.monotonic() - last_sent)
        if position.pending is not None or position.hole is not None:
            # Waiting for an open transaction to end: no NOTIFY will say so.
            until_keepalive = min(until_keepalive, poll_for_settling)
        wakeup.wait(until_keepalive, still_there)
