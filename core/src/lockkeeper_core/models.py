"""The lock core's tables, on the declarative base every table of the app shares.

``Base`` is plain SQLAlchemy: the Flask app hands it to Flask-SQLAlchemy
(``SQLAlchemy(model_class=Base)`` in ``app.extensions``), whose ``db.Model`` then
shares its metadata and registry, so one ``MetaData`` holds every table for
Alembic and the tests while the lock core imports no Flask."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Float,
    Index,
    Integer,
    Sequence,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column


class Base(DeclarativeBase):
    pass


# Fences come from one database-wide sequence (a counter row on SQLite, which has
# no sequences): a value taken later is always larger, so a resource's fence keeps
# increasing even after its row is released or purged and inserted anew.
fence_sequence = Sequence("lock_fence_seq", start=1, metadata=Base.metadata)

# ``DistributedLock.token`` of a grant bound to no token (an operator's claim):
# no token name is empty, so no worker matches it.
NO_TOKEN = ""

# The modes of a grant: an exclusive grant excludes every other; shared grants
# coexist with each other.
EXCLUSIVE = "exclusive"
SHARED = "shared"
MODES = (EXCLUSIVE, SHARED)
SESSION_ID_LENGTH = 64
# A set's id (``lockkeeper_core.sets``): secrets.token_urlsafe(12), 16 characters.
SET_ID_LENGTH = 32


class DistributedLock(Base):
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
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # How many holders the resource allows at once: 1 is the exclusive (or
    # read/write) lock, whose exclusive grant lives on this row; above 1 a
    # counting semaphore, whose holders are rows of ``lock_holders``.
    holder_limit: Mapped[int] = mapped_column(Integer, server_default="1")
    # The latest expiry of the resource's ``lock_holders`` rows (semaphore holders,
    # shared grants): while it is in the future the resource is held by holders.
    # The column keeps the old name of holders, "places": only a migration renames it.
    places_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The session the exclusive grant on this row is bound to (its expiry moves
    # with the session's heartbeat).
    session_id: Mapped[str | None] = mapped_column(String(SESSION_ID_LENGTH))
    # On a Galera node the guard adds one for each guarded transaction of the
    # exclusive grant: a write, which certification orders against a take-over
    # from another node (migration 0035). Nothing reads it.
    guard_writes: Mapped[int] = mapped_column(BigInteger, server_default="0")

    __table_args__ = (
        # By owner and the free rows (owner NULL) counted per state from the
        # index alone (migration 0026).
        Index("ix_distributed_locks_owner_expires_at", "owner", "expires_at"),
        Index("ix_distributed_locks_session_id", "session_id"),
        Index("ix_distributed_locks_token_expires_at", "token", "expires_at"),
        # The overview's urgent and remaining-time orders (migration 0015).
        Index("ix_distributed_locks_expires_at_resource", "expires_at", "resource"),
        MYSQL_TABLE_ARGS,
    )


class LockEvent(Base):
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
    # The grant's mode (EXCLUSIVE or SHARED); NULL on events written before modes.
    mode: Mapped[str | None] = mapped_column(String(16))
    # JSON a releasing worker reports (``lockkeeper exec``: exit status, duration,
    # host); NULL otherwise.
    details: Mapped[str | None] = mapped_column(Text)
    # The set whose grant this event is of (its acquire, its release or
    # an operator's release of it, ``lockkeeper_core.sets``); NULL otherwise
    # (migration 0037).
    set_id: Mapped[str | None] = mapped_column(String(SET_ID_LENGTH))

    __table_args__ = (
        Index("ix_lock_events_resource_id", "resource", "id"),
        # A set's events; only theirs where the database keeps a partial index.
        Index(
            "ix_lock_events_set_id_id",
            "set_id",
            "id",
            postgresql_where=text("set_id IS NOT NULL"),
            sqlite_where=text("set_id IS NOT NULL"),
        ),
        Index("ix_lock_events_owner_id", "owner", "id"),
        Index("ix_lock_events_actor_id", "actor", "id"),
        Index("ix_lock_events_action_id", "action", "id"),
        Index("ix_lock_events_occurred_at", "occurred_at"),
        {"sqlite_autoincrement": True, **MYSQL_TABLE_ARGS},
    )


class LockFreeze(Base):
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


class FenceCounter(Base):
    """SQLite's stand-in for ``lock_fence_seq``: a single row, bumped per grant."""

    __tablename__ = "lock_fence_counter"

    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (MYSQL_TABLE_ARGS,)


class LockWaiter(Base):
    """One acquire waiting in line for ``resource`` (see ``lockkeeper_core.queue``).

    ``id`` is the arrival order; ``deadline`` (on the deciding clock) is when the
    request gives up: a row whose deadline has passed no longer counts, so a row
    left by a killed app instance holds no one up for longer than that.
    ``mode`` and ``holder_limit`` are what the acquire asked for (shown on the
    dashboard; the grant decides from the request itself, never from these).
    """

    __tablename__ = "lock_waiters"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    resource: Mapped[str] = mapped_column(name_column())
    owner: Mapped[str] = mapped_column(name_column())
    token: Mapped[str | None] = mapped_column(name_column(80))
    enqueued_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deadline: Mapped[datetime] = mapped_column(UTCDateTime)
    # EXCLUSIVE or SHARED, and the limit (above 1: a semaphore's holder) the
    # acquire asked for; NULL on a holder joined by code older than 0036.
    mode: Mapped[str | None] = mapped_column(String(16))
    holder_limit: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        Index("ix_lock_waiters_resource_id", "resource", "id"),
        Index("ix_lock_waiters_deadline", "deadline"),
        {"sqlite_autoincrement": True, **MYSQL_TABLE_ARGS},
    )


class LockHolder(Base):
    """One holder of a semaphore (``holder_limit`` above 1) or one shared grant:
    a holder of its own, with its own (token, owner), fence, times and session.
    The resource's ``distributed_locks`` row is the row every change of its holders
    locks first, and its ``places_until`` is the latest ``expires_at`` here."""

    __tablename__ = "lock_holders"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    resource: Mapped[str] = mapped_column(name_column())
    owner: Mapped[str] = mapped_column(name_column())
    # NO_TOKEN for an operator's claim bound to no token.
    token: Mapped[str] = mapped_column(name_column(80))
    mode: Mapped[str] = mapped_column(String(16))
    fence: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    session_id: Mapped[str | None] = mapped_column(String(SESSION_ID_LENGTH))
    # The guard's writes on Galera, as ``DistributedLock.guard_writes``.
    guard_writes: Mapped[int] = mapped_column(BigInteger, server_default="0")

    __table_args__ = (
        UniqueConstraint(
            "resource", "token", "owner", name="uq_lock_holders_resource_holder"
        ),
        Index("ix_lock_holders_resource_expires_at", "resource", "expires_at"),
        Index("ix_lock_holders_token_expires_at", "token", "expires_at"),
        Index("ix_lock_holders_fence", "fence"),
        Index("ix_lock_holders_session_id", "session_id"),
        MYSQL_TABLE_ARGS,
    )


class LockSession(Base):
    """A worker's session: one heartbeat renews every grant bound to it (their
    ``expires_at`` moves with the session's), and ending it releases them all.
    A session belongs to the API token that made it; ``id`` is opaque."""

    __tablename__ = "lock_sessions"

    id: Mapped[str] = mapped_column(String(SESSION_ID_LENGTH), primary_key=True)
    owner: Mapped[str] = mapped_column(name_column())
    token: Mapped[str] = mapped_column(name_column(80))
    ttl: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_lock_sessions_token", "token"),
        Index("ix_lock_sessions_expires_at", "expires_at"),
        MYSQL_TABLE_ARGS,
    )
