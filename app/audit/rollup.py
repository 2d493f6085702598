"""The charts' series from stored closed buckets, counting only what is missing.

A moment of the charts' grid that is over keeps the state it had, and a bucket
that is over keeps its events (events are append-only): each is counted once, by
the first drawing that needs it, and stored (``app.audit.models``). A drawing
reads the stored rows of its range (at most a few hundred, by primary key) and
counts, with ``app.audit.activity``, only the window from its first missing
moment up to now: in steady state the open bucket and the last minute. No write
is added to the lock statements.

A moment or bucket end counts as over ``CLOSED_AFTER`` after it: ids and
``occurred_at`` can disagree by about a transaction's length (``ID_MARGIN``), so
an event of an older bucket may still commit that long after the bucket ended.
Concurrent drawers may count the same bucket; they count the same numbers, and
the inserts leave a row already stored alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from lockkeeper_core.models import LockEvent
from lockkeeper_core.transactions import is_conflict
from sqlalchemy import delete, select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from app.audit import activity
from app.audit.models import EVERY_ACTION, ActivityEvents, ActivitySample
from app.extensions import db

CLOSED_AFTER = activity.ID_MARGIN
# Stored rows older than this are deleted as new ones are stored: the widest
# range the charts draw, with a bucket to spare.
KEPT_FOR = timedelta(days=7, hours=2)
# What is missing from a wider range (a day's 20 min, a week's 2 h buckets) is
# counted per minute when it spans at most this long: the minutes are stored
# too, so the open bucket of a week costs a minute's events, not two hours'.
MINUTE = timedelta(minutes=1)
BY_MINUTE_UP_TO = timedelta(hours=3)
# A drawing in a request counts at most about this many events (plus those
# of the last ``ALWAYS_COUNTED``, whatever they are): with nothing stored (a
# fresh deploy, a new ``expiring_within``) a day is a million events here,
# 16-30 s of counting,
# past a worker's timeout. The newest moments within this many events are
# counted; older missing ones are answered None (not yet counted) and counted
# by a drawing without a budget (``app.dashboard.charts`` runs one in the
# background, and the page polls every few seconds until it is stored). Each
# event costs 15-25 µs (two window passes over them, and the held rows of the
# resources they touched) on top of 50-60 ms that do not depend on it (the
# counts of every held row, the rows expiring within the window, the holders):
# the first drawing of an hour or a day took 102-120 ms median at 2,000 events
# and 100,000 locks on PostgreSQL, 58-86 ms at 500 (``bench/audit_bench.py``,
# "nothing stored", alternated). The once-a-minute poll meets the budget: what
# it has to count is only what no drawing could store yet.
EVENTS_PER_DRAWING = 500
# What no drawing can have stored yet, so every drawing counts it whatever its
# budget: a bucket is stored ``CLOSED_AFTER`` after its end, by the next
# drawing (at most a minute later: the charts are drawn once a minute). Under
# steady traffic above the budget's worth of events a minute (8 events/s) the
# minute just ended was answered "not counted" by every drawing, for ever:
# no drawing can store it while it is that new.
ALWAYS_COUNTED = CLOSED_AFTER + MINUTE

stored_samples = ActivitySample.__table__
stored_events = ActivityEvents.__table__


def insert_ignoring(table):
    """An insert, executed with a list of rows, that leaves a row whose key is
    already stored. The rows are parameters, not part of the statement: it is
    compiled once, not once per number of rows (SQLAlchemy batches the list
    into multi-row statements itself)."""
    dialect = db.engine.dialect.name
    if dialect in ("mysql", "mariadb"):
        return mysql.insert(table).prefix_with("IGNORE")
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(table).on_conflict_do_nothing()


def _store(table, rows: list[dict], older, newest: datetime) -> None:
    """Store ``rows`` and delete what is older than any range. Concurrent
    drawers storing the same rows can deadlock on MariaDB (its duplicate-key
    checks take shared locks): the loser stores nothing, the winner stores the
    same numbers, and a later drawing stores whatever is still missing."""
    if not rows:
        return
    try:
        with db.engine.connect().execution_options(sqlite_immediate=True) as conn:
            with conn.begin():
                conn.execute(insert_ignoring(table), rows)
                conn.execute(delete(table).where(older < newest - KEPT_FOR))
    except DBAPIError as error:
        if not is_conflict(error):
            raise


def _within_ms(within: float) -> int:
    """The key of the samples stored for ``within``: negative, as the moments
    are judged against each grant's own ttl; rows stored while they were
    judged by the window alone (keyed by ``within`` in milliseconds) are left
    unread, and deleted with age."""
    return -round(within * 1000) - 1


def _from(window: activity.Window, first: int) -> activity.Window:
    """The window from its moment ``first`` (a grid moment, or the last grid
    moment when ``first`` is the open end) up to its end."""
    moments = window.moments
    start = min(moments[first], window.last_on_grid)
    return activity.Window(start=start, step=window.step, end=window.end)


def _always_counted(moments: list[datetime]) -> int:
    """The index of the first moment whose bucket ends within ``ALWAYS_COUNTED``
    of the window's end (``moments[-1]``), at most the newest bucket's start."""
    unstored_from = moments[-1] - ALWAYS_COUNTED
    return min(
        (i for i in range(len(moments) - 1) if moments[i + 1] > unstored_from),
        default=len(moments) - 2,
    )


def _within_budget(moments: list[datetime], first: int, budget: int | None) -> int:
    """The index of the earliest moment from ``first`` on after which at most
    ``budget`` events happened (None: no budget), at most that of the buckets
    no drawing can have stored yet (``ALWAYS_COUNTED``): they and now are
    always counted. One read of at most ``budget + 1`` entries of the events'
    ``occurred_at`` index."""
    newest = _always_counted(moments)
    if budget is None or first >= newest:
        return first
    occurred_at = LockEvent.__table__.c.occurred_at
    with db.engine.connect() as conn:
        edge = conn.scalar(
            select(occurred_at)
            .where(occurred_at >= moments[first])
            .order_by(occurred_at.desc())
            .offset(budget)
            .limit(1)
        )
    if edge is None:
        return first
    later = (i for i in range(first, len(moments)) if moments[i] > edge)
    return min(next(later, len(moments)), newest)


def _by_minute(missing: activity.Window) -> bool:
    return missing.step > MINUTE and missing.end - missing.start <= BY_MINUTE_UP_TO


def states(
    window: activity.Window,
    within: float,
    budget: int | None = None,
) -> list[dict[str, int] | None]:
    """Locks held / expiring / stale at each moment of ``window`` (which ends
    now: the untouched locks' rows are their state all along); None for a
    moment neither stored nor counted: counting from it would read more than
    ``budget`` events."""
    moments = window.moments
    key = _within_ms(within)
    on_grid = [m for m in moments if m <= window.last_on_grid]
    with db.engine.connect() as conn:
        stored = {
            at: {"held": held, "expiring": expiring, "stale": stale}
            for at, held, expiring, stale in conn.execute(
                select(
                    stored_samples.c.at,
                    stored_samples.c.held,
                    stored_samples.c.expiring,
                    stored_samples.c.stale,
                ).where(
                    stored_samples.c.within_ms == key,
                    stored_samples.c.at.in_(on_grid),
                )
            )
        }
    first = next(i for i, m in enumerate(moments) if m not in stored)
    first = _within_budget(moments, first, budget)
    missing = _from(window, first)
    if _by_minute(missing):
        minutes = activity.Window(start=missing.start, step=MINUTE, end=missing.end)
        by_minute = dict(
            # The budget again per minute: a week's open bucket is 2 h long.
            zip(minutes.moments, states(minutes, within, budget), strict=True)
        )
        counted = {m: by_minute[m] for m in missing.moments}
    else:
        counted = dict(
            zip(missing.moments, activity.states(missing, within), strict=True)
        )
    closed = window.end - CLOSED_AFTER
    _store(
        stored_samples,
        [
            {"within_ms": key, "at": at, **counts}
            for at, counts in counted.items()
            if at in on_grid and at <= closed and at not in stored and counts
        ],
        stored_samples.c.at,
        window.end,
    )
    return [stored.get(m) or counted.get(m) for m in moments]


def events(
    window: activity.Window, budget: int | None = None
) -> list[dict[str, int] | None]:
    """Events per action in each bucket of ``window`` (oldest first), the
    bucket's total under ``EVERY_ACTION``; None for a bucket neither stored nor
    counted: counting from it would read more than ``budget`` events."""
    moments = window.moments
    step = int(window.step.total_seconds())
    starts = moments[:-1]
    stored: dict[datetime, dict[str, int]] = {}
    with db.engine.connect() as conn:
        for at, action, count in conn.execute(
            select(
                stored_events.c.starts_at,
                stored_events.c.action,
                stored_events.c.events,
            ).where(
                stored_events.c.step_seconds == step,
                stored_events.c.starts_at.in_(starts),
            )
        ):
            stored.setdefault(at, {})[action] = count
    counted_starts = [at for at in starts if EVERY_ACTION in stored.get(at, {})]
    first = next(
        (i for i, at in enumerate(starts) if at not in counted_starts), len(starts)
    )
    counted: dict[datetime, dict[str, int]] = {}
    if first < len(starts):
        first = _within_budget(moments, first, budget)
        missing = _from(window, first)
        if _by_minute(missing):
            minutes = activity.Window(start=missing.start, step=MINUTE, end=missing.end)
            # The budget again per minute: a week's open bucket is 2 h long.
            per_minute = zip(minutes.moments, events(minutes, budget), strict=False)
            bounds = missing.moments
            uncounted = set()
            for at, per_action in per_minute:
                # The bucket of ``missing`` this minute falls in.
                bucket = max(m for m in bounds[:-1] if m <= at)
                if per_action is None:
                    uncounted.add(bucket)
                    continue
                total = counted.setdefault(bucket, {})
                for action, n in per_action.items():
                    total[action] = total.get(action, 0) + n
            for bucket in bounds[:-1]:
                counted.setdefault(bucket, {EVERY_ACTION: 0})
            for bucket in uncounted:
                del counted[bucket]
        else:
            for at, per_action in zip(
                missing.moments, activity.per_bucket(missing), strict=False
            ):
                counted[at] = {EVERY_ACTION: sum(per_action.values()), **per_action}
    closed = window.end - CLOSED_AFTER
    _store(
        stored_events,
        [
            {"step_seconds": step, "starts_at": at, "action": action, "events": n}
            for i, at in enumerate(starts)
            if at in counted
            and at not in counted_starts
            and moments[i + 1] - at == window.step
            and moments[i + 1] <= closed
            for action, n in counted[at].items()
        ],
        stored_events.c.starts_at,
        window.end,
    )
    return [stored[at] if at in counted_starts else counted.get(at) for at in starts]
