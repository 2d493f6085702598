"""Plain, immutable results handed to the API, the dashboard and the CLI."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from lockkeeper_core.state import Action, LockState, classify


@dataclass(frozen=True, slots=True)
class Lock:
    resource: str
    owner: str
    fence: int
    acquired_at: datetime
    expires_at: datetime
    ttl_remaining: float
    state: LockState
    waiters: int = 0  # acquires queued for the resource
    # The name of the API token that holds the lock with its owner; None for a
    # claim bound to no token, or a grant made before tokens were recorded.
    token: str | None = None
    # How many holders the resource allows, this grant's mode, and how many
    # live grants the resource has now.
    limit: int = 1
    mode: str = "exclusive"
    holders: int = 1
    # The id of the session the grant is bound to (renewed by its heartbeat),
    # or None when it is bound to none (or where a read does not look).
    session: str | None = None

    @property
    def is_holder_row(self) -> bool:
        """A semaphore's holder or a shared grant (a row of ``lock_holders``),
        not a resource's exclusive grant."""
        return self.limit > 1 or self.mode == "shared"

    @classmethod
    def from_row(
        cls, row, now: datetime, expiring_within: float, ttl: float | None = None
    ) -> Lock:
        """``ttl``: the ttl the grant was last granted or renewed for; else the
        row's ``granted_ttl`` column (``statements.listing.granted_ttl``), where
        a read selects it; else the span from its acquire to its expiry, exact
        until its first renewal (a grant just made, the answer of a command)."""
        remaining = (row.expires_at - now).total_seconds()
        if ttl is None:
            ttl = getattr(row, "granted_ttl", None)
        if ttl is None:
            ttl = (row.expires_at - row.acquired_at).total_seconds()
        return cls(
            resource=row.resource,
            owner=row.owner,
            token=getattr(row, "token", None) or None,
            fence=row.fence,
            acquired_at=row.acquired_at,
            expires_at=row.expires_at,
            ttl_remaining=max(remaining, 0.0),
            state=classify(remaining, expiring_within, ttl),
            waiters=getattr(row, "waiters", None) or 0,
            limit=getattr(row, "holder_limit", None) or 1,
            mode=getattr(row, "mode", None) or "exclusive",
            holders=getattr(row, "holders", None) or 1,
            session=getattr(row, "session", None),
        )


@dataclass(frozen=True, slots=True)
class Freeze:
    """No new grants of resources starting with ``prefix`` until ``ends_at`` (None:
    until unfrozen)."""

    prefix: str
    reason: str
    actor: str
    frozen_at: datetime
    ends_at: datetime | None

    @classmethod
    def from_row(cls, row) -> Freeze:
        return cls(
            prefix=row.prefix,
            reason=row.reason,
            actor=row.actor,
            frozen_at=row.frozen_at,
            ends_at=row.ends_at,
        )


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """``acquired`` with the caller's lock, or not, with the current holder.

    ``lock`` is None when a refused acquire found no holder to name: the lock is
    free but others wait in line first (``waiters``), or the holder released
    between our attempt and our look (rare; retry at once).
    """

    acquired: bool
    lock: Lock | None
    action: Action | None = None
    waiters: int = 0
    # A wait that ran out and asked to rejoin: its place in line, kept for the
    # client's next request (``lockkeeper_core.queue``).
    place: int | None = None


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    resource: str
    action: Action
    owner: str | None
    previous_owner: str | None
    fence: int | None
    acquired_at: datetime | None
    expires_at: datetime | None
    actor: str | None
    reason: str | None
    occurred_at: datetime
    # The token the grant was made for or by (an operator's claim names it).
    token: str | None = None
    # The grant's mode ("exclusive" or "shared"); None on events before modes
    # and on freezes.
    mode: str | None = None
    # What a releasing worker reported with its release (``lockkeeper exec``:
    # ``{"run": {"exit_status", "duration", "host"}}``); None otherwise.
    details: dict[str, Any] | None = None
    # The set the grant belongs to (``lockkeeper_core.sets``); None otherwise.
    set_id: str | None = None

    @classmethod
    def from_row(cls, row) -> Event:
        reported = getattr(row, "details", None)
        return cls(
            id=row.id,
            resource=row.resource,
            action=Action(row.action),
            owner=row.owner,
            previous_owner=row.previous_owner,
            fence=row.fence,
            acquired_at=row.acquired_at,
            expires_at=row.expires_at,
            actor=row.actor,
            reason=row.reason,
            occurred_at=row.occurred_at,
            token=row.token,
            mode=getattr(row, "mode", None),
            details=None if reported is None else json.loads(reported),
            set_id=getattr(row, "set_id", None),
        )


@dataclass(frozen=True, slots=True)
class Holders:
    """The live grants of a resource: ``holders`` (the one that ends first
    first), its ``limit`` and ``mode`` and how many wait (``waiters``)."""

    resource: str
    limit: int
    mode: str
    holders: list[Lock]
    waiters: int


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):  # noqa: UP046 - Python 3.11 has no PEP 695 syntax
    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class SetResult:
    """A set's acquire: ``acquired`` with every member's grant (``locks``, in
    the order asked), or refused whole: ``refused`` names the member that
    refused and ``lock`` its grant in the way (None: free, but others wait in
    line first; ``waiters`` how many)."""

    acquired: bool
    locks: list[Lock]
    refused: str | None = None
    lock: Lock | None = None
    waiters: int = 0
    # The set's id, named by every member's event (None: refused).
    set_id: str | None = None
    # A wait that ran out and asked to rejoin: its place in each member's
    # line, kept for the client's next request (``set_waiting``).
    places: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class SetRelease:
    """A set's release: the grants it ended (``released``, in the order
    asked) and the members the caller no longer held (``not_held``: expired,
    released, or another's by now)."""

    released: list[Lock]
    not_held: list[str]


@dataclass(frozen=True, slots=True)
class SetMember:
    """One member of a set as its grant event recorded it, and whether that
    grant is still held as the set's (``held``: live, and acquired again on
    its own by no one since)."""

    resource: str
    fence: int
    owner: str | None
    token: str | None
    mode: str | None
    acquired_at: datetime | None
    held: bool


@dataclass(frozen=True, slots=True)
class SetView:
    """A set by its id: its members, in the lock order, and its events (the
    newest first)."""

    set_id: str
    members: list[SetMember]
    events: list[Event]

    @property
    def held(self) -> list[SetMember]:
        return [m for m in self.members if m.held]


@dataclass(frozen=True, slots=True)
class SetForceRelease:
    """An operator's release of a set: the grants ended (in the lock order)
    and the members whose grant was no longer the set's (``not_held``)."""

    released: list[Lock]
    not_held: list[str]
