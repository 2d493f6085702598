"""Reading the audit log: pages and exports (``lockkeeper_core.event_pages``, on
the server's engine), how long grants lasted, retention."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lockkeeper_core import event_pages
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.follow import EventFilter
from lockkeeper_core.models import LockEvent, LockSession
from lockkeeper_core.pagination import DEFAULT_PAGE
from lockkeeper_core.results import Event, Page
from lockkeeper_core.state import Action
from sqlalchemy import (
    Select,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    union_all,
)

from app.audit.tenures import (
    ENDINGS,
    EXTENSIONS,
    GRANTS,
    HELD,
    HOLDING,
    Tenure,
    bound_session,
    ends,
    ends_condition,
    names_previous_holder,
    previous_token_sql,
    records_an_end,
    tenure,
)
from app.extensions import db, lock_service

events = LockEvent.__table__
_sessions = LockSession.__table__


def list_events(
    filters: EventFilter | None = None,
    *,
    limit: Any = DEFAULT_PAGE,
    cursor: str | None = None,
) -> Page[Event]:
    """One page of events matching ``filters``, newest first
    (``lockkeeper_core.event_pages`` on the server's engine)."""
    return event_pages.list_events(db.engine, filters, limit=limit, cursor=cursor)


def newest_event_id(resource: str | None = None) -> int:
    """The id of the newest event (of ``resource``), 0 when there is none.

    Ids only grow, so this is a cheap version of "what the log holds": the
    dashboard's polls compare it to skip re-rendering an unchanged page. One
    index lookup (the primary key, or ``(resource, id)``).
    """
    query = select(func.max(events.c.id))
    if resource is not None:
        query = query.where(events.c.resource == resource)
    with db.engine.connect() as conn:
        return conn.execute(query).scalar() or 0


def last_run(resource: str) -> Event | None:
    """The newest release of ``resource`` that reported how its run ended
    (``lockkeeper exec``'s exit status, duration and host), or None. Walks the
    resource's events newest first on ``(resource, id)``, releases only."""
    query = (
        select(events)
        .where(
            events.c.resource == resource,
            events.c.action == Action.RELEASED.value,
            events.c.details.is_not(None),
        )
        .order_by(events.c.id.desc())
        .limit(1)
    )
    with db.engine.connect() as conn:
        row = conn.execute(query).one_or_none()
    if row is None:
        return None
    found = Event.from_row(row)
    return found if isinstance((found.details or {}).get("run"), dict) else None


def iter_events(
    filters: EventFilter | None = None, *, batch: int = 1000
) -> Iterator[Event]:
    """Every matching event, newest first, with flat memory (for exports)."""
    filters = filters or EventFilter()
    filters.validate()
    with db.engine.connect() as conn:
        query = event_pages.newest_first(conn, filters)
        result = conn.execution_options(yield_per=batch).execute(query)
        for row in result:
            yield Event.from_row(row)


# -- how long each grant of ownership lasted -------------------------------------


@dataclass(frozen=True, slots=True)
class Tenures:
    """Tenures touching a page of events, by the id of the grant event that started
    each (``started``) and of the event that recorded its end (``ended``)."""

    started: dict[int, Tenure]
    ended: dict[int, Tenure]


def tenures(page: Iterable[Event]) -> Tenures:
    """The ended tenures that the grants on ``page`` started and its events ended,
    by the rules of ``app.audit.tenures`` per grant (``ends``), so the holders
    of a semaphore or of shared grants each keep their own tenure.

    A tenure needs only its grant, its newest event and its boundary: two
    queries per page whatever its length, each row a probe of the (resource, id)
    index from its event: never one query per row (and, when a grant read is
    bound to a session, one for the sessions' expiries and the clock). Each
    query returns a set of events that holds every answer; the rule then
    picks each answer from it (the newest, or the first, event it allows), so
    SQL and Python apply the same rule to the same events.
    """
    page = list(page)
    grants = [e for e in page if e.action in GRANTS]
    recorded = [e for e in page if records_an_end(e)]
    if not grants and not recorded:
        return Tenures({}, {})
    known = {e.id: e for e in page}
    grant_ids = [e.id for e in grants]
    with db.engine.connect() as conn:
        found = conn.execute(
            _HOLDING_EVENTS,
            {
                "grants": grant_ids,
                "endings": [e.id for e in recorded if e.action in ENDINGS],
                "replacing": [e.id for e in recorded if e.action in GRANTS],
            },
        )
        for row in found:
            known[row.id] = Event.from_row(row)
        lasts = {g.id: _newest_of_fence(known.values(), g) for g in grants}
        if grants:
            found = conn.execute(
                _BOUNDARY_EVENTS,
                {"grants": grant_ids, "lasts": [e.id for e in lasts.values()]},
            )
            for row in found:
                known[row.id] = Event.from_row(row)
        sessions = _session_expiries(conn, known.values())
    by_resource: dict[str, list[Event]] = {}
    for event in sorted(known.values(), key=lambda e: e.id):
        by_resource.setdefault(event.resource, []).append(event)
    started: dict[int, Tenure] = {}
    ended: dict[int, Tenure] = {}
    now: datetime | None = None

    def keep(found: Tenure) -> None:
        if found.grant_id is not None:
            started[found.grant_id] = found
        if found.end_id is not None:
            ended[found.end_id] = found

    for grant in grants:
        last = lasts[grant.id]
        boundary = next(
            (
                e
                for e in by_resource[grant.resource]
                if e.id > grant.id and ends(grant, last, e)
            ),
            None,
        )
        if boundary is not None:
            keep(tenure(grant, last, boundary, sessions=sessions))
        elif bound_session(last) is not None:
            # Nothing names its end: a session-bound grant ran out with its
            # session (at its expiry, or when is not known), unless it lives.
            if now is None:
                now = lock_service().now()
            ran_out = tenure(grant, last, None, now, sessions)
            if ran_out.ended_by != HELD:
                keep(ran_out)
    for boundary in recorded:
        if boundary.id in ended:
            continue
        earlier = [e for e in by_resource[boundary.resource] if e.id < boundary.id]
        last = _newest(e for e in earlier if _of_ended_tenure(e, boundary))
        if last is None:
            continue
        grant = _newest(
            e for e in earlier if e.action in GRANTS and e.fence == last.fence
        )
        if ends(grant or last, last, boundary):
            keep(tenure(grant, last, boundary, sessions=sessions))
    return Tenures(started, ended)


def session_expiries(found: Iterable[Event]) -> dict[str, datetime]:
    """The expiry of each session the grants among ``found`` are bound to
    whose row still exists, by id (``app.audit.tenures.tenure`` reads a
    session-bound grant's end from it). No query when none is bound."""
    found = list(found)
    if not any(bound_session(e) for e in found):
        return {}
    with db.engine.connect() as conn:
        return _session_expiries(conn, found)


def _session_expiries(conn, found: Iterable[Event]) -> dict[str, datetime]:
    ids = sorted({s for s in (bound_session(e) for e in found) if s is not None})
    if not ids:
        return {}
    rows = conn.execute(
        select(_sessions.c.id, _sessions.c.expires_at).where(_sessions.c.id.in_(ids))
    )
    return {row.id: row.expires_at for row in rows}


def _newest(found: Iterable[Event]) -> Event | None:
    return max(found, key=lambda e: e.id, default=None)


def _newest_of_fence(found: Iterable[Event], grant: Event) -> Event:
    """The newest event of ``grant``'s tenure in ``found`` (the grant itself
    when none is later)."""
    return (
        _newest(
            e
            for e in found
            if e.resource == grant.resource
            and e.fence == grant.fence
            and e.id >= grant.id
            and e.action in HOLDING
        )
        or grant
    )


def _of_ended_tenure(event: Event, boundary: Event) -> bool:
    """``event`` (before ``boundary``) is an event of the tenure ``boundary``
    recorded the end of: one of its fence (an ending), one of its previous
    owner (a take-over, a force-claim)."""
    if event.action not in HOLDING:
        return False
    if boundary.action in ENDINGS:
        return event.fence == boundary.fence
    return names_previous_holder(boundary, event.owner, event.token)


def _probe_statement(probes) -> Select:
    """The events whose ids the ``probes`` (selects of one id per anchor)
    find. Built once: its anchors are expanding parameters, so every page runs
    the same compiled statement."""
    return select(events).where(events.c.id.in_(union_all(*probes)))


def _anchored(probe, anchors: str) -> Select:
    return select(probe).where(_anchor.c.id.in_(bindparam(anchors, expanding=True)))


def _step(where, *, before: bool | None) -> Any:
    """The id of the newest event of the anchor's resource before it (or at
    or after it: ``before`` False) satisfying ``where``; ``before`` None: the
    first after it. An ordered probe of the (resource, id) index that stops
    at the first match."""
    if before is None:
        bound, order = _other.c.id > _anchor.c.id, _other.c.id
    elif before:
        bound, order = _other.c.id < _anchor.c.id, _other.c.id.desc()
    else:
        bound, order = _other.c.id >= _anchor.c.id, _other.c.id.desc()
    return (
        select(_other.c.id)
        .where(_other.c.resource == _anchor.c.resource, bound, where)
        .order_by(order)
        .limit(1)
        .scalar_subquery()
    )


_anchor = events.alias("anchor")
_other = events.alias("other")
_holding = _other.c.action.in_([a.value for a in HOLDING])
_granting = _other.c.action.in_([a.value for a in GRANTS])
_of_fence = _other.c.fence == _anchor.c.fence
# The previous holder's events: its owner's, and of a take-over that recorded
# the token it took, that token's only (one owner may be a holder under two).
_of_previous_owner = and_(
    _other.c.owner == _anchor.c.previous_owner,
    or_(
        previous_token_sql(_anchor).is_(None),
        func.coalesce(_other.c.token, "") == previous_token_sql(_anchor),
    ),
)

# Per page grant the newest event of its fence (its expiry is where it runs
# out); per recorded end the newest event, and the newest grant, of the
# tenure it ended (by its fence, or its previous owner's).
_HOLDING_EVENTS = _probe_statement(
    [
        _anchored(_step(and_(_of_fence, _holding), before=False), "grants"),
        _anchored(_step(and_(_of_fence, _holding), before=True), "endings"),
        _anchored(_step(and_(_of_fence, _granting), before=True), "endings"),
        _anchored(_step(and_(_of_previous_owner, _holding), before=True), "replacing"),
        _anchored(_step(and_(_of_previous_owner, _granting), before=True), "replacing"),
    ]
)
# Per page grant the first event after it that names its tenure
# (``ends_condition`` with no expiry), and the first after its newest event
# that ends it (with that event's expiry): nothing between the two ends it
# by running out, which comes after the newest event's instant.
_BOUNDARY_EVENTS = _probe_statement(
    [
        _anchored(
            _step(
                ends_condition(
                    _other, _anchor.c.fence, _anchor.c.owner, _anchor.c.token, None
                ),
                before=None,
            ),
            "grants",
        ),
        _anchored(
            _step(
                ends_condition(
                    _other,
                    _anchor.c.fence,
                    _anchor.c.owner,
                    _anchor.c.token,
                    _anchor.c.expires_at,
                ),
                before=None,
            ),
            "lasts",
        ),
    ]
)


# -- renewals folded into their tenure ------------------------------------------

# The actions a history hides by default: they extend a tenure, they change no
# ownership. Each grant then says how often it was extended, and when last.
FOLDED = tuple(a.value for a in EXTENSIONS)


@dataclass(frozen=True, slots=True)
class Renewals:
    count: int
    last_at: datetime


def renewals(page: Iterable[Event]) -> dict[int, Renewals]:
    """For each grant on ``page`` (by id): its tenure's renewals and
    same-holder re-acquires (events of its resource and fence after it), how
    many and the newest. One grouped query per page, each grant a range of the
    (resource, id) index."""
    grant_ids = [e.id for e in page if e.action in GRANTS]
    if not grant_ids:
        return {}
    grant = events.alias("grant_event")
    later = events.alias("extension")
    query = (
        select(grant.c.id, func.count(later.c.id), func.max(later.c.occurred_at))
        .join(
            later,
            (later.c.resource == grant.c.resource)
            & (later.c.id > grant.c.id)
            & (later.c.fence == grant.c.fence)
            & later.c.action.in_(FOLDED),
        )
        .where(grant.c.id.in_(grant_ids))
        .group_by(grant.c.id)
    )
    with db.engine.connect() as conn:
        rows = conn.execute(query).all()
    return {row[0]: Renewals(row[1], row[2]) for row in rows}


# -- retention -------------------------------------------------------------------

PRUNE_BATCH = 1000


def prune_events(older_than: timedelta, *, batch: int = PRUNE_BATCH) -> int:
    """Delete events that occurred more than ``older_than`` ago; returns how many.

    Deletes ``batch`` ids per short transaction, oldest first, so live writers
    (which only insert new, higher ids) wait at most one batch and never deadlock
    with it. Fences are untouched: they come from a sequence, not from events.
    """
    if older_than < timedelta(0):
        raise InvalidInput([("older_than", "must not be negative")])
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidInput([("batch", "must be a positive integer")])
    service = lock_service()
    cutoff = service.now() - older_than

    def delete_batch(conn) -> int:
        ids = conn.scalars(
            select(events.c.id)
            .where(events.c.occurred_at < cutoff)
            .order_by(events.c.id)
            .limit(batch)
        ).all()
        if ids:
            conn.execute(delete(events).where(events.c.id.in_(ids)))
        return len(ids)

    pruned = 0
    while True:
        # One short write transaction per batch (BEGIN IMMEDIATE on SQLite),
        # retried on deadlocks and lock-wait timeouts like every lock operation.
        deleted = service.run_transaction(delete_batch)
        pruned += deleted
        if deleted < batch:
            return pruned
