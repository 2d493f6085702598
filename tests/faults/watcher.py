"""A follower of the audit log through a whole fault run: the worker client's
``watch()`` with its defaults, on one app instance (which the run kills and
restarts like the others) across the database's restarts or failovers. At the
end every event the database holds must have reached it exactly once, in order.
"""

from __future__ import annotations

import threading
import time

from lockkeeper_client import LockClient

from tests.faults.checker import Report

# The end of the run: how long the follower may take to catch up with the log.
CATCH_UP_DEADLINE = 60.0
# The event written after the run so that the follower sees one more and stops.
END_MARK = "watch:end"


class AuditWatcher:
    def __init__(self, url: str, token: str):
        self.url = url
        self.token = token
        self.seen: list[int] = []
        self.failure: BaseException | None = None
        self._stop_after: int | None = None
        self._client = LockClient(url, token)
        self._thread = threading.Thread(
            target=self._follow, name="audit-watcher", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _follow(self) -> None:
        try:
            for event in self._client.watch(after=0):
                self.seen.append(event.id)
                if self._stop_after is not None and event.id > self._stop_after:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.failure = exc

    def finish(self, last_id: int, report: Report) -> None:
        """Stop the follower once it has seen past ``last_id``, the log's newest
        event after the run: one more event is written, which it stops at."""
        self._stop_after = last_id
        with LockClient(self.url, self.token) as client:
            deadline = time.monotonic() + CATCH_UP_DEADLINE
            # An event past the log's end, so the follower stops after it (the
            # instance it follows may be restarting: the client retries).
            while True:
                try:
                    client.acquire(END_MARK, "watcher", ttl=60)
                    client.release(END_MARK, "watcher")
                    break
                except Exception:  # noqa: BLE001 - retried to the deadline
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        self._thread.join(max(deadline - time.monotonic(), 1.0))
        if self._thread.is_alive():
            report.violation(
                f"watch() did not reach event {last_id} within "
                f"{CATCH_UP_DEADLINE:g} s (its last: {self.seen[-1:]})"
            )
        elif self.failure is not None:
            report.violation(f"watch() ended with {self.failure!r}")

    def close(self) -> None:
        """Close the follower's client (a follower still reading ends with it)."""
        self._client.close()

    def check(self, ids: list[int], report: Report) -> None:
        """``ids``: every event the database holds, up to the last ``finish``
        waited for; each must have been seen once, in order."""
        seen = [i for i in self.seen if i <= ids[-1]] if ids else []
        repeated = len(seen) - len(set(seen))
        missed = sorted(set(ids) - set(seen))
        invented = sorted(set(seen) - set(ids))
        report.stats.update(
            watch_events=len(seen),
            watch_repeated=repeated,
            watch_missed=len(missed),
        )
        if repeated:
            report.violation(f"watch() repeated {repeated} events")
        if missed:
            report.violation(f"watch() missed {len(missed)} events: {missed[:10]}")
        if invented:
            report.violation(f"watch() saw events the log lacks: {invented[:10]}")
        if seen != sorted(seen):
            report.violation("watch() saw events out of order")
