"""Pages of the audit log, newest first, on any engine: the server's
``GET /events`` and ``GET /locks/<resource>/events``, its dashboard and CLI,
and the embedded mode read them here.

Events are ordered newest first by id: ids grow with every insert, so
``id < cursor`` pages through ties in ``occurred_at`` without gaps or repeats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine, Select, and_, func, select

from lockkeeper_core import validation
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.follow import BY_PREFIX, BY_TIME, EventFilter
from lockkeeper_core.models import LockEvent
from lockkeeper_core.pagination import (
    DEFAULT_PAGE,
    MAX_PAGE,
    fetch_page,
    page_limit_error,
    read_cursor,
    starts_with,
)
from lockkeeper_core.results import Event, Page
from lockkeeper_core.state import Action
from lockkeeper_core.timestamps import parse_rfc3339

events = LockEvent.__table__

# SQLite keeps no histograms, so it cannot tell a rare prefix or a short
# window from a common one: offered either range it reads the whole range and
# sorts it by id (100,000 events under "job:"), offered none it walks the ids
# newest first past every other event (all 1,000,000 for a rare prefix). A
# range of fewer events than this is read and sorted in a few milliseconds;
# past it its events are common enough that the walk meets a page of them soon.
NARROW_RANGE = 5000


def newest_first(conn: Connection, filters: EventFilter) -> Select:
    """The events matching ``filters``, newest first.

    On SQLite the planner is offered the index range of the prefix or of the
    time window only when it holds fewer than ``NARROW_RANGE`` events (the
    smaller of the two). Otherwise it walks the ids newest first (or the
    owner's, the actor's...); from the top when fewer than ``NARROW_RANGE``
    events came after the window, else (an old, wide window) from the window's
    newest id down to its oldest, found in one pass over its index, not past
    every newer event. One statement counts all three, each up to
    ``NARROW_RANGE``, on its index alone."""
    if conn.dialect.name != "sqlite":
        return filters.apply(select(events)).order_by(events.c.id.desc())
    window = _window(filters)
    counted = {}
    if filters.prefix:
        counted[BY_PREFIX] = starts_with(events.c.resource, filters.prefix)
    if window is not None:
        counted[BY_TIME] = window
    if filters.until is not None:
        counted[_AFTER_WINDOW] = events.c.occurred_at >= filters.until
    sizes = {}
    if counted:
        found = conn.execute(_at_most_narrow(counted)).one()
        sizes = dict(zip(counted, found, strict=True))
    narrow = [
        index
        for index in (BY_PREFIX, BY_TIME)
        if sizes.get(index, NARROW_RANGE) < NARROW_RANGE
    ]
    read_by = min(narrow, key=sizes.__getitem__, default=None)
    query = filters.apply(select(events), read_by=read_by)
    if read_by != BY_TIME and sizes.get(_AFTER_WINDOW, 0) >= NARROW_RANGE:
        first, last = conn.execute(
            select(func.min(events.c.id), func.max(events.c.id)).where(window)
        ).one()
        # None (every event pruned since it was counted) matches nothing.
        query = query.where(events.c.id.between(first, last))
    return query.order_by(events.c.id.desc())


# Counted with the ranges: the events after the window (``newest_first``).
_AFTER_WINDOW = "after the window"


def _window(filters: EventFilter) -> Any:
    """``filters``' time window, as its index reads it; None without one."""
    bounds = []
    if filters.since is not None:
        bounds.append(events.c.occurred_at >= filters.since)
    if filters.until is not None:
        bounds.append(events.c.occurred_at < filters.until)
    return and_(*bounds) if bounds else None


def _at_most_narrow(ranges: dict[str, Any]) -> Select:
    """How many events match each of ``ranges``, counting up to
    ``NARROW_RANGE``."""
    return select(
        *(
            select(func.count())
            .select_from(
                select(events.c.id).where(where).limit(NARROW_RANGE).subquery()
            )
            .scalar_subquery()
            for where in ranges.values()
        )
    )


def cursor_event_id(position: dict[str, Any]) -> int:
    """The event id a cursor's position holds (client input: a JSON integer)."""
    found = position["id"]
    if (
        isinstance(found, bool)
        or not isinstance(found, int)
        or not 0 < found <= validation.MAX_BIGINT
    ):
        raise ValueError(found)
    return found


def stream_start(last_event_id: str | None, cursor: str | None) -> int | None:
    """Where a followed stream starts: after ``last_event_id`` (the
    ``Last-Event-ID`` of a reconnecting client), else after ``cursor`` (an event
    id, or a page's ``next_cursor``), else (None) after the newest event now.
    The server's stream and the embedded one read it alike."""
    if last_event_id is not None:
        after = validation.client_integer(
            last_event_id, minimum=0, maximum=validation.MAX_BIGINT
        )
        if after is None:
            raise InvalidInput([("Last-Event-ID", "must be an event id")])
        return after
    if cursor is None:
        return None
    after = validation.client_integer(cursor, minimum=0, maximum=validation.MAX_BIGINT)
    if after is not None:
        return after
    try:
        return read_cursor(cursor, cursor_event_id)
    except ValueError as exc:
        raise InvalidInput([("cursor", str(exc))]) from None


def list_events(
    engine: Engine,
    filters: EventFilter | None = None,
    *,
    limit: Any = DEFAULT_PAGE,
    cursor: str | None = None,
) -> Page[Event]:
    """One page of events matching ``filters``, newest first."""
    filters = filters or EventFilter()
    filters.validate()
    limit_error = page_limit_error(limit)
    if limit_error:
        raise InvalidInput([("limit", limit_error)])
    before = None
    if cursor is not None:
        try:
            before = read_cursor(cursor, cursor_event_id)
        except ValueError as exc:
            raise InvalidInput([("cursor", str(exc))]) from None
    with engine.connect() as conn:
        query = newest_first(conn, filters)
        if before is not None:
            query = query.where(events.c.id < before)
        rows, next_cursor = fetch_page(conn, query, limit, lambda row: {"id": row.id})
    return Page([Event.from_row(row) for row in rows], next_cursor)


# -- the API's query, read without the server ------------------------------------

# ``GET /events``'s filters (``GET /locks/<resource>/events`` has none: the
# resource is its path's).
PAGE_FILTERS = ("resource", "prefix", "owner", "action", "actor", "since", "until")
MAX_CURSOR = 1024
CONTROL_CHARACTERS = "must not contain control characters"


def page_query(
    query: Mapping[str, str], *, filters: tuple[str, ...] = PAGE_FILTERS
) -> tuple[dict[str, Any], int, str | None]:
    """The filters, limit and cursor of a page's query string, read as the
    server's API reads them (its OpenAPI document's parameters: a limit of 1 to
    500, timestamps with an offset, an action by name, a cursor of at most 1,024
    characters; one message per field, every field at once).

    :raise InvalidInput: a parameter unknown here, or a value out of its form.
    """
    for name, raw in query.items():
        # Checked first and alone, as the server checks every raw query.
        for field, text in (("query", name), (name, raw)):
            if validation.has_control_characters(text):
                raise InvalidInput([(field, CONTROL_CHARACTERS)])
    errors: list[tuple[str, str]] = []
    known = {*filters, "limit", "cursor"}
    errors.extend(
        (name, "is not a known query parameter") for name in query if name not in known
    )
    found: dict[str, Any] = {}
    for name in filters:
        raw = query.get(name)
        if raw is None:
            continue
        if name in ("since", "until"):
            try:
                found[name] = parse_rfc3339(raw)
            except ValueError as exc:
                errors.append((name, str(exc)))
        elif error := _text_error(name, raw):
            errors.append((name, error))
        else:
            found[name] = raw
    limit: Any = DEFAULT_PAGE
    if "limit" in query:
        limit = validation.client_integer(query["limit"])
        if limit is None:
            errors.append(("limit", "must be an integer"))
        elif not 1 <= limit <= MAX_PAGE:
            errors.append(("limit", f"must be at least 1 and at most {MAX_PAGE}"))
    cursor = query.get("cursor")
    if cursor is not None and len(cursor) > MAX_CURSOR:
        errors.append(("cursor", f"must be at most {MAX_CURSOR} characters"))
    if errors:
        raise InvalidInput(errors)
    return found, limit, cursor


def _text_error(name: str, raw: str) -> str | None:
    """Why a filter's text is not of its documented form (the messages of the
    server's schema checks), or None."""
    if name == "action":
        if raw in set(Action):
            return None
        return "must be one of " + ", ".join(a.value for a in Action)
    if name in ("resource", "owner") and not raw:
        return "must not be empty"
    if len(raw) > validation.MAX_NAME:
        return f"must be at most {validation.MAX_NAME} characters"
    if name == "resource" and validation.resource_error(raw):
        return validation.resource_error(raw)
    if name == "owner" and validation.has_control_characters(raw):
        return validation.CONTROL_MESSAGE
    return None
