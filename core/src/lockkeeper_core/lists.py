"""Paged lists of locks: keyset cursors or numbered pages, in every order the
overview offers, over the exclusive grants and the holders.

Each source's page is read in the order of its indexes and limited before the
pages are merged: no sort of every lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, func, literal, select, union_all

from lockkeeper_core import validation
from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.core import LockCore
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.filters import (
    ENTRIES_EXCLUSIVE,
    ENTRIES_RESOURCES,
    SOURCES,
    filtered,
    list_filters,
)
from lockkeeper_core.pagination import (
    DEFAULT_PAGE,
    after,
    encode_cursor,
    page_limit_error,
    read_cursor,
)
from lockkeeper_core.results import Lock, Page
from lockkeeper_core.state import LockState
from lockkeeper_core.statements import listing
from lockkeeper_core.statements.common import queue_columns


class Lists:
    def __init__(self, core: LockCore) -> None:
        self.core = core

    def _filtered(self, query, source, now: datetime, **filters):
        return filtered(
            query, source, now, self.core.settings.expiring_within, **filters
        )

    def list_locks(
        self,
        *,
        state: LockState | str | None = None,
        prefix: str | None = None,
        owner: str | None = None,
        limit: int = DEFAULT_PAGE,
        cursor: str | None = None,
        scope: tuple[str, ...] | None = None,
        owner_contains: str | None = None,
        sort: str = "resource",
        contended: bool = False,
        offset: int | None = None,
        entries: str = ENTRIES_EXCLUSIVE,
        at: datetime | None = None,
    ) -> Page[Lock]:
        """Locks a page at a time, ordered by ``sort`` (a key of ``SORT_KEYS``,
        ``-`` first for descending; ties by resource, then fence) with a keyset
        cursor, or from ``offset`` (numbered pages; no cursor then);
        ``scope``: the asking token's prefixes, outside which nothing is listed;
        ``owner_contains``: owners containing this text, ignoring case (any
        holder's, for a resource held by holders); ``contended``: only locks
        with a live waiter; ``entries``: what one entry is (``filters.SOURCES``);
        ``at``: the instant to judge the locks at (``_read_at``)."""
        errors = []
        descending = sort.startswith("-")
        sort_key = sort.removeprefix("-")
        if sort_key not in SORT_KEYS:
            errors.append(("sort", "must be one of " + ", ".join(SORT_KEYS)))
            sort_key = "resource"
        state, filter_errors = list_filters(state, prefix, owner, owner_contains)
        errors += filter_errors
        limit_error = page_limit_error(limit)
        if limit_error:
            errors.append(("limit", limit_error))
        if offset is not None and (
            isinstance(offset, bool) or not isinstance(offset, int) or offset < 0
        ):
            errors.append(("offset", "must be a whole number, 0 or more"))
        now = self.core.read_at(at)
        position = None
        if cursor is not None:
            try:
                position = read_cursor(cursor, lambda p: _read_position(sort_key, p))
            except ValueError as exc:
                errors.append(("cursor", str(exc)))
        if errors:
            raise InvalidInput(errors)

        # The urgent order ranks by the instant of the first page, so that the
        # pages after it continue the same order while time moves on.
        ranked_at = position["at"] if position and "at" in position else now
        waiting_counts = listing.waiter_counts(literal(now, UTCDateTime()))
        filters = {
            "state": state,
            "prefix": prefix,
            "owner": owner,
            "owner_contains": owner_contains,
            "scope": scope,
            "contended": contended,
        }
        # Each source's page is chosen on its own (in the order of its
        # indexes, limited first), then the pages are merged: no sort of every
        # lock. The rows' waiters are counted only then: a count in the ordered
        # select is one probe of the line per lock sorted (100,000 of them),
        # not per lock shown.
        fetch = limit + 1 if offset is None else offset + limit
        page = PageAsked(position, descending, fetch)
        branches = []
        for source in SOURCES[entries]:
            if sort_key == "urgent":
                branches += self._urgent_branches(source, now, ranked_at, filters, page)
            elif sort_key == "waiters":
                branches += self._waiters_branches(
                    source, now, waiting_counts, filters, page
                )
            else:
                order = _order(sort_key, source)
                branches.append(self._one_range(source, order, now, filters, page))
        merged = union_all(*branches).subquery("merged")
        keys = [c for c in merged.c if c.name.startswith("sort_")]
        query = select(merged).order_by(
            *(c.desc() if descending else c.asc() for c in keys),
            merged.c.fence.desc() if descending else merged.c.fence.asc(),
        )
        if offset is not None:
            query = query.offset(offset).limit(limit)
        else:
            query = query.limit(limit + 1)
        chosen = query.subquery("chosen")
        at = literal(now, UTCDateTime())
        waiting, _ = queue_columns(chosen.c.resource, at)
        held_now = case(
            (
                chosen.c.from_holders == 1,
                listing.live_holder_count(chosen.c.resource, at),
            ),
            else_=1,
        ).label("holders")
        bound = listing.bound_session(
            chosen.c.session_id, chosen.c.owner, chosen.c.token, chosen.c.expires_at
        ).label("session")
        ttl = listing.granted_ttl(chosen.c).label(listing.GRANTED_TTL)
        shown = select(chosen, waiting, held_now, bound, ttl).order_by(
            *(
                chosen.c[key.name].desc() if descending else chosen.c[key.name].asc()
                for key in keys
            ),
            chosen.c.fence.desc() if descending else chosen.c.fence.asc(),
        )

        def position_of(row) -> dict[str, Any]:
            found: dict[str, Any] = {"resource": row.resource, "fence": row.fence}
            if sort_key == "urgent":
                found["at"] = ranked_at.isoformat()
                found["key"] = [row.sort_0, row.expires_at.isoformat()]
            elif sort_key == "waiters":
                found["key"] = row.sort_0
            elif sort_key not in ("resource", "natural"):
                value = getattr(row, SORT_KEYS[sort_key])
                found["key"] = (
                    value.isoformat() if isinstance(value, datetime) else value
                )
            return found

        with self.core.reads.connect() as conn:
            rows = conn.execute(shown, {listing.LISTED_AT: now}).all()
        next_cursor = None
        if offset is None and len(rows) > limit:
            rows = rows[:limit]
            next_cursor = encode_cursor(position_of(rows[-1]))
        items = [self.core.lock(row, now) for row in rows]
        return Page(items, next_cursor)

    def _one_range(
        self,
        source,
        order: list[Any],
        now: datetime,
        filters: dict[str, Any],
        page: PageAsked,
        joined=None,
    ):
        """``source``'s page in ``order`` (``joined``: read from that join of
        it): an index range of the exclusive grants (the unique resource
        last), or a few holders (ordered by their fence after it too)."""
        keys = [column.label(f"sort_{n}") for n, column in enumerate(order)]
        query = select(source, *keys)
        if joined is not None:
            query = query.select_from(joined)
        query = self._filtered(query, source, now, **filters)
        if page.position is not None:
            query = query.where(page.after(order, source))
        by = page.ordered(order, source)
        return select(query.order_by(*by).limit(page.fetch).subquery())

    def _urgent_branches(
        self,
        source,
        now: datetime,
        ranked_at: datetime,
        filters: dict[str, Any],
        page: PageAsked,
    ) -> list[Any]:
        """The urgent order's page of ``source`` as three index ranges, one per
        rank (contended; live, by expiry; stale, by expiry), each ordered by
        (expires_at, resource) as ``ix_distributed_locks_expires_at_resource``
        is, and limited before they are merged: no sort of every lock."""
        at = literal(ranked_at, UTCDateTime())
        contended_now = listing.is_contended(at, source.c.resource)
        expires_at = source.c.expires_at
        ranks = {
            URGENT_CONTENDED: contended_now,
            URGENT_LIVE: and_(~contended_now, expires_at > at),
            URGENT_STALE: and_(~contended_now, expires_at <= at),
        }
        if listing.only_live(source):
            # A few live holders: one range, ranked as it is read (never stale).
            rank = case((contended_now, URGENT_CONTENDED), else_=URGENT_LIVE)
            order = [rank, expires_at, source.c.resource]
            return [self._one_range(source, order, now, filters, page)]
        within_rank = [expires_at, source.c.resource]
        branches = []
        for rank, condition in ranks.items():
            query = select(
                source,
                literal(rank).label("sort_0"),
                expires_at.label("sort_1"),
                source.c.resource.label("sort_2"),
            ).where(condition)
            query = self._filtered(query, source, now, **filters)
            fetch: Any = page.fetch
            if rank == URGENT_STALE and page.position is None and not page.descending:
                fetch = self._stale_fetch(source, at, now, filters, page)
            if page.position is not None:
                at_rank, *rest = page.position["values"]
                if (rank < at_rank) != page.descending and rank != at_rank:
                    continue  # a rank the cursor is past
                if rank == at_rank:
                    query = query.where(page.after(within_rank, source, rest))
            order = page.ordered(within_rank, source)
            branches.append(select(query.order_by(*order).limit(fetch).subquery()))
        return branches

    def _stale_fetch(
        self,
        source,
        at,
        now: datetime,
        filters: dict[str, Any],
        page: PageAsked,
    ):
        """How many stale entries of ``source`` a page from the first (by
        offset, urgent first) reads: none when its live entries alone (the
        ranks before the stale one) fill the ``page.fetch`` rows, else
        ``page.fetch``. A deep page (``?page=40``) then skips its offset's
        worth of stale locks it would only drop. The limit is a scalar
        subquery, read once before the range (a PostgreSQL init plan; SQLite
        evaluates LIMIT first), over at most ``page.fetch`` entries of the
        expiry index. MariaDB takes only a number there: it reads the stale
        rank as before. Only for an unfiltered list: a name, owner or
        contended filter would make the count probe the live range row by row
        for its few matches (more than the stale rows it saves), and a state
        leaves one of the two ranges empty, found at no cost without it."""
        if self.core.dialect not in ("sqlite", "postgresql") or any(filters.values()):
            return page.fetch
        live = self._filtered(
            select(source.c.resource).where(source.c.expires_at > at),
            source,
            now,
            **filters,
        ).limit(page.fetch)
        counted = select(func.count()).select_from(live.subquery("live_first"))
        return case((counted.scalar_subquery() >= page.fetch, 0), else_=page.fetch)

    def _waiters_branches(
        self,
        source,
        now: datetime,
        waiting_counts,
        filters: dict[str, Any],
        page: PageAsked,
    ) -> list[Any]:
        """The waiters order's page of ``source`` as two parts: the few locks
        with waiters (joined to their counts) and the rest (no waiters), read
        in the resource index's order, each limited to the page first."""
        waiting = waiting_counts.c.waiting
        resource = source.c.resource
        if listing.only_live(source):
            # A few live holders: one range, their counts joined as they are read.
            order = [func.coalesce(waiting, 0), resource]
            joined = source.outerjoin(
                waiting_counts, waiting_counts.c.resource == resource
            )
            return [self._one_range(source, order, now, filters, page, joined)]
        waited = select(
            source, waiting.label("sort_0"), resource.label("sort_1")
        ).select_from(
            source.join(waiting_counts, waiting_counts.c.resource == resource)
        )
        alone = select(source, literal(0).label("sort_0"), resource.label("sort_1"))
        alone = alone.where(resource.not_in(select(waiting_counts.c.resource)))
        parts = []
        for part, count in ((waited, waiting), (alone, None)):
            query = self._filtered(part, source, now, **filters)
            order = [count, resource] if count is not None else [resource]
            if page.position is not None:
                at_count, at_resource = page.position["values"]
                if count is None:
                    if at_count != 0 and (at_count > 0) != page.descending:
                        continue  # past every lock without waiters
                    if at_count == 0:
                        query = query.where(page.after(order, source, [at_resource]))
                else:
                    query = query.where(page.after(order, source))
            by = page.ordered(order, source)
            parts.append(select(query.order_by(*by).limit(page.fetch).subquery()))
        return parts

    def count_locks(
        self,
        *,
        state: LockState | str | None = None,
        prefix: str | None = None,
        owner_contains: str | None = None,
        contended: bool = False,
    ) -> int:
        """How many locks ``list_locks`` with these filters would list in all,
        one per resource (the count behind the overview's numbered pages)."""
        state, errors = list_filters(state, prefix, None, owner_contains)
        if errors:
            raise InvalidInput(errors)
        now = self.core.now()
        counts = [
            self._filtered(
                select(func.count()).select_from(source),
                source,
                now,
                state=state,
                prefix=prefix,
                owner_contains=owner_contains,
                contended=contended,
            ).scalar_subquery()
            for source in SOURCES[ENTRIES_RESOURCES]
        ]
        exclusive, from_holders = counts
        with self.core.reads.connect() as conn:
            return conn.scalar(
                select(exclusive + from_holders), {listing.LISTED_AT: now}
            )


# The orders the lock list offers, each by a grant column's name: remaining
# time and "stale since" are both the expiry (ascending: the least time left, or
# the longest stale, first). The waiters and urgent orders have pages of their
# own (``_waiters_branches``, ``_urgent_branches``).
SORT_KEYS = {
    "resource": "resource",
    "natural": "resource",
    "owner": "owner",
    "acquired": "acquired_at",
    "expires": "expires_at",
    "waiters": None,
    "urgent": None,
}
# The urgent order's ranks: contended first, then live locks by the time they
# have left (expiring ones come first there), stale ones last.
URGENT_CONTENDED, URGENT_LIVE, URGENT_STALE = 0, 1, 2


def _order(sort_key: str, source) -> list[Any]:
    """The SQL expressions a plain sort orders ``source`` by, its resource last."""
    if sort_key == "resource":
        return [source.c.resource]
    if sort_key == "natural":
        return listing.natural_order(source.c.resource)
    return [source.c[SORT_KEYS[sort_key]], source.c.resource]


@dataclass(frozen=True, slots=True)
class PageAsked:
    """The page a list asks each source for: after ``position`` (a cursor's,
    or None), in which direction, and how many rows (``fetch``)."""

    position: dict[str, Any] | None
    descending: bool
    fetch: int

    def after(self, order: list[Any], source, values: list[Any] | None = None):
        """``source``'s entries strictly after the position in ``order`` (the
        position's values, or ``values``), then by fence: a resource's holders
        are entries of their own."""
        assert self.position is not None
        values = self.position["values"] if values is None else values
        return after(
            [*order, source.c.fence],
            [*values, self.position["fence"]],
            descending=self.descending,
        )

    def ordered(self, order: list[Any], source) -> list[Any]:
        """``order`` in the page's direction, by fence last where a resource
        may have several entries (the exclusive grants are one per resource:
        their order stays that of their indexes)."""
        if not listing.one_per_resource(source):
            order = [*order, source.c.fence]
        return [c.desc() if self.descending else c.asc() for c in order]


def _read_position(sort_key: str, position: dict[str, Any]) -> dict[str, Any]:
    """A cursor's position, checked (client input), as the values of
    ``_order`` and, for the urgent order, the instant it ranks by."""
    resource, fence = position["resource"], position["fence"]
    if validation.resource_error(resource):
        raise ValueError(resource)
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 < fence < 2**63:
        raise ValueError("bad cursor")
    return {"fence": fence, **_read_values(sort_key, resource, position)}


def _read_values(sort_key: str, resource: str, position: dict[str, Any]):
    if sort_key == "resource":
        return {"values": [resource]}
    if sort_key == "natural":
        return {"values": listing.natural_position(resource)}
    raw = position["key"]
    if sort_key == "waiters":
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ValueError("bad cursor")
        return {"values": [raw, resource]}
    if sort_key == "urgent":
        rank, expires = raw
        if rank not in (URGENT_CONTENDED, URGENT_LIVE, URGENT_STALE) or isinstance(
            rank, bool
        ):
            raise ValueError("bad cursor")
        return {
            "values": [rank, _instant(expires), resource],
            "at": _instant(position["at"]),
        }
    return {"values": [_sort_value(sort_key, raw), resource]}


def _instant(raw: Any) -> datetime:
    """A cursor's instant back as an aware UTC datetime (client input)."""
    if not isinstance(raw, str):
        raise ValueError("bad cursor")
    value = datetime.fromisoformat(raw)
    if value.tzinfo is None:
        raise ValueError("bad cursor")
    try:
        # 0001-01-01T00:00:00+14:00 is before the first instant in UTC.
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("bad cursor") from None


def _sort_value(key: str, raw: Any) -> Any:
    """A cursor's sort value back as the column's type (client input: checked)."""
    if key in ("acquired", "expires"):
        return _instant(raw)
    if not isinstance(raw, str) or validation.name_error(raw):
        raise ValueError("bad cursor")
    return raw
