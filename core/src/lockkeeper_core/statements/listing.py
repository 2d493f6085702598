"""The SQL forms of the lock list's orders and filters, on every dialect.

The list is read in the database, a page at a time with a keyset cursor, so
each order here is a tuple of SQL expressions ending in the unique resource and
each has a Python twin that computes a cursor's position from a row's values.

- **Natural order** of names: ``job:4100`` before ``job:20001``. A name is its
  head (everything up to its trailing digits) and the count of those digits;
  ordering by (head, digit count, name) puts the trailing numbers of one head in
  numeric order (equal lengths compare as text do as numbers).
- **Contended**: a lock with a live waiter in line.
- **Prefixes**: a name's next prefix below a searched one, to group by.
- **Waiters**: how many live waiters each waited-for resource has, from one
  grouped read of the line (the service merges those few locks with the rest,
  read in resource order).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, case, func, literal, literal_column, null, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Integer, String

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.models import EXCLUSIVE, LockSession
from lockkeeper_core.state import Action, seconds_between
from lockkeeper_core.statements.common import events, holders, locks, waiters

sessions = LockSession.__table__

DIGITS = "0123456789"


class _NameHead(FunctionElement[str]):
    """A name without its trailing digits (``job:4100`` -> ``job:``)."""

    type = String()
    inherit_cache = True
    name = "lockkeeper_name_head"


@compiles(_NameHead)
def _head_rtrim(element, compiler, **kw):
    # SQLite and PostgreSQL: rtrim(text, characters) strips any of them.
    (argument,) = element.clauses
    return f"rtrim({compiler.process(argument, **kw)}, '{DIGITS}')"


@compiles(_NameHead, "mysql")
@compiles(_NameHead, "mariadb")
def _head_regexp(element, compiler, **kw):
    # MariaDB's RTRIM takes no character set; its regexp does.
    (argument,) = element.clauses
    return f"regexp_replace({compiler.process(argument, **kw)}, '[0-9]+$', '')"


class _Position(FunctionElement[int]):
    """Where ``needle`` first occurs in ``text``, from 1; 0 when it does not."""

    type = Integer()
    inherit_cache = True
    name = "lockkeeper_position"


@compiles(_Position)
def _position_instr(element, compiler, **kw):
    text, needle = element.clauses
    return f"instr({compiler.process(text, **kw)}, {compiler.process(needle, **kw)})"


@compiles(_Position, "postgresql")
def _position_strpos(element, compiler, **kw):
    text, needle = element.clauses
    return f"strpos({compiler.process(text, **kw)}, {compiler.process(needle, **kw)})"


def next_prefix(under: str, resource=locks.c.resource, separator: str = ":"):
    """The name up to and including its first ``separator`` after ``under``
    (which it starts with), or NULL when none follows: ``job:`` for
    ``job:4100`` under ``""``, ``job:eu:`` for ``job:eu:7`` under ``job:``.
    Every name starting with such a prefix has it as its own, so a group of
    them is exactly what a prefix search for it lists."""
    # Under no prefix the rest is the whole name: a substr of it from 1 would
    # copy every name once more (a third of a By prefix view's time). Its
    # expression is then, literally, the one of
    # ``ix_distributed_locks_prefix_expires_at`` (migration 0027): a planner
    # matches an index's expression, not values bound to it, so the constants
    # are written out.
    if not under:
        at = _Position(resource, literal_column(f"'{separator}'", String()))
        one, none_before = literal_column("1"), literal_column("0")
        return case((at > none_before, func.substr(resource, one, at)))
    at = _Position(func.substr(resource, len(under) + 1), literal(separator, String()))
    return case((at > 0, func.substr(resource, 1, len(under) + at)), else_=null())


def name_head(name: str) -> str:
    """The Python twin of the SQL head (digits are ASCII on every dialect)."""
    return name.rstrip(DIGITS)


def natural_order(resource=locks.c.resource) -> list[Any]:
    """(head, count of trailing digits, name): the natural order of names.

    The digit count is a difference of lengths, so it is the same whether a
    dialect counts characters or bytes (digits are one byte)."""
    head = _NameHead(resource)
    return [head, func.length(resource) - func.length(head), resource]


def natural_position(name: str) -> list[Any]:
    """The values of ``natural_order`` for ``name``, for a cursor."""
    head = name_head(name)
    return [head, len(name) - len(head), name]


def contended_resources(now):
    """The resources with a live waiter at ``now`` (an uncorrelated subquery,
    read once per statement)."""
    return (
        select(waiters.c.resource)
        .where(waiters.c.deadline > now)
        .group_by(waiters.c.resource)
    )


def waiter_counts(now):
    """(resource, waiting) of every resource with live waiters: a derived table
    to outer-join to the locks (a lock absent from it has none)."""
    return (
        select(waiters.c.resource, func.count().label("waiting"))
        .where(waiters.c.deadline > now)
        .group_by(waiters.c.resource)
        .subquery("waiting_counts")
    )


def owner_contains(text: str, owner=locks.c.owner):
    """Owners containing ``text``, ignoring case: the overview's search. Its
    one form, so the rows, the counts and the stale release all agree (even
    where a dialect's ``lower`` folds only ASCII, as SQLite's does)."""
    escaped = text.replace("/", "//").replace("%", "/%").replace("_", "/_")
    pattern = literal(f"%{escaped}%", String())
    return func.lower(owner).like(func.lower(pattern), escape="/")


def is_contended(now, resource=locks.c.resource):
    return resource.in_(contended_resources(now))


# -- the grants a list reads ----------------------------------------------------
#
# A list reads grants from two sources with the same columns, ``GRANT_COLUMNS``:
# the exclusive grants (rows of ``distributed_locks`` with an owner, live or
# stale) and the live holders and shared grants (rows of ``lock_holders``). A
# resource is in one of them at a time: granting a holder clears the row's owner.
# ``from_holders`` tells them apart (0 exclusive, 1 a holder).

EXCLUSIVE_GRANTS = "exclusive_grants"
HOLDER_HELD = "holder_held"
HOLDER_GRANTS = "holder_grants"
GRANT_COLUMNS = (
    "resource",
    "owner",
    "token",
    "fence",
    "acquired_at",
    "expires_at",
    "holder_limit",
    "mode",
    "session_id",
    "from_holders",
)


def exclusive_grants():
    """Every exclusive grant, live or stale (a plain subquery every dialect
    merges into the query around it, so the table's indexes serve it)."""
    return (
        select(
            locks.c.resource,
            locks.c.owner,
            locks.c.token,
            locks.c.fence,
            locks.c.acquired_at,
            locks.c.expires_at,
            locks.c.holder_limit,
            literal(EXCLUSIVE, String()).label("mode"),
            locks.c.session_id,
            literal(0).label("from_holders"),
        )
        .where(locks.c.owner.is_not(None))
        .subquery(EXCLUSIVE_GRANTS)
    )


def _holder_columns(resource, holder, holder_limit):
    return (
        resource,
        holder.c.owner,
        holder.c.token,
        holder.c.fence,
        holder.c.acquired_at,
        holder.c.expires_at,
        holder_limit,
        holder.c.mode,
        holder.c.session_id,
        literal(1).label("from_holders"),
    )


def holder_grants(now):
    """Every live holder and shared grant at ``now``, each an entry of its own
    (``ix_lock_holders_resource_expires_at`` finds them)."""
    return (
        select(*_holder_columns(holders.c.resource, holders, locks.c.holder_limit))
        .select_from(holders.join(locks, locks.c.resource == holders.c.resource))
        .where(holders.c.expires_at > now, locks.c.owner.is_(None))
        .subquery(HOLDER_GRANTS)
    )


def holder_held_resources(now):
    """Every resource held by holders at ``now``, one entry each: its live grant
    that ends first (the one ``LockService.get`` answers), picked by one pass
    over the live holders (a window, not a probe per resource)."""
    turn = (
        func.row_number()
        .over(
            partition_by=holders.c.resource,
            order_by=(holders.c.expires_at, holders.c.id),
        )
        .label("turn")
    )
    live = (
        select(holders, turn).where(holders.c.expires_at > now).subquery("live_holders")
    )
    return (
        select(*_holder_columns(live.c.resource, live, locks.c.holder_limit))
        .select_from(live.join(locks, locks.c.resource == live.c.resource))
        .where(live.c.turn == 1, locks.c.owner.is_(None))
        .subquery(HOLDER_HELD)
    )


def only_live(source) -> bool:
    """Whether ``source`` lists live grants only (the holders: a stale holder
    is nobody's grant)."""
    return source.name != EXCLUSIVE_GRANTS


def one_per_resource(source) -> bool:
    """Whether ``source`` has at most one entry per resource (every source but
    the holder grants)."""
    return source.name != HOLDER_GRANTS


def held_by_owner(source, condition, now):
    """``source``'s entries whose holder's owner meets ``condition`` (a function
    of an owner column); for one entry per holder-held resource: any of its live
    holders' owners, so a search finds a resource by each of its holders."""
    if source.name != HOLDER_HELD:
        return condition(source.c.owner)
    other = holders.alias("other_holders")
    return (
        select(other.c.id)
        .where(
            other.c.resource == source.c.resource,
            other.c.expires_at > now,
            condition(other.c.owner),
        )
        .exists()
    )


def live_holder_count(resource, now):
    """How many live grants ``resource`` has in ``lock_holders`` (a scalar
    subquery, read for the rows of a page only)."""
    return (
        select(func.count())
        .select_from(holders)
        .where(holders.c.resource == resource, holders.c.expires_at > now)
        .scalar_subquery()
    )


def bound_session(session_id, owner, token, expires_at):
    """The id of the session a grant is still bound to, or NULL: its session's
    row names its holder and has its expiry (see ``statements.sessions``)."""
    return (
        select(sessions.c.id)
        .where(
            sessions.c.id == session_id,
            sessions.c.owner == owner,
            sessions.c.token == token,
            sessions.c.expires_at == expires_at,
        )
        .scalar_subquery()
    )


# The actions whose event sets a grant's expiry to its ttl from the event's time.
GRANTING_ACTIONS = tuple(
    action.value
    for action in (
        Action.ACQUIRED,
        Action.REACQUIRED,
        Action.TOOK_OVER,
        Action.RENEWED,
        Action.CLAIMED,
        Action.FORCE_CLAIMED,
    )
)


def _latest_granting_event(grant, column):
    """``column`` of the latest event that granted or renewed ``grant`` (columns
    ``resource``, ``fence``): a probe of ``ix_lock_events_resource_id``, its
    resource's events newest first, to the first of its fence."""
    return (
        select(column)
        .where(
            events.c.resource == grant.resource,
            events.c.fence == grant.fence,
            events.c.action.in_(GRANTING_ACTIONS),
        )
        .order_by(events.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )


# The label of the ``granted_ttl`` a read selects beside its rows (read by
# ``Lock.from_row``).
GRANTED_TTL = "granted_ttl"


def granted_ttl(grant):
    """The ttl in seconds ``grant`` (columns ``resource``, ``fence``,
    ``session_id``, ``acquired_at``, ``expires_at``) was last granted or renewed
    for, read from what is stored rather than stored again (no schema change,
    and no change to the database's lock functions): its session's ttl while
    bound to one (a heartbeat moves its expiry and writes no event); else the
    span from its latest granting event (acquire, renewal, claim: written in the
    grant's own transaction, with the expiry it set) to that expiry; else, with
    no such event left (pruned from the audit), from when it was acquired to its
    expiry, which is exact until its first renewal. A probe per grant: read for
    the rows of a page, and for the few rows an expiry range leaves
    (``state.state_condition``)."""
    bound = (
        select(sessions.c.ttl)
        .where(sessions.c.id == grant.session_id)
        .scalar_subquery()
    )
    latest = _latest_granting_event(
        grant, seconds_between(events.c.occurred_at, events.c.expires_at)
    )
    return func.coalesce(
        bound, latest, seconds_between(grant.acquired_at, grant.expires_at)
    )


def last_granted(grant):
    """When ``grant`` (as for ``granted_ttl``) was last granted or renewed: its
    latest granting event's time, or when it was acquired (no event left). A
    session's heartbeats are not among them: they write no event."""
    return func.coalesce(
        _latest_granting_event(grant, events.c.occurred_at), grant.acquired_at
    )


# The sources, built once: a statement reading the holders binds LISTED_AT.
LISTED_AT = "listed_at"
_listed_at = bindparam(LISTED_AT, type_=UTCDateTime())
EXCLUSIVE_SOURCE = exclusive_grants()
HOLDER_GRANTS_SOURCE = holder_grants(_listed_at)
HOLDER_HELD_SOURCE = holder_held_resources(_listed_at)
