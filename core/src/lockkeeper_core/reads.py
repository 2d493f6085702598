"""One resource read: its lock, its live grants, a fence checked against them.

Plain reads on the autocommit engine, each judged at one reading of the
deciding clock; nothing here writes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import literal, select

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.core import LockCore, validate_fence
from lockkeeper_core.errors import FenceMismatch, InvalidInput, LockNotFound
from lockkeeper_core.models import EXCLUSIVE, SHARED
from lockkeeper_core.results import Holders, Lock
from lockkeeper_core.state import LockState
from lockkeeper_core.statements import listing
from lockkeeper_core.statements.common import LockRow, holders, locks, queue_columns


class Reads:
    def __init__(self, core: LockCore) -> None:
        self.core = core

    def _now_column(self):
        """The deciding clock for a read: the caller's reading, or the server's."""
        now = self.core.given_now()
        return (
            literal(now, UTCDateTime()) if now is not None else self.core.server_now()
        ).label("now")

    def get(self, resource: str, *, include_stale: bool = False) -> Lock:
        """The lock on ``resource``; :raise LockNotFound: absent (or stale, unless
        ``include_stale``)."""
        core = self.core
        core.validate(resource=resource)
        now_column = self._now_column()
        waiting, _ = queue_columns(locks.c.resource, now_column.element)
        bound = None
        with core.reads.connect() as conn:
            ttl = listing.granted_ttl(locks.c).label(listing.GRANTED_TTL)
            row = conn.execute(
                select(locks, now_column, waiting, ttl).where(
                    locks.c.resource == resource
                )
            ).one_or_none()
            if row is not None and row.session_id is not None and row.owner:
                # A probe only a row with a session id pays: still bound?
                found = core.session_statements.session_of(conn, resource)
                bound = found.id if found is not None else None
            holder_rows = (
                self._live_holders(conn, row)
                if row is not None
                and row.places_until is not None
                and row.places_until > row.now
                else []
            )
        if holder_rows:
            # Held by holders: the one that ends first.
            return holder_rows[0]
        if row is None or row.owner is None:
            raise LockNotFound(resource)
        lock = core.lock(row, row.now)
        if bound is not None:
            lock = dataclasses.replace(lock, session=bound)
        if lock.state is LockState.STALE and not include_stale:
            raise LockNotFound(resource, f"the lock on {resource!r} has expired")
        return lock

    def _live_holders(self, conn, row) -> list[Lock]:
        """The live holders of ``row``'s resource (read with ``row.now``), the
        one that ends first first."""
        bound = listing.bound_session(
            holders.c.session_id,
            holders.c.owner,
            holders.c.token,
            holders.c.expires_at,
        ).label("session")
        ttl = listing.granted_ttl(holders.c).label(listing.GRANTED_TTL)
        found = conn.execute(
            select(holders, bound, ttl)
            .where(holders.c.resource == row.resource, holders.c.expires_at > row.now)
            .order_by(holders.c.expires_at, holders.c.id)
        ).all()
        return [
            dataclasses.replace(
                self.core.lock(
                    LockRow.of(
                        holder,
                        waiters=row.waiters,
                        holder_limit=row.holder_limit,
                        holders=len(found),
                    ),
                    row.now,
                ),
                session=holder.session,
            )
            for holder in found
        ]

    def holders(self, resource: str) -> Holders:
        """Every live grant of ``resource`` (the one that ends first first), its
        limit and mode, and how many wait in line."""
        core = self.core
        core.validate(resource=resource)
        now_column = self._now_column()
        waiting, _ = queue_columns(locks.c.resource, now_column.element)
        bound = listing.bound_session(
            locks.c.session_id, locks.c.owner, locks.c.token, locks.c.expires_at
        ).label("session")
        with core.reads.connect() as conn:
            ttl = listing.granted_ttl(locks.c).label(listing.GRANTED_TTL)
            row = conn.execute(
                select(locks, now_column, waiting, bound, ttl).where(
                    locks.c.resource == resource
                )
            ).one_or_none()
            if row is None:
                return Holders(resource, 1, EXCLUSIVE, [], 0)
            grants = self._live_holders(conn, row)
        if row.owner is not None and row.expires_at > row.now:
            grants = [core.lock(row, row.now)]
        mode = grants[0].mode if grants else EXCLUSIVE
        return Holders(resource, row.holder_limit or 1, mode, grants, row.waiters)

    def check_fence(self, resource: str, fence: Any) -> Lock:
        """The lock on ``resource`` if its valid grant carries ``fence``.

        :raise FenceMismatch: it does not (another grant, an expired one, none).
        """
        self.core.validate(resource=resource)
        validate_fence(fence)
        if fence is None:
            raise InvalidInput([("fence", "is required")])
        try:
            lock = self.get(resource, include_stale=True)
        except LockNotFound:
            raise FenceMismatch(resource, fence, None) from None
        if lock.holders > 1 or lock.mode == SHARED:
            # Any live grant carrying the fence.
            for grant in self.holders(resource).holders:
                if grant.fence == fence:
                    return grant
            raise FenceMismatch(resource, fence, lock)
        if lock.fence != fence or lock.state is LockState.STALE:
            raise FenceMismatch(resource, fence, lock)
        return lock
