"""Counts the overview's charts keep per closed bucket, so a drawing reads a few
rows instead of counting a day's events again.

A closed bucket never changes: events are append-only and a moment in the past
keeps the state it had. The drawers fill these rows on read (``app.audit.rollup``);
the lock statements never write them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.database import MYSQL_TABLE_ARGS, UTCDateTime
from app.extensions import db

# ``ActivityEvents.action`` of a bucket's total over every action: stored even
# when it is 0, so a counted bucket is told apart from one never counted.
EVERY_ACTION = ""


class ActivitySample(db.Model):
    """Locks held / expiring / stale at one past moment of the charts' grid, for
    one ``expiring_within`` (its key: ``rollup._within_ms``)."""

    __tablename__ = "activity_samples"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    within_ms: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    held: Mapped[int] = mapped_column(Integer)
    expiring: Mapped[int] = mapped_column(Integer)
    stale: Mapped[int] = mapped_column(Integer)


class ActivityEvents(db.Model):
    """Audit events of one action in one closed bucket of ``step_seconds``."""

    __tablename__ = "activity_events"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    step_seconds: Mapped[int] = mapped_column(Integer, primary_key=True)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    action: Mapped[str] = mapped_column(String(32), primary_key=True)
    events: Mapped[int] = mapped_column(Integer)


class ActivityRefusals(db.Model):
    """Acquires refused in one minute, per outcome (``held``: another holds it;
    ``frozen``: 423; ``over_quota``: 429), as the server processes counted them
    in memory and added them here."""

    __tablename__ = "activity_refusals"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    starts_at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16), primary_key=True)
    refused: Mapped[int] = mapped_column(Integer)
