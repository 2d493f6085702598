"""What the lock service reports as it works.

The service records into this interface; ``app.ops.metrics`` gives it the Prometheus
implementation. Without an app it records into nothing.
"""

from __future__ import annotations

from app.locks.state import Action


class NoMetrics:
    """What a LockService records into when no app gave it metrics."""

    def acquired(self, action: Action) -> None:
        pass

    def acquire_refused(self, outcome: str = "held") -> None:
        """``held`` (another holds it), ``frozen`` (423) or ``over_quota`` (429)."""

    def renewal(self, outcome: str) -> None:
        pass

    def release(self, outcome: str) -> None:
        pass

    def operator_action(self, action: Action) -> None:
        pass

    def wait_started(self) -> None:
        pass

    def wait_ended(self, outcome: str, seconds: float) -> None:
        pass

    def handed_over(self, seconds: float) -> None:
        pass

    def session(self, outcome: str) -> None:
        """A session was created, renewed (``heartbeat``, or refused:
        ``heartbeat_unknown``, ``heartbeat_expired``) or ended."""


NO_METRICS = NoMetrics()
