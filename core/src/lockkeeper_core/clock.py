"""Where "now" comes from.

Expiry must be judged by ONE clock for every app instance. On PostgreSQL and
MariaDB that is the database server's clock, read inside the very statement that
decides; SQLite lives on one host, so the host clock is that one clock. Tests inject
a ``FakeClock`` (``tests/clock.py``) through the same seam.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime | None:
        """The current UTC time, or None: "ask the database in the statement"."""


class DatabaseClock:
    """Reads the database server's clock inside each statement."""

    def now(self) -> None:
        return None


class SystemClock:
    """The host's clock, for SQLite (the database runs on this host)."""

    def now(self) -> datetime:
        return datetime.now(UTC)
