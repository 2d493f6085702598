"""Refused acquires per minute, counted in memory and added to the database off
the request path.

A refused acquire writes nothing to the lock tables (and must not start to: it
is the hot path of contention). Each server process counts its refusals per
minute and outcome in memory (a lock and a dict increment on the request path,
beside the Prometheus counter), and a thread of its own adds the counts to
``activity_refusals`` every ``FLUSH_SECONDS`` with an upsert that adds, so every
process and instance adds into the same rows. A flush that fails keeps its
counts for the next one. What a crash loses: the counts of at most one flush
interval of that process (a clean exit flushes).

Outcomes: ``held`` (another owner holds it: 200 with ``acquired: false``, or 409
after a wait), ``frozen`` (423), ``over_quota`` (429).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects import mysql, postgresql, sqlite

from app.audit import activity
from app.audit.models import ActivityRefusals
from app.extensions import db

OUTCOMES = ("held", "frozen", "over_quota")
FLUSH_SECONDS = 5.0
MINUTE = timedelta(minutes=1)
KEPT_FOR = timedelta(days=7, hours=2)

refusals = ActivityRefusals.__table__
log = logging.getLogger(__name__)


def _adding(engine: Engine, rows: list[dict]):
    """An insert of ``rows`` that adds each count to a row already there."""
    dialect = engine.dialect.name
    if dialect in ("mysql", "mariadb"):
        statement = mysql.insert(refusals).values(rows)
        return statement.on_duplicate_key_update(
            refused=refusals.c.refused + statement.inserted.refused
        )
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(refusals).values(rows)
    return statement.on_conflict_do_update(
        index_elements=[refusals.c.starts_at, refusals.c.outcome],
        set_={"refused": refusals.c.refused + statement.excluded.refused},
    )


class RefusalCounts:
    """This process's refused acquires per (minute, outcome), not yet flushed."""

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], datetime | None] = lambda: None,
        interval: float = FLUSH_SECONDS,
    ):
        self._engine = engine
        self._clock = clock
        self._interval = interval
        self._mutex = threading.Lock()
        self._counts: Counter[tuple[datetime, str]] = Counter()
        self._flusher_pid: int | None = None  # a fork has no flusher: start one
        self._stopped = threading.Event()

    def count(self, outcome: str) -> None:
        """One refused acquire now (on the request path: no I/O)."""
        if outcome not in OUTCOMES:
            raise KeyError(outcome)
        now = self._clock() or datetime.now(UTC)
        key = (activity.on_grid(now, MINUTE), outcome)
        with self._mutex:
            self._counts[key] += 1
            if self._flusher_pid != os.getpid() and self._interval > 0:
                self._flusher_pid = os.getpid()
                threading.Thread(
                    target=self._flush_every, name="refusal-flusher", daemon=True
                ).start()

    def pending(self) -> int:
        with self._mutex:
            return sum(self._counts.values())

    def flush(self) -> int:
        """Add the counts to the database; how many refusals were added. On a
        failure they are kept for the next flush, and the error raised."""
        with self._mutex:
            taken, self._counts = self._counts, Counter()
        if not taken:
            return 0
        # One order for every process: concurrent upserts of the same rows
        # then wait for each other instead of deadlocking.
        rows = [
            {"starts_at": at, "outcome": outcome, "refused": n}
            for (at, outcome), n in sorted(taken.items())
        ]
        try:
            with self._engine.connect().execution_options(
                sqlite_immediate=True
            ) as conn:
                with conn.begin():
                    conn.execute(_adding(self._engine, rows))
                    newest = max(row["starts_at"] for row in rows)
                    conn.execute(
                        refusals.delete().where(
                            refusals.c.starts_at < newest - KEPT_FOR
                        )
                    )
        except Exception:
            with self._mutex:
                self._counts.update(taken)
            raise
        return sum(taken.values())

    def _flush_every(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 (kept for the next flush; logged)
                log.warning("refused acquires not flushed yet", exc_info=True)

    def stop(self) -> None:
        """Stop the flusher and flush what is left (a clean exit)."""
        self._stopped.set()
        try:
            self.flush()
        except Exception:  # noqa: BLE001 (the process is ending; logged)
            log.warning("refused acquires lost at exit", exc_info=True)


def per_bucket(window: activity.Window) -> list[dict[str, int]]:
    """Refused acquires per outcome in each bucket of ``window``, oldest first
    (what the processes have flushed: up to ``FLUSH_SECONDS`` behind)."""
    start = activity.on_grid(window.start, MINUTE)
    slot = activity.steps_between(
        activity.instant(window.start),
        refusals.c.starts_at,
        activity.micros(window.step),
    ).label("slot")
    query = (
        select(slot, refusals.c.outcome, func.sum(refusals.c.refused))
        .where(refusals.c.starts_at >= start, refusals.c.starts_at < window.end)
        .group_by(slot, refusals.c.outcome)
    )
    counts: list[dict[str, int]] = [
        dict.fromkeys(OUTCOMES, 0) for _ in range(window.slots)
    ]
    with db.engine.connect() as conn:
        for index, outcome, n in conn.execute(query):
            if 0 <= index < window.slots:
                counts[index][outcome] += int(n)
    return counts


def init_app(
    app, engine: Engine, clock: Callable[[], datetime | None]
) -> RefusalCounts:
    """The app's counts, flushed every ``LOCKKEEPER_REFUSALS_FLUSH_SECONDS``
    (0: only at exit) and at a clean exit."""
    interval = float(app.config["LOCKKEEPER_REFUSALS_FLUSH_SECONDS"])
    counts = RefusalCounts(engine, clock, interval)
    app.extensions["lockkeeper.refusals"] = counts
    _live.add(counts)
    return counts


# Every app's counts, flushed once at a clean exit (weakly held: an app that is
# gone takes its counts with it, as tests create many).
_live: weakref.WeakSet[RefusalCounts] = weakref.WeakSet()


@atexit.register
def stop_all() -> None:
    """Stop every app's flusher and flush what is left: at a clean exit, or
    before the databases the apps write to go away (the test suite's end)."""
    for counts in list(_live):
        counts.stop()
