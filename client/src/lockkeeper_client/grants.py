"""What the server answers, as the client's own value types."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class LockGrant:
    """A lock as the server reported it: who holds ``resource``, with which fence,
    until when."""

    resource: str
    owner: str
    fence: int
    acquired_at: datetime
    expires_at: datetime
    ttl_remaining: float
    state: str
    waiters: int = 0  # acquires waiting in line for it
    # How many holders the resource allows (1: exclusive or shared lock; N: a
    # counting semaphore), this grant's mode, and the live grants of the
    # resource now (older servers send none of them: one exclusive holder).
    limit: int = 1
    mode: str = "exclusive"
    holders: int = 1
    # The id of the session the grant is bound to; None when it is bound to
    # none (or the server is older and does not say).
    session: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockGrant:
        """:raise KeyError, TypeError, ValueError: not the API's lock object."""
        return cls(
            resource=data["resource"],
            owner=data["owner"],
            fence=int(data["fence"]),
            acquired_at=parse_timestamp(data["acquired_at"]),
            expires_at=parse_timestamp(data["expires_at"]),
            ttl_remaining=float(data["ttl_remaining"]),
            state=data["state"],
            waiters=int(data.get("waiters", 0)),  # absent from older servers
            limit=int(data.get("limit", 1)),
            mode=str(data.get("mode", "exclusive")),
            holders=int(data.get("holders", 1)),
            session=str(data["session"]) if data.get("session") else None,
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as the server reported it; ``locks``: its live grants (only a
    read lists them)."""

    id: str
    owner: str
    ttl: float
    expires_at: datetime
    ttl_remaining: float
    locks: tuple[LockGrant, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionInfo:
        """:raise KeyError, TypeError, ValueError: not the API's session object."""
        return cls(
            id=str(data["id"]),
            owner=data["owner"],
            ttl=float(data["ttl"]),
            expires_at=parse_timestamp(data["expires_at"]),
            ttl_remaining=float(data["ttl_remaining"]),
            locks=tuple(LockGrant.from_json(lock) for lock in data.get("locks", ())),
        )


@dataclass(frozen=True, slots=True)
class LockKind:
    """What kind of lock an acquire asks for: exclusive (the default), one of
    ``limit`` holders of a counting semaphore, or a shared (read) lock that
    coexists with other shared grants and excludes exclusive ones."""

    limit: int | None = None
    shared: bool = False

    def __post_init__(self) -> None:
        if self.limit is not None and not 1 <= self.limit <= 1000:
            raise ValueError(f"limit must be 1 to 1000, not {self.limit!r}")
        if self.shared and self.limit not in (None, 1):
            raise ValueError("a shared lock has no limit: shared grants are unbounded")

    def body(self) -> dict[str, Any]:
        """The acquire body's fields for this kind (none for the default)."""
        fields: dict[str, Any] = {}
        if self.limit is not None:
            fields["limit"] = self.limit
        if self.shared:
            fields["mode"] = "shared"
        return fields


EXCLUSIVE = LockKind()


@dataclass(frozen=True, slots=True)
class AcquireAttempt:
    """One acquire's answer: ``acquired`` with the caller's grant, or refused with
    the current holder.

    On a refusal ``retry_after`` is the server's ``Retry-After`` (seconds until the
    holder's lock expires unless it renews). ``lock`` is None only when the server
    named no holder (it released between the attempt and the look).
    """

    acquired: bool
    lock: LockGrant | None
    retry_after: float | None = None
    # A waiting acquire found the server's waiting room full (503): poll instead.
    waiting_room_full: bool = False
    # The cap it hit, as the server names it (``LOCKKEEPER_MAX_WAITERS_PER_TOKEN``:
    # the token's share of a server worker's room; ``LOCKKEEPER_MAX_WAITERS``: the
    # worker's room), when it names one.
    waiting_room_cap: str | None = None
    # The place in line the server kept for the turned-away wait (it asked with
    # ``place``), or for the wait that ran out (it asked to ``rejoin``): the
    # retry presents it and waits from there, not at the end.
    place: int | None = None
    # The holder went while the server decided (its "lock changed hands" 503):
    # ``lock`` is None and the lock likely free; ask again now.
    changed_hands: bool = False


def parse_timestamp(text: str) -> datetime:
    """A timestamp of the server's answers (RFC 3339, always with an offset) as an
    aware UTC datetime.

    :raise ValueError: not such a timestamp.
    """
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    return value.astimezone(UTC)


def default_owner() -> str:
    """A fresh owner token: readable on the dashboard, unguessable by other workers."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One event of the audit log, as ``/api/v1/events`` and ``watch()`` carry it:
    who did what to ``resource``, under which fence. ``data`` is the whole JSON
    object (fields a newer server adds are there too)."""

    id: int
    resource: str
    action: str
    owner: str | None
    fence: int | None
    occurred_at: datetime
    actor: str | None
    data: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockEvent:
        """:raise KeyError, TypeError, ValueError: not the API's event object."""
        fence = data.get("fence")
        return cls(
            id=int(data["id"]),
            resource=data["resource"],
            action=data["action"],
            owner=data.get("owner"),
            fence=None if fence is None else int(fence),
            occurred_at=parse_timestamp(data["occurred_at"]),
            actor=data.get("actor"),
            data=data,
        )


@dataclass(frozen=True, slots=True)
class SetMember:
    """One resource of a set taken as one (``lock_all``), with its own kind."""

    resource: str
    kind: LockKind = EXCLUSIVE

    def body(self) -> dict[str, Any]:
        return {"resource": self.resource, **self.kind.body()}


@dataclass(frozen=True, slots=True)
class SetAttempt:
    """One acquire of a set: ``acquired`` with every member's grant (``locks``,
    in the order asked), or refused whole: ``refused`` names the member that
    refused and ``lock`` its grant in the way (None: free, but others wait in
    line first); ``retry_after`` as the server said."""

    acquired: bool
    locks: tuple[LockGrant, ...]
    refused: str | None = None
    lock: LockGrant | None = None
    retry_after: float | None = None
    # The set's id, which every event of its grants names (None: refused, or
    # a server before sets were named).
    set_id: str | None = None
    # A set asked to wait found the server's waiting room full (503): poll
    # instead; the cap it hit, as the server names it.
    waiting_room_full: bool = False
    waiting_room_cap: str | None = None
    # The set's place in each member's line the server kept for the
    # turned-away wait (it asked with ``places``), or for the wait that ran
    # out (it asked to ``rejoin``): the retry presents them, as one lock's
    # ``place``.
    places: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class SetRelease:
    """A set's release: the grants it ended, and the members the caller no
    longer held (``not_held``: it had lost them)."""

    released: tuple[LockGrant, ...]
    not_held: tuple[str, ...]
