"""What the lock service reports as it works.

The service records into this interface; ``app.ops.metrics`` gives it the Prometheus
implementation. Without an app it records into nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from lockkeeper_core.state import Action


class Granted(Protocol):
    acquired_at: datetime


def held_for(grant: Granted, now: datetime) -> float:
    """Seconds from ``grant``'s grant (or its last re-acquire) to ``now``."""
    return (now - grant.acquired_at).total_seconds()


class NoMetrics:
    """What a LockService records into when no app gave it metrics."""

    def acquired(self, action: Action, resource: str | None = None) -> None:
        """``took_over``: ``resource``'s previous holder had lapsed."""

    def acquire_refused(self, outcome: str = "held") -> None:
        """``held`` (another holds it), ``frozen`` (423) or ``over_quota`` (429)."""

    def renewal(self, outcome: str, resource: str | None = None) -> None:
        """``expired`` and ``not_owner``: the holder of ``resource`` lost it."""

    def release(
        self, outcome: str, resource: str | None = None, held_for: float | None = None
    ) -> None:
        """``released``: ``resource`` was held ``held_for`` seconds."""

    def operator_action(self, action: Action) -> None:
        pass

    def wait_started(self) -> None:
        pass

    def wait_ended(self, outcome: str, seconds: float) -> None:
        pass

    def wait_refused(self, reason: str) -> None:
        """A waiting acquire found no room (503): ``worker_full`` (the worker's
        LOCKKEEPER_MAX_WAITERS) or ``token_share`` (the token's share of them)."""

    def handed_over(self, seconds: float) -> None:
        pass

    def session(self, outcome: str) -> None:
        """A session was created (or refused: ``refused_quota``), renewed
        (``heartbeat``, or refused: ``heartbeat_unknown``, ``heartbeat_expired``)
        or ended."""


NO_METRICS = NoMetrics()
