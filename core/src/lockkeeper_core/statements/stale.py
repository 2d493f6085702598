"""The operator's sweeps of stale locks, in batches: force-release the expired
grants a prefix or an owner names (``release_stale_batch``), and purge the rows
that ended before a cutoff (``purge_stale_batch``), each batch one transaction
that locks its rows in resource order (the lock order)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Row, and_, delete, exists, func, insert, or_, select

from lockkeeper_core.models import EXCLUSIVE
from lockkeeper_core.state import Action
from lockkeeper_core.statements import listing
from lockkeeper_core.statements.common import (
    LockRow,
    StaleBatch,
    clear_exclusive_grant,
    delete_where_in,
    events,
    holders,
    locks,
    through_names,
    token_or_none,
    waiters,
)
from lockkeeper_core.statements.details import ended_bound_grant

_INSERT_EVENT = insert(events)


class StaleStatements:
    """Part of ``TransactionalStatements``: its clock (``clock_after_lock``,
    ``_server_now``) decides what is stale once the rows are locked."""

    def release_stale_batch(
        self, conn, prefix, owner, actor, reason, now, batch: int, owner_contains=None
    ) -> StaleBatch:
        """Force-release up to ``batch`` stale locks matching ``prefix``/``owner``
        (and owners containing ``owner_contains``, as the overview searches):
        a plain read finds the candidates, which are then locked by name in
        resource order and read again (the lock order, ``through_names``); the
        clock read after that lock decides which are still stale.

        Locked by the statement that found them, they were locked in the order
        of the index it scanned: MariaDB finds stale rows through (expires_at,
        resource) and sorts them after locking them, so a batch took its rows
        in expiry order, and a path that takes several in resource order (a
        set's acquire, a purge) could hold one it waited for while waiting for
        one it held: a deadlock.
        """

        def matching(query):
            query = query.where(locks.c.owner.is_not(None))
            if prefix:
                query = query.where(
                    locks.c.resource.startswith(prefix, autoescape=True),
                    func.substr(locks.c.resource, 1, len(prefix)) == prefix,
                )
            if owner is not None:
                query = query.where(locks.c.owner == owner)
            if owner_contains:
                query = query.where(listing.owner_contains(owner_contains))
            return query

        names = conn.scalars(
            matching(select(locks.c.resource))
            .where(
                locks.c.expires_at <= (now if now is not None else self._server_now())
            )
            .order_by(locks.c.resource)
            .limit(batch)
        ).all()
        candidates = (
            conn.execute(
                through_names(
                    matching(select(locks))
                    .where(locks.c.resource.in_(names))
                    .order_by(locks.c.resource)
                    .with_for_update()
                )
            ).all()
            if names
            else []
        )
        now = self.clock_after_lock(conn, now).now
        stale = [row for row in candidates if row.expires_at <= now]
        if stale:
            conn.execute(clear_exclusive_grant([row.id for row in stale], now))
            conn.execute(
                _INSERT_EVENT,
                [
                    {
                        "resource": row.resource,
                        "action": Action.FORCE_RELEASED.value,
                        "owner": row.owner,
                        "previous_owner": row.owner,
                        "token": token_or_none(row.token),
                        "fence": row.fence,
                        "acquired_at": row.acquired_at,
                        "expires_at": now,
                        "actor": actor,
                        "reason": reason,
                        "occurred_at": now,
                        "mode": EXCLUSIVE,
                        "details": ended_bound_grant(
                            None, row.session_id, row.expires_at
                        ),
                    }
                    for row in stale
                ],
            )
        released = [LockRow.of(row, expires_at=now) for row in stale]
        # A row renewed or granted again between the look and the lock stays,
        # and is not found again: a batch that found ``batch`` names was full.
        return StaleBatch(len(names), released, now)

    def purge_stale_batch(
        self, conn, cutoff: datetime, batch: int
    ) -> tuple[int, list[Row]]:
        """Delete up to ``batch`` rows that expired (or were released) at or before
        ``cutoff``; returns how many the plain read found (fewer than ``batch``:
        the last batch) and the (resource, owner) of those deleted, owner None
        for free rows.

        The rows are locked first, so a row re-acquired meanwhile is not taken:
        the oldest ``batch`` are found by a plain read, then locked by name and
        read again, in resource order through the names' unique index (the
        lock order, ``through_names``), as every locking read of a lock's row
        takes it: its name's index entry, then the row. Locked by primary key,
        the rows came first and their entries after (the delete marks them),
        while an acquire of one of them held its entry and waited for its row:
        a deadlock on MariaDB. Holding both, the delete by primary key waits
        for nothing more.
        """
        oldest = conn.scalars(
            select(locks.c.resource)
            .where(self.purgeable(cutoff))
            .order_by(locks.c.expires_at)
            .limit(batch)
        ).all()
        if not oldest:
            return 0, []
        candidates = conn.execute(
            through_names(
                select(locks.c.id, locks.c.resource, locks.c.owner)
                .where(locks.c.resource.in_(sorted(oldest)), self.purgeable(cutoff))
                .order_by(locks.c.resource)
                .with_for_update()
            )
        ).all()
        self.delete_purged(conn, candidates)
        return len(oldest), candidates

    @staticmethod
    def purgeable(cutoff: datetime):
        """The rows a purge at ``cutoff`` deletes: expired (or released) by
        then. A row held by holders stays until they have all ended: without
        it the next exclusive grant would insert a row that knows none of
        them. A row with a place in its line live at the cutoff stays too:
        a first acquire of a resource with no row inserts one and counts no
        line, so it would go ahead of that place (a set rejoining its lines
        for longer than the purge's age keeps the free rows made for it at
        its first request)."""
        return and_(
            locks.c.expires_at <= cutoff,
            or_(locks.c.places_until.is_(None), locks.c.places_until <= cutoff),
            ~exists().where(
                waiters.c.resource == locks.c.resource, waiters.c.deadline > cutoff
            ),
        )

    @staticmethod
    def sweep_lapsed_places(conn, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` places in line whose deadline passed by
        ``cutoff``; how many the plain read found (fewer than ``batch``: the
        last batch). Left by requests that never came back (a set's kept
        places, its client gone; an app instance that died), they were swept
        only by a later single join of the same line: a line never joined
        again kept them for good. One primary-key delete each, its deadline
        read again, on ``conn``'s autocommit: it holds one place at a time, so
        it waits in no cycle with a set's join (which locks several)."""
        lapsed = conn.scalars(
            select(waiters.c.id)
            .where(waiters.c.deadline <= cutoff)
            .order_by(waiters.c.id)
            .limit(batch)
        ).all()
        for place in lapsed:
            conn.execute(
                delete(waiters).where(
                    waiters.c.id == place, waiters.c.deadline <= cutoff
                )
            )
        return len(lapsed)

    @staticmethod
    def delete_purged(conn, rows) -> None:
        """Delete ``rows`` (locked, ``purgeable``) and their holders, which all
        ended by the cutoff too."""
        if rows:
            delete_where_in(conn, locks.c.id, [r.id for r in rows])
            delete_where_in(conn, holders.c.resource, [r.resource for r in rows])
