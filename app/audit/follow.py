"""Following the audit log on the server's engine: ``lockkeeper_core.follow``
(which says how every event is handed out once, in id order) with
``db.engine`` given."""

from __future__ import annotations

from lockkeeper_core import follow as _follow
from lockkeeper_core.follow import (
    FOLLOW_BATCH,
    HOLE_GRACE,
    EventFilter,
    FollowPosition,
)
from lockkeeper_core.queue import WaitQueue
from lockkeeper_core.results import Event

from app.extensions import db


def start_position(after: int | None) -> FollowPosition:
    """After event ``after``, or after the newest event now when it is None."""
    return _follow.start_position(db.engine, after)


def follow_step(
    filters: EventFilter, position: FollowPosition, *, limit: int = FOLLOW_BATCH
) -> tuple[list[Event], FollowPosition]:
    """``lockkeeper_core.follow.follow_step`` on the server's engine."""
    return _follow.follow_step(db.engine, filters, position, limit=limit)


class FollowWakeup(_follow.FollowWakeup):
    """What a stream sleeps on between looks, on the server's engine."""

    def __init__(self, queue: WaitQueue, poll: float):
        super().__init__(queue, db.engine, poll)


__all__ = [
    "HOLE_GRACE",
    "FollowPosition",
    "FollowWakeup",
    "follow_step",
    "start_position",
]
