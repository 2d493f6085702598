"""Naming a set on its events (``lock_events.set_id``, migration 0037).

Each member's grant event names its set, and so do the events that end it as
the set's (a release of the set, the end of the session it is bound to, an
operator's release of the set); renewals name none (a set renewed every few
seconds would add two statements to each renewal for a label the grant event
already gives). The set's id is drawn at its acquire and written, in the set's
transaction, on the newest event of each member's grant once the grants are
made: the newest event of the member's resource (the end of its (resource, id)
index), written under the member's row lock, which the transaction still
holds. An ending finds the set by the grant event of the grant it ends: the
event written at the grant's acquired_at, read through the events' time index
(a member acquired again on its own since has a new acquired_at, whose event
names no set). Two statements each (find, then name by primary key); the
grants' statements are a single acquire's, unchanged.

The same reads serve the dashboard: the set's grant events are its members
(one each), and a grant is the set's while its newest grant event names it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, text, union_all, update

from lockkeeper_core import validation
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.state import Action
from lockkeeper_core.statements.common import Outcome, events, holders, locks

# The actions of the event that makes (or makes again) a member's grant.
GRANT_ACTIONS = (Action.ACQUIRED, Action.TOOK_OVER, Action.REACQUIRED)
_GRANTS = frozenset(a.value for a in GRANT_ACTIONS)
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


def current_grants(
    conn, grants: Sequence[tuple[str, int]], now, *, stale_rows: bool = False
) -> dict[tuple[str, int], Any]:
    """The (resource, fence) among ``grants`` that are grants now, each with
    its ``acquired_at``: an exclusive grant on the resource's row (live, or
    any still on its row with ``stale_rows``), or a live holder (a shared
    grant)."""
    resources = sorted({resource for resource, _ in grants})
    fences = sorted({fence for _, fence in grants})
    held = [locks.c.owner.is_not(None)]
    if not stale_rows:
        held.append(locks.c.expires_at > now)
    rows = conn.execute(
        select(locks.c.resource, locks.c.fence, locks.c.acquired_at).where(
            locks.c.resource.in_(resources), *held
        )
    ).all()
    holder_rows = conn.execute(
        select(holders.c.resource, holders.c.fence, holders.c.acquired_at).where(
            holders.c.resource.in_(resources),
            holders.c.fence.in_(fences),
            holders.c.expires_at > now,
        )
    ).all()
    wanted = set(grants)
    return {
        (r.resource, r.fence): r.acquired_at
        for r in (*rows, *holder_rows)
        if (r.resource, r.fence) in wanted
    }


def grants_of(
    outcomes: dict[str, Outcome], set_id: str | None = None
) -> list[tuple[str, int, Any, str | None]]:
    """(resource, fence, acquired_at, ``set_id``) of each grant made or
    ended, for ``name_sets``."""
    return [
        (resource, outcome.row.fence, outcome.row.acquired_at, set_id)
        for resource, outcome in outcomes.items()
    ]


def _union(parts):
    return union_all(*parts) if len(parts) > 1 else parts[0]


def _grant_event(resource: str, fence: int, at):
    """The events of ``resource`` carrying ``fence`` written at ``at``: the
    grant's own event (made at its ``acquired_at``) among them. Only the
    time is indexable here (the name is compared as an expression), so
    every planner reads the one instant's rows from the events' time index,
    a prepared statement's generic plan too: by the name's index a busy
    resource's whole history would be read (and was, once PostgreSQL's
    prepared statement settled on a generic plan)."""
    return select(
        events.c.id,
        events.c.resource,
        events.c.fence,
        events.c.action,
        events.c.set_id,
    ).where(
        events.c.occurred_at == at,
        events.c.resource.concat("") == resource,
        events.c.fence == fence,
    )


def sets_of(conn, grants: Sequence[tuple[str, int, Any]]) -> dict[str, list]:
    """The set each (resource, fence, acquired_at) grant was made by (its
    grant event's), as ``{set_id: [(resource, fence), …]}``; grants of no set
    are left out. A member acquired again on its own since has a new
    ``acquired_at``, whose event names no set."""
    if not grants:
        return {}
    newest: dict[tuple[str, int], Any] = {}
    parts = [_grant_event(*grant) for grant in grants]
    for row in conn.execute(_union(parts)):
        # Two grant events of one grant at one instant (a clock that did
        # not move): the later one's.
        grant = (row.resource, row.fence)
        if row.action not in _GRANTS:
            continue
        if grant not in newest or row.id > newest[grant].id:
            newest[grant] = row
    found: dict[str, list] = {}
    for grant, row in newest.items():
        if row.set_id is not None:
            found.setdefault(row.set_id, []).append(grant)
    return found


def _newest_event_ids(conn, grants: Sequence[tuple[str, int]]) -> list[int]:
    """The id of the newest event of each (resource, fence): the one the
    caller has just written under the resource row's lock. The newest event
    of each resource (a look at the end of its (resource, id) index), kept
    when it is that grant's; a resource whose newest event is another's (a
    freeze's, named by its prefix, is written under no row lock) is looked
    for by its fence too."""
    resources = sorted({resource for resource, _ in grants})
    newest = [
        select(events.c.id, events.c.resource, events.c.fence).where(
            events.c.id
            == select(func.max(events.c.id))
            .where(events.c.resource == resource)
            .scalar_subquery()
        )
        for resource in resources
    ]
    found = {(row.resource, row.fence): row.id for row in conn.execute(_union(newest))}
    ids = [found[grant] for grant in grants if grant in found]
    others = [grant for grant in grants if grant not in found]
    if others:
        by_fence = [
            select(events.c.id).where(
                events.c.id
                == select(func.max(events.c.id))
                .where(events.c.resource == resource, events.c.fence == fence)
                .scalar_subquery()
            )
            for resource, fence in others
        ]
        ids.extend(row.id for row in conn.execute(_union(by_fence)))
    return ids


def name_set(conn, grants_by_set: dict[str, list]) -> None:
    """Write each set's id on the newest event of each of its (resource,
    fence) grants: the one its caller has just written in this transaction,
    under the grant's row lock. Found, then named by primary key: two
    statements (the update names no subquery on the table it writes)."""
    for set_id, grants in grants_by_set.items():
        if not grants:
            continue
        ids = _newest_event_ids(conn, [(g[0], g[1]) for g in grants])
        if ids:
            conn.execute(
                update(events).where(events.c.id.in_(ids)).values(set_id=set_id)
            )


# PostgreSQL: ``name_sets`` in one statement. For each grant (resource, fence,
# acquired_at, set id or NULL): the set (given, or the one its grant event
# names: the newest grant event of that grant written at its acquired_at,
# read through the time index as ``_grant_event`` does), then that set on
# the resource's newest event when it is the grant's (its fence); each row
# answered with whether it was named.
_PG_NAME_SETS = text(
    """
WITH m AS (
    SELECT g.resource, g.fence, COALESCE(g.set_id, (
        SELECT e.set_id FROM lock_events AS e
        WHERE e.occurred_at = g.at AND e.resource || '' = g.resource
          AND e.fence = g.fence
          AND e.action IN ('acquired', 'took_over', 'reacquired')
        ORDER BY e.id DESC LIMIT 1)) AS set_id
    FROM unnest(CAST(:resources AS varchar[]), CAST(:fences AS bigint[]),
                CAST(:ats AS timestamptz[]), CAST(:sets AS varchar[]))
         AS g(resource, fence, at, set_id)
), named AS (
    UPDATE lock_events AS e SET set_id = m.set_id
    FROM m
    WHERE m.set_id IS NOT NULL
      AND e.id = (SELECT max(x.id) FROM lock_events AS x
                  WHERE x.resource = m.resource)
      AND e.fence = m.fence
    RETURNING e.resource, e.fence
)
SELECT m.resource, m.fence, m.set_id, n.resource IS NOT NULL AS named
FROM m LEFT JOIN named AS n ON n.resource = m.resource AND n.fence = m.fence
"""
)


def name_sets(conn, grants: Sequence[tuple[str, int, Any, str | None]]) -> None:
    """Name the set on the newest event of each (resource, fence, acquired_at,
    set_id) grant: the set given (an acquire, an operator's release of the
    set), or, for None, the set the grant was made by (``sets_of``: a
    release, a session's end). The newest event is the one the caller has
    just written under the grant's row lock. PostgreSQL: one statement
    (``_PG_NAME_SETS``), then the two-statement form for any grant whose
    resource's newest event was another's; elsewhere ``sets_of`` for the
    grants without a set, then ``name_set``."""
    if not grants:
        return
    if conn.dialect.name == "postgresql":
        rows = conn.execute(
            _PG_NAME_SETS,
            {
                "resources": [g[0] for g in grants],
                "fences": [g[1] for g in grants],
                "ats": [g[2] for g in grants],
                "sets": [g[3] for g in grants],
            },
        ).all()
        unnamed: dict[str, list] = {}
        for row in rows:
            if row.set_id is not None and not row.named:
                unnamed.setdefault(row.set_id, []).append((row.resource, row.fence))
        name_set(conn, unnamed)
        return
    by_set: dict[str, list] = {}
    for resource, fence, _, set_id in grants:
        if set_id is not None:
            by_set.setdefault(set_id, []).append((resource, fence))
    looked_up = sets_of(conn, [g[:3] for g in grants if g[3] is None])
    for set_id, named in looked_up.items():
        by_set.setdefault(set_id, []).extend(named)
    name_set(conn, by_set)
