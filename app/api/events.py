"""The audit log over the API: one resource's events, or all of them, newest first;
or, with ``follow=true``, every new one as it is written (Server-Sent Events)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from flask import Response, current_app, g, jsonify, request, stream_with_context

from app.api.blueprint import bp
from app.api.schemas import event_to_json
from app.api.shapes import query
from app.audit.follow import FollowWakeup, follow_step, start_position
from app.audit.service import EventFilter, list_events
from app.errors import problem
from app.extensions import db
from app.locks.errors import InvalidInput
from app.locks.pagination import read_cursor
from app.locks.queue import client_still_there
from app.locks.service import lock_service

STREAMS = "lockkeeper.api.streams"
EVENT_STREAM = "text/event-stream"
MAX_EVENT_ID = 2**63 - 1


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
    a server thread for its whole life (see docs/deploy.md, "Event streams")."""

    def __init__(self, limit: int, metrics):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit) if limit else None
        self._metrics = metrics

    def open(self) -> Callable[[], None] | None:
        """A place for one more stream (its release, to call once), or None."""
        if self._slots is None or not self._slots.acquire(blocking=False):
            return None
        self._metrics.stream_opened()
        released = threading.Lock()

        def release() -> None:
            if released.acquire(blocking=False):
                self._metrics.stream_closed()
                self._slots.release()

        return release


def _streams() -> Streams:
    found = current_app.extensions.get(STREAMS)
    if found is None:
        from app.ops.metrics import app_metrics

        found = current_app.extensions.setdefault(
            STREAMS,
            Streams(current_app.config["LOCKKEEPER_MAX_STREAMS"], app_metrics()),
        )
    return found


def _start_after(cursor: str | None) -> int | None:
    """The id to start after: ``Last-Event-ID`` (a reconnecting client), else
    ``cursor`` (an event id or a cursor this service handed out), else None."""
    last = request.headers.get("Last-Event-ID")
    if last is not None:
        if not last.isdigit() or int(last) > MAX_EVENT_ID:
            raise InvalidInput([("Last-Event-ID", "must be an event id")])
        return int(last)
    if cursor is None:
        return None
    if cursor.isdigit() and int(cursor) <= MAX_EVENT_ID:
        return int(cursor)
    try:
        return read_cursor(cursor, lambda position: int(position["id"]))
    except ValueError as exc:
        raise InvalidInput([("cursor", str(exc))]) from None


def _follow(filters: EventFilter, cursor: str | None) -> Response:
    filters.validate()
    after = _start_after(cursor)
    # Taken before the stream counts as open: once the open-streams gauge shows
    # it, every later event reaches it.
    position = start_position(after)
    release = _streams().open()
    if release is None:
        response = problem(
            503,
            "Too many event streams",
            f"this server already has {_streams().limit} event streams open;"
            " retry later, or poll /api/v1/events",
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
) -> Iterator[str]:
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
