"""Aggregate counts of locks: per state, per owner, per next prefix, the holders
of semaphores; each one statement over the same sources and filters as the
lists (``lockkeeper_core.filters``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, literal, select, union_all

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.core import LockCore
from lockkeeper_core.filters import (
    ENTRIES_GRANTS,
    ENTRIES_RESOURCES,
    SOURCES,
    filtered,
    state_counts,
    state_of,
    validate_filters,
)
from lockkeeper_core.models import EXCLUSIVE, SHARED
from lockkeeper_core.state import LockState
from lockkeeper_core.statements import listing
from lockkeeper_core.statements.common import holders, locks


class Counts:
    def __init__(self, core: LockCore) -> None:
        self.core = core
        self._expiring = core.settings.expiring_within

    def _filtered(self, query, source, now: datetime, **filters):
        return filtered(query, source, now, self._expiring, **filters)

    def _grouped_counts(
        self,
        entries: str,
        group,
        prefix,
        owner_contains,
        at: datetime | None = None,
        contended: bool = False,
    ) -> list:
        """(name, held, expiring, stale) over ``entries`` (``filters.SOURCES``) per
        ``group`` (a function of a source's columns), the sources' counts of
        one name summed; ``group`` None: one row named ``""``, every entry;
        ``contended``: and how many of them have a live waiter, last, counted
        in the same pass (each source, the holder-held window above all, is
        evaluated once for both)."""
        now = self.core.read_at(at)
        waited = []
        parts = []
        everywhere = group is None and not prefix and not owner_contains
        for source in SOURCES[entries]:
            if everywhere and source is listing.EXCLUSIVE_SOURCE:
                parts.append(self._exclusive_totals(now, contended))
                continue
            column = literal("") if group is None else group(source)
            if contended:
                waited_for = listing.is_contended(
                    literal(now, UTCDateTime()), source.c.resource
                )
                waited = [func.count(case((waited_for, 1))).label("contended")]
            query = self._filtered(
                select(
                    column.label("name"),
                    *state_counts(now, self._expiring, source.c),
                    *waited,
                ),
                source,
                now,
                prefix=prefix,
                owner_contains=owner_contains,
            )
            parts.append(query if group is None else query.group_by(column))
        with self.core.reads.connect() as conn:
            rows = conn.execute(union_all(*parts), {listing.LISTED_AT: now}).all()
        summed: dict[Any, list[int]] = {}
        for name, *numbers in rows:
            total = summed.setdefault(name, [0] * len(numbers))
            for n, number in enumerate(numbers):
                total[n] += number
        return [(name, *numbers) for name, numbers in summed.items()]

    def _exclusive_totals(self, now: datetime, contended: bool):
        """The row of ``_grouped_counts`` for every exclusive grant, counted
        judging only the few near their expiry. A grant is a row with an owner:
        the rows of a range less the free rows in it (``owner`` NULL, their
        release time as expiry), each an index-only count (the range in
        ``ix_distributed_locks_expires_at_resource``, the free rows in
        ``ix_distributed_locks_owner_expires_at``). The live grants are a
        range of expiries; the expiring ones are the grants of a short range
        judged against their own ttl (a probe each, of that range only); held is
        the live ones less them; stale is every grant less the live ones, as a
        count of a whole table tests nothing per row and the stale range is the
        largest. docs/benchmarks-audit.md has the A/B and the plans.
        ``contended``: the grants with a live waiter, found from the few
        waited-for resources."""

        def owned(*conditions):
            every = select(func.count()).select_from(locks).where(*conditions)
            free = every.where(locks.c.owner.is_(None))
            return every.scalar_subquery() - free.scalar_subquery()

        expiring = (
            select(func.count())
            .select_from(locks)
            .where(
                locks.c.owner.is_not(None),
                state_of(LockState.EXPIRING, now, self._expiring),
            )
            .scalar_subquery()
        )
        ranges = [
            owned(locks.c.expires_at > now).label("live"),
            expiring.label("expiring"),
            owned().label("grants"),
        ]
        if contended:
            waited_for = listing.is_contended(literal(now, UTCDateTime()))
            ranges.append(
                select(func.count())
                .select_from(locks)
                .where(locks.c.owner.is_not(None), waited_for)
                .scalar_subquery()
                .label("contended")
            )
        # Held and stale from the counts already made. A materialized CTE,
        # as PostgreSQL would merge a derived table into the select and
        # evaluate each count once per reference.
        counted = (
            select(*ranges)
            .cte("exclusive_ranges")
            .prefix_with("MATERIALIZED", dialect="postgresql")
            .prefix_with("MATERIALIZED", dialect="sqlite")
        )
        return select(
            literal("").label("name"),
            # In the order of LockState, as state_counts.
            (counted.c.live - counted.c.expiring).label("held"),
            counted.c.expiring,
            (counted.c.grants - counted.c.live).label("stale"),
            *([counted.c.contended] if contended else []),
        )

    def owner_counts(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> list[OwnerCounts]:
        """Each owner of a grant with how many it holds in each state (each
        holder or shared grant counts for its own owner), most stale first (what
        needs attention), then most locks; ``owner_contains``: only owners
        containing it, as ``list_locks`` matches them."""
        validate_filters(prefix, None, owner_contains)
        rows = self._grouped_counts(
            ENTRIES_GRANTS, lambda source: source.c.owner, prefix, owner_contains, at
        )
        return sorted((OwnerCounts(*row) for row in rows), key=_attention_order)

    def last_seen(
        self, owners: Collection[str], at: datetime | None = None
    ) -> dict[str, datetime]:
        """When each of ``owners`` was last seen by the service: the latest
        instant one of its grants (live or stale) was granted or renewed
        (``listing.last_granted``), or one of its sessions heartbeated; an
        owner with neither is absent. For a page of "By host" groups: a probe
        per grant of the owners asked, not a scan of their events."""
        owners = sorted(set(owners))
        if not owners:
            return {}
        now = self.core.read_at(at)
        parts = [
            select(
                source.c.owner,
                func.max(listing.last_granted(source.c)).label("seen"),
            )
            .where(source.c.owner.in_(owners))
            .group_by(source.c.owner)
            for source in SOURCES[ENTRIES_GRANTS]
        ]
        beats = select(
            listing.sessions.c.owner,
            listing.sessions.c.expires_at,
            listing.sessions.c.ttl,
        ).where(listing.sessions.c.owner.in_(owners))
        with self.core.reads.connect() as conn:
            granted = conn.execute(union_all(*parts), {listing.LISTED_AT: now}).all()
            heartbeats = conn.execute(beats).all()
        seen: dict[str, datetime] = {}

        def saw(owner: str, instant: datetime | None) -> None:
            if instant is not None and (owner not in seen or instant > seen[owner]):
                seen[owner] = instant

        for owner, instant in granted:
            saw(owner, instant)
        for owner, expires_at, ttl in heartbeats:
            # A session's expiry is its last heartbeat plus its ttl.
            saw(owner, expires_at - timedelta(seconds=ttl))
        return seen

    def prefix_counts(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> list[OwnerCounts]:
        """The locks under ``prefix`` (one per resource) grouped by their next
        prefix (up to the next ``:``, ``listing.next_prefix``), with how many
        are in each state, most stale first, then most locks; names with no
        ``:`` after ``prefix`` are one group named ``""`` (last among equals)."""
        validate_filters(prefix, None, owner_contains)
        rows = self._grouped_counts(
            ENTRIES_RESOURCES,
            lambda source: listing.next_prefix(prefix or "", source.c.resource),
            prefix,
            owner_contains,
            at,
        )
        groups = [OwnerCounts(name or "", *numbers) for name, *numbers in rows]
        return sorted(groups, key=_prefix_order)

    def grouped_with_counts(
        self,
        group: str,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> tuple[list[OwnerCounts], dict[LockState, int], int]:
        """``owner_counts`` (``group`` "owner") or ``prefix_counts`` ("prefix")
        with the ``counts_and_contended`` of the same search, from one
        statement: a grouped page shows both, and read apart the exclusive
        grants (nearly every lock) were read twice. Each exclusive grant is one
        resource, so their groups summed are their totals; holders are grouped
        per grant by owner but count once per resource in the totals, so
        there the holder-held resources are counted on their own as well."""
        validate_filters(prefix, None, owner_contains)
        now = self.core.read_at(at)
        by_prefix = group == "prefix"
        grouped_holders = (
            listing.HOLDER_HELD_SOURCE if by_prefix else listing.HOLDER_GRANTS_SOURCE
        )
        at_now = literal(now, UTCDateTime())

        def counted(part: int, source, grouped: bool, contended: bool):
            """The part's (number, name, held, expiring, stale, contended)."""
            name = (
                listing.next_prefix(prefix or "", source.c.resource)
                if by_prefix
                else source.c.owner
            )
            column = name if grouped else literal("")
            waited = func.count(
                case((listing.is_contended(at_now, source.c.resource), 1))
            )
            query = self._filtered(
                select(
                    column.label("name"),
                    *state_counts(now, self._expiring, source.c),
                    *([waited.label("contended")] if contended else []),
                ),
                source,
                now,
                prefix=prefix,
                owner_contains=owner_contains,
            )
            # The part's number (and a contended count not made) outside the
            # aggregate: a wider row made PostgreSQL sort 100 000 rows on disk
            # instead of hashing them (it guesses a group per row).
            rows = (query.group_by(column) if grouped else query).subquery()
            return select(
                literal(part).label("part"),
                *rows.c,
                *([] if contended else [literal(0).label("contended")]),
            )

        def contended_grants(part: int):
            """The exclusive grants with a live waiter: found from the few
            waited-for resources, not tested on every grant."""
            query = self._filtered(
                select(func.count().label("contended")),
                listing.EXCLUSIVE_SOURCE,
                now,
                prefix=prefix,
                owner_contains=owner_contains,
                contended=True,
            ).subquery()
            zero = literal(0)
            return select(
                literal(part).label("part"),
                literal("").label("name"),
                *(zero.label(state.value) for state in LockState),
                query.c.contended,
            )

        exclusive, holder_rows, holder_held, waited_for = 0, 1, 2, 3
        parts = [
            counted(exclusive, listing.EXCLUSIVE_SOURCE, grouped=True, contended=False),
            counted(holder_rows, grouped_holders, grouped=True, contended=by_prefix),
            contended_grants(waited_for),
        ]
        # The totals count each resource once: the exclusive grants and the
        # holder-held resources (grouped already when grouped per resource).
        in_totals = {exclusive, waited_for, holder_rows if by_prefix else holder_held}
        if not by_prefix:
            parts.append(
                counted(
                    holder_held,
                    listing.HOLDER_HELD_SOURCE,
                    grouped=False,
                    contended=True,
                )
            )
        with self.core.reads.connect() as conn:
            rows = conn.execute(union_all(*parts), {listing.LISTED_AT: now}).all()
        groups: dict[str, list[int]] = {}
        totals = [0] * len(LockState)
        contended = 0
        for part, name, *numbers, waited in rows:
            if part in (exclusive, holder_rows):
                summed = groups.setdefault(name or "", [0] * len(LockState))
                for n, number in enumerate(numbers):
                    summed[n] += number
            if part in in_totals:
                totals = [t + n for t, n in zip(totals, numbers, strict=True)]
                contended += waited
        found = [OwnerCounts(name, *numbers) for name, numbers in groups.items()]
        return (
            sorted(found, key=_prefix_order if by_prefix else _attention_order),
            dict(zip(LockState, totals, strict=True)),
            contended,
        )

    def holders_counts(self) -> HoldersCounts:
        """The live holders of semaphores now, against the limits of the
        semaphores that have any, and the live shared grants."""
        now = self.core.now()
        live = holders.c.expires_at > now
        used = (
            select(func.count())
            .where(live, holders.c.mode == EXCLUSIVE)
            .scalar_subquery()
        )
        shared = (
            select(func.count()).where(live, holders.c.mode == SHARED).scalar_subquery()
        )
        limits = (
            select(func.coalesce(func.sum(locks.c.holder_limit), 0))
            .where(
                locks.c.holder_limit > 1,
                select(holders.c.id)
                .where(holders.c.resource == locks.c.resource, live)
                .exists(),
            )
            .scalar_subquery()
        )
        with self.core.reads.connect() as conn:
            row = conn.execute(
                select(
                    used.label("used"), limits.label("limit"), shared.label("shared")
                )
            ).one()
        return HoldersCounts(row.used, int(row.limit), row.shared)

    def counts(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> dict[LockState, int]:
        """How many locks are in each state right now, one per resource (a
        resource held by holders in the state of its grant that ends first);
        ``prefix`` and ``owner_contains`` narrow them as ``list_locks`` does."""
        validate_filters(prefix, None, owner_contains)
        ((_, *found),) = self._grouped_counts(
            ENTRIES_RESOURCES, None, prefix, owner_contains, at
        )
        return dict(zip(LockState, found, strict=True))

    def counts_and_contended(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> tuple[dict[LockState, int], int]:
        """``counts`` and, of the same locks, how many have a live waiter (what
        ``count_locks(contended=True)`` counts), in one statement: a page
        showing both reads every lock and the holder-held resources once."""
        validate_filters(prefix, None, owner_contains)
        ((_, *found, contended),) = self._grouped_counts(
            ENTRIES_RESOURCES, None, prefix, owner_contains, at, contended=True
        )
        return dict(zip(LockState, found, strict=True)), contended


@dataclass(frozen=True, slots=True)
class HoldersCounts:
    """``used`` live holders of semaphores, of ``limit`` holders in all (the
    limits of the semaphores with a live holder), and ``shared`` live shared
    grants."""

    used: int
    limit: int
    shared: int


@dataclass(frozen=True, slots=True)
class OwnerCounts:
    """Locks per state of one owner (or one host, summed over its owners)."""

    name: str
    held: int
    expiring: int
    stale: int

    @property
    def total(self) -> int:
        return self.held + self.expiring + self.stale


def _attention_order(group: OwnerCounts) -> tuple:
    """Most stale first (what needs attention), then most locks."""
    return (-group.stale, -group.total, group.name)


def _prefix_order(group: OwnerCounts) -> tuple:
    """As ``_attention_order``; the names with no further prefix (``""``)
    last among equals."""
    return (-group.stale, -group.total, not group.name, group.name)
