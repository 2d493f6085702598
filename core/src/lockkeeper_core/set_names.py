"""Naming a set on its events (``lock_events.set_id``, migration 0037).

Every event of a set names it: each member's grant event, and the events of
the set's renewals and releases. The set's id is drawn at its acquire and
written, in the set's transaction, on the newest event of each member's grant
once the grants are made: the grant's event, found by its resource and fence
(a fence is one grant's; the event is written under the member's row lock,
which the transaction still holds, so no later event of that grant can be
there). A renewal or release names the set that each member's grant was made
by (the set on its newest grant event: a member acquired again on its own
since is no longer the set's). The grants' statements are those of a single
acquire, unchanged: the naming is two statements of the set's own (find the
events, then name them).

The same reads serve the dashboard: the set's grant events are its members
(one each), and a grant is the set's while its newest grant event names it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, literal, select, union_all, update

from lockkeeper_core import validation
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.state import Action
from lockkeeper_core.statements.common import Outcome, events, holders, locks

# The actions of the event that makes (or makes again) a member's grant.
GRANT_ACTIONS = (Action.ACQUIRED, Action.TOOK_OVER, Action.REACQUIRED)
# secrets.token_urlsafe(12): 16 characters of [A-Za-z0-9_-].
SET_ID_BYTES = 12


def new_set_id() -> str:
    return secrets.token_urlsafe(SET_ID_BYTES)


def check_set_id(set_id: Any) -> None:
    error = validation.set_id_error(set_id)
    if error:
        raise InvalidInput([("set", error)])


def grant_events(conn, set_id: str) -> list[Any]:
    """The set's grant events (one per member), in the lock order."""
    return conn.execute(
        select(events)
        .where(
            events.c.set_id == set_id,
            events.c.action.in_([a.value for a in GRANT_ACTIONS]),
        )
        .order_by(events.c.resource)
    ).all()


def live_grants(conn, grants: Sequence[tuple[str, int]], now) -> set[tuple[str, int]]:
    """The (resource, fence) among ``grants`` that are live grants now: an
    exclusive grant on the resource's row, or a place (a shared grant)."""
    resources = sorted({resource for resource, _ in grants})
    fences = sorted({fence for _, fence in grants})
    rows = conn.execute(
        select(locks.c.resource, locks.c.fence).where(
            locks.c.resource.in_(resources),
            locks.c.owner.is_not(None),
            locks.c.expires_at > now,
        )
    ).all()
    places = conn.execute(
        select(holders.c.resource, holders.c.fence).where(
            holders.c.resource.in_(resources),
            holders.c.fence.in_(fences),
            holders.c.expires_at > now,
        )
    ).all()
    return {(r.resource, r.fence) for r in (*rows, *places)} & set(grants)


def grants_of(outcomes: dict[str, Outcome]) -> list[tuple[str, int]]:
    """The (resource, fence) of each grant made, renewed or ended."""
    return [(resource, outcome.row.fence) for resource, outcome in outcomes.items()]


def _newest_events(grants: Iterable[tuple[str, int]], actions=None):
    """For each (resource, fence), the newest event of that grant (of
    ``actions`` only, if given): one primary-key look each, through the
    events' (resource, id) index read backwards from the newest."""
    parts = []
    for resource, fence in grants:
        newest = select(func.max(events.c.id)).where(
            events.c.resource == resource, events.c.fence == fence
        )
        if actions is not None:
            newest = newest.where(events.c.action.in_([a.value for a in actions]))
        parts.append(
            select(
                events.c.id, events.c.resource, events.c.set_id, literal(fence)
            ).where(events.c.id == newest.scalar_subquery())
        )
    return parts


def sets_of(conn, grants: Sequence[tuple[str, int]]) -> dict[str, list]:
    """The set each grant was made by (its newest grant event's), as
    ``{set_id: [(resource, fence), …]}``; grants of no set are left out."""
    if not grants:
        return {}
    parts = _newest_events(grants, GRANT_ACTIONS)
    found: dict[str, list] = {}
    for row in conn.execute(union_all(*parts) if len(parts) > 1 else parts[0]):
        if row.set_id is not None:
            found.setdefault(row.set_id, []).append((row.resource, row[3]))
    return found


def name_set(conn, grants_by_set: dict[str, list]) -> None:
    """Write each set's id on the newest event of each of its grants: the
    one its caller has just written in this transaction, under the grant's
    row lock. Found, then named by primary key: two statements whose plans
    are index looks on every database (the update names no subquery on the
    table it writes)."""
    for set_id, grants in grants_by_set.items():
        if not grants:
            continue
        parts = _newest_events(grants)
        ids = [
            row.id
            for row in conn.execute(union_all(*parts) if len(parts) > 1 else parts[0])
        ]
        if ids:
            conn.execute(
                update(events).where(events.c.id.in_(ids)).values(set_id=set_id)
            )
