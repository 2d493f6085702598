"""At a server's start: a fence sequence below the highest fence held is repaired.

A database restored from a backup without the fence jump (docs/deploy.md,
"Backups and restores") would hand out fences it has handed out before: a stale
writer holding the old fence N would pass the fence check of the new holder of
N. The lock rows the backup holds show fences the sequence must stay above; when
it is not above them, it is moved to ``FENCE_JUMP`` past the highest of them
(far past any fence handed out between the backup and the failure too), and the
start logs a warning saying so. The move is forward only, and checked again under
a lock on PostgreSQL (MariaDB's SETVAL and SQLite's guarded UPDATE never move
back), so two workers starting at once cannot undo each other's repair.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

FENCE_JUMP = 1_000_000_000
# pg_advisory_xact_lock's key for the repair ("lkfence" in ASCII).
_REPAIR_LOCK = 0x6C6B66656E6365


@dataclass(frozen=True)
class FenceRepair:
    next_fence: int  # what the sequence would have handed out next
    highest_held: int
    moved_to: int  # the sequence's next fence now


def highest_fence_held(conn: Connection) -> int:
    return conn.execute(
        text(
            "SELECT coalesce(max(fence), 0) FROM ("
            " SELECT max(fence) AS fence FROM distributed_locks"
            " UNION ALL SELECT max(fence) FROM lock_holders) AS held"
        )
    ).scalar_one()


def next_fence(conn: Connection) -> int:
    """The fence the sequence hands out next (at least; MariaDB's is the next
    one not cached)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        last, called = conn.execute(
            text("SELECT last_value, is_called FROM lock_fence_seq")
        ).one()
        return last + 1 if called else last
    if dialect in ("mysql", "mariadb"):
        return conn.execute(
            text("SELECT next_not_cached_value FROM lock_fence_seq")
        ).scalar_one()
    return conn.execute(text("SELECT value FROM lock_fence_counter")).scalar_one() + 1


def _move_to(conn: Connection, target: int) -> None:
    """The sequence's next fence becomes ``target``, unless it is past it."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.execute(
            text("SELECT setval('lock_fence_seq', :last)"), {"last": target - 1}
        )
    elif dialect in ("mysql", "mariadb"):
        # MariaDB's SETVAL ignores a value below the sequence's own.
        conn.execute(text("SELECT SETVAL(lock_fence_seq, :last)"), {"last": target - 1})
    else:
        conn.execute(
            text("UPDATE lock_fence_counter SET value = :last WHERE value < :last"),
            {"last": target - 1},
        )


def repair_fence_sequence(conn: Connection) -> FenceRepair | None:
    """Move the fence sequence past the highest fence held if it is not; the
    repair made, or None when none was needed. Commits on ``conn``."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _REPAIR_LOCK})
    held = highest_fence_held(conn)
    upcoming = next_fence(conn)
    if upcoming > held:
        conn.commit()
        return None
    target = held + FENCE_JUMP
    _move_to(conn, target)
    conn.commit()
    return FenceRepair(upcoming, held, next_fence(conn))


def repair_at_start(app) -> FenceRepair | None:
    """``repair_fence_sequence`` on the app's database, said in the log."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.extensions import db

    try:
        with app.app_context(), db.engine.connect() as conn:
            repair = repair_fence_sequence(conn)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        app.logger.warning("start: the fence sequence was not checked: %s", reason)
        return None
    if repair is not None:
        app.logger.warning(
            "start: the fence sequence would have handed out fence %d again, at or"
            " below the highest fence held (%d): the database was restored without"
            " the fence jump; moved the sequence to %d",
            repair.next_fence,
            repair.highest_held,
            repair.moved_to,
        )
    return repair
