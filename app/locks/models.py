"""The lock table and its audit log."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Sequence, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.database import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column
from app.extensions import db

# Fences come from one database-wide sequence (a counter row on SQLite, which has
# no sequences): a value taken later is always larger, so a resource's fence keeps
# increasing even after its row is released or purged and inserted anew.
fence_sequence = Sequence("lock_fence_seq", start=1, metadata=db.metadata)

# ``DistributedLock.token`` of a grant bound to no token (an operator's claim):
# no token name is empty, so no worker matches it.
NO_TOKEN = ""


class DistributedLock(db.Model):
    """One row per resource. A released row stays as a free row (``owner`` NULL,
    ``expires_at`` = when it was released) until purged: the next grant then
    updates a row it has locked, and draws its fence under that lock. Deleting
    on release would let a grant that drew its fence before a whole
    grant-and-release of a faster contender insert a smaller fence after it."""

    __tablename__ = "distributed_locks"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    resource: Mapped[str] = mapped_column(name_column(), unique=True)
    owner: Mapped[str | None] = mapped_column(name_column())
    # The holder is (token, owner): the name of the API token that made the grant;
    # NO_TOKEN for an operator's claim bound to no token; NULL for a grant made
    # before tokens were recorded (any token with the owner may act on it).
    token: Mapped[str | None] = mapped_column(name_column(80))
    fence: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)

    __table_args__ = (
        Index("ix_distributed_locks_owner", "owner"),
        Index("ix_distributed_locks_token_expires_at", "token", "expires_at"),
        MYSQL_TABLE_ARGS,
    )


class LockEvent(db.Model):
    """One ownership change, written in the same transaction as the change."""

    __tablename__ = "lock_events"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    resource: Mapped[str] = mapped_column(name_column())
    action: Mapped[str] = mapped_column(String(32))
    owner: Mapped[str | None] = mapped_column(name_column())
    previous_owner: Mapped[str | None] = mapped_column(name_column())
    token: Mapped[str | None] = mapped_column(name_column(80))
    fence: Mapped[int | None] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    actor: Mapped[str | None] = mapped_column(name_column())
    reason: Mapped[str | None] = mapped_column(Text)
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_lock_events_resource_id", "resource", "id"),
        Index("ix_lock_events_owner_id", "owner", "id"),
        Index("ix_lock_events_actor_id", "actor", "id"),
        Index("ix_lock_events_action_id", "action", "id"),
        Index("ix_lock_events_occurred_at", "occurred_at"),
        {"sqlite_autoincrement": True, **MYSQL_TABLE_ARGS},
    )


class LockFreeze(db.Model):
    """While it lasts, no new grant of a resource starting with ``prefix``: no
    first acquire, take-over, or claim without force. Renewals and releases of
    grants already made go on. A timed freeze ends at ``ends_at`` by the deciding
    clock (the row stays until unfrozen or frozen again); NULL lasts until
    unfrozen."""

    __tablename__ = "lock_freezes"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    prefix: Mapped[str] = mapped_column(name_column(), unique=True)
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(name_column())
    frozen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ends_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (MYSQL_TABLE_ARGS,)


class FenceCounter(db.Model):
    """SQLite's stand-in for ``lock_fence_seq``: a single row, bumped per grant."""

    __tablename__ = "lock_fence_counter"

    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (MYSQL_TABLE_ARGS,)


class LockWaiter(db.Model):
    """One acquire waiting in line for ``resource`` (see ``app.locks.queue``).

    ``id`` is the arrival order; ``deadline`` (on the deciding clock) is when the
    request gives up: a row whose deadline has passed no longer counts, so a row
    left by a killed app instance holds no one up for longer than that.
    """

    __tablename__ = "lock_waiters"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    resource: Mapped[str] = mapped_column(name_column())
    owner: Mapped[str] = mapped_column(name_column())
    token: Mapped[str | None] = mapped_column(name_column(80))
    enqueued_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deadline: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_lock_waiters_resource_id", "resource", "id"),
        Index("ix_lock_waiters_deadline", "deadline"),
        {"sqlite_autoincrement": True, **MYSQL_TABLE_ARGS},
    )
