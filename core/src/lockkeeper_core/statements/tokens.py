"""A new tenure's look at its API token (``TokenStatements``, part of
``TransactionalStatements``): the token's row locked once the resource's row is
held (the lock order), shared far from the token's quota and for update near
it, and what must follow that lock: the quota's count, and for a fresh tenure
the clock and the fence. MariaDB's hot path makes them one call
(``MariaDBStatements``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Row

from lockkeeper_core.statements.common import Clock


class TokenLook(NamedTuple):
    """A new tenure's look at its token: the quota (``max_locks``, None: none
    or not counted here), whether the token is far from it (its row locked
    shared, and the count held to ``limit``), then what was read after the
    token's row lock: the row (None: no such token), the clock (a fresh
    tenure) or whether ``limit`` is reached (a take-over)."""

    max_locks: int | None
    far: bool
    limit: int | None
    # The locking read took no first look: the call that locks the token's row
    # picks how, and says whether it was shared (``_picks_token_lock_in_call``).
    in_call: bool = False
    row: Any = None
    clock: Clock | None = None
    over_quota: bool = False


class TokenStatements:
    """Part of ``TransactionalStatements``: its token-row reads
    (``_token_rows``), clock (``clock_after_lock``) and quota count
    (``_live_count``)."""

    _token_rows: dict[bool, Any]
    _live_count: Any

    @staticmethod
    def _far(first_look, max_locks: int) -> tuple[bool, int]:
        """Whether the token is so far from its quota that its row lock is shared,
        and the limit the count after that lock is held to.

        Far: its live locks (the locking read's first look) plus ``margin``, the
        server's max_connections, stay below ``max_locks``. Every grant in flight
        holds a server connection, so no set of them, shared or not, can then
        take the token past its quota, as long as each counts again after its
        own lock and stops once it finds itself within ``margin`` of it (the
        limit returned). Nearer than that the row is locked alone: the grant
        waits for every grant of the token in flight and counts after them, one
        at a time, to ``max_locks``.
        """
        margin = int(first_look.margin)
        if max_locks > margin and first_look.live < max_locks - margin:
            return True, max_locks - margin
        return False, max_locks

    def _picks_token_lock_in_call(self, now: datetime | None) -> bool:
        """Whether ``_token_then_clock`` and ``_token_then_count`` pick how the
        token's row is locked, so the locking read takes no first look
        (MariaDB's hot path: its call, told what the token's last grant in
        this process found)."""
        return False

    def _token_then_clock(
        self, conn, token: str, now: datetime | None, quota: TokenLook, *, resource
    ) -> TokenLook:
        """A new tenure's reads under a token, once the resource's row is
        locked: the token's row locked (``_token_row``: for update near the
        quota, else shared), then the clock, the freeze over ``resource``, the
        quota's count and a fence (``clock_after_lock``), which follow that
        lock. ``quota``: the quota (None: none) and what the first look
        found. Two round trips here; MariaDB's hot path makes them one."""
        token_row = self._token_row(
            conn, token, exclusive=quota.max_locks is not None and not quota.far
        )
        clock = self.clock_after_lock(
            conn,
            now,
            fence=True,
            unless_frozen=resource,
            quota_token=token if quota.max_locks else None,
            max_locks=quota.limit if quota.max_locks else None,
        )
        return quota._replace(row=token_row, clock=clock)

    def _token_then_count(
        self, conn, token: str, now: datetime, quota: TokenLook
    ) -> TokenLook:
        """A take-over's token reads: the token's row locked as
        ``_token_then_clock`` locks it, then (under a quota) the count after
        that lock, by ``now``."""
        token_row = self._token_row(
            conn, token, exclusive=quota.max_locks is not None and not quota.far
        )
        over_quota = False
        if quota.max_locks:
            live = self._scalar(
                conn,
                self._live_count,
                {"now": now, "quota_token": token, "max_locks": quota.limit},
            )
            over_quota = live >= quota.limit
        return quota._replace(row=token_row, over_quota=over_quota)

    def _token_row(self, conn, token: str, *, exclusive: bool) -> Row | None:
        """The token's row (revoked_at, expires_at), locked until commit: for
        update near its quota (one new grant of the token at a time), else
        shared (only a revocation, or a grant near the quota, waits); a
        revocation that committed first is seen, one that comes later waits for
        this grant. None: no such token."""
        return self._row(conn, self._token_rows[exclusive], {"token": token})
