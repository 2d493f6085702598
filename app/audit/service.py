"""Reading the audit log: filters, keyset pagination, streaming.

Events are ordered newest first by id: ids grow with every insert, so ``id < cursor``
pages through ties in ``occurred_at`` without gaps or repeats.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select

from app.extensions import db
from app.locks import validation
from app.locks.errors import InvalidInput
from app.locks.models import LockEvent
from app.locks.results import Event, Page
from app.locks.service import (
    DEFAULT_PAGE,
    decode_cursor,
    encode_cursor,
    page_limit_error,
)
from app.locks.state import Action

events = LockEvent.__table__


@dataclass(frozen=True, slots=True)
class EventFilter:
    resource: str | None = None
    prefix: str | None = None
    owner: str | None = None
    action: str | None = None
    actor: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def validate(self) -> None:
        errors: list[tuple[str, str]] = []
        if self.resource is not None and validation.resource_error(self.resource):
            errors.append(("resource", validation.resource_error(self.resource)))
        for field in ("prefix", "owner", "actor"):
            value = getattr(self, field)
            if value is not None and (
                len(value) > validation.MAX_NAME
                or validation.has_control_characters(value)
            ):
                errors.append((field, "must be at most 255 printable characters"))
        if self.action is not None and self.action not in set(Action):
            errors.append(
                ("action", "must be one of " + ", ".join(a.value for a in Action))
            )
        for field in ("since", "until"):
            value = getattr(self, field)
            if value is not None and value.tzinfo is None:
                errors.append((field, "must include a timezone (e.g. Z)"))
        if self.since and self.until and self.since.tzinfo and self.until.tzinfo:
            if self.since > self.until:
                errors.append(("until", "must not be before since"))
        if errors:
            raise InvalidInput(errors)

    def apply(self, query: Select) -> Select:
        if self.resource is not None:
            query = query.where(events.c.resource == self.resource)
        if self.prefix:
            query = query.where(
                events.c.resource.startswith(self.prefix, autoescape=True)
            )
        if self.owner is not None:
            query = query.where(events.c.owner == self.owner)
        if self.action is not None:
            query = query.where(events.c.action == self.action)
        if self.actor is not None:
            query = query.where(events.c.actor == self.actor)
        if self.since is not None:
            query = query.where(events.c.occurred_at >= self.since)
        if self.until is not None:
            query = query.where(events.c.occurred_at < self.until)
        return query


def _cursor_id(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    try:
        position = decode_cursor(cursor)["id"]
    except (ValueError, KeyError, TypeError):
        position = None
    if isinstance(position, bool) or not isinstance(position, int):
        raise InvalidInput([("cursor", "is not a cursor this service handed out")])
    return position


def list_events(
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
    before = _cursor_id(cursor)
    query = filters.apply(select(events)).order_by(events.c.id.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(events.c.id < before)
    with db.engine.connect() as conn:
        rows = conn.execute(query).all()
    items = [Event.from_row(row) for row in rows[:limit]]
    next_cursor = encode_cursor({"id": items[-1].id}) if len(rows) > limit else None
    return Page(items, next_cursor)


def iter_events(
    filters: EventFilter | None = None, *, batch: int = 1000
) -> Iterator[Event]:
    """Every matching event, newest first, with flat memory (for exports)."""
    filters = filters or EventFilter()
    filters.validate()
    query = filters.apply(select(events)).order_by(events.c.id.desc())
    with db.engine.connect() as conn:
        result = conn.execution_options(yield_per=batch).execute(query)
        for row in result:
            yield Event.from_row(row)
