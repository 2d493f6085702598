"""Reading the audit log as it is written: the events' filter, and following
them (every event after a given id, in id order, exactly once), on any engine.
The server's event stream and the embedded mode's ``watch()`` both follow here.

An event's id is drawn when it is inserted, but transactions commit in their own
order: on PostgreSQL and MariaDB id 41 may become visible after id 42. A reader
that hands out 42 and later resumes "after 42" would never see 41. So a follower
hands out an id only once every smaller id is *settled* (committed or rolled
back), and then resuming after any id it handed out is gap-free.

How an id is known to be settled, per database:

* SQLite has one writer at a time (``BEGIN IMMEDIATE``): ids commit in order, so
  every visible id is settled.
* PostgreSQL: read the newest visible id ``N`` and then the database clock
  ``t``. Every id up to ``N`` was drawn before ``t`` (ids are drawn in increasing
  order), so by a transaction that began before ``t``. Once no transaction that
  began at or before ``t`` is still open (``pg_stat_activity.xact_start``, which
  PostgreSQL clears only after the commit is visible), every id up to ``N`` is
  settled, and a statement started after that check sees all that committed. An
  open transaction older than ``t`` holds the follower back until it ends.
* MariaDB: a locking read (``LOCK IN SHARE MODE``) of the ids up to ``N`` waits
  for every row still being inserted by an open transaction (its implicit lock),
  so once it returns, the ids it finds are settled and committed. An id missing
  below ``N`` was rolled back, or is still between being drawn and being written
  (microseconds): it holds the follower back for ``HOLE_GRACE`` seconds, then is
  taken as rolled back. (``information_schema.innodb_trx`` is no help: it is a
  cache that is not refreshed while it is read more often than every 0.1 s.)
* MariaDB Galera: the locking read waits only for rows being inserted on the
  follower's own node. An id drawn by an open transaction on another node is
  missing until that node commits, which can be later than any grace (a
  stalled node, flow control). So after the grace the follower *closes* the
  missing ids of its window instead of assuming them rolled back: in one
  transaction it inserts a row under each and deletes it again, and commits.
  The transaction writes those ids, so certification orders it against any
  transaction that drew one of them: if the follower's commits first, the
  other fails (1213; a lock operation is retried under a new id) and the id
  can never appear; if the other's commits first, the follower's transaction
  fails or leaves that id alone, and the event is read.

The cost is latency, never an event.

Between looks a follower sleeps: on PostgreSQL until a NOTIFY from the trigger of
migration 0010 (or a second at most), elsewhere a poll interval (the server's
``LOCKKEEPER_STREAM_POLL_INTERVAL``).

Each step is a few short statements on a pooled connection, returned at once: a
follower holds no connection or transaction between steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Select, bindparam, func, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from lockkeeper_core import validation
from lockkeeper_core.engine import galera_connection
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.models import EXCLUSIVE, SHARED, LockEvent
from lockkeeper_core.pagination import starts_with, within
from lockkeeper_core.queue import CLIENT_CHECK_INTERVAL, WaitQueue
from lockkeeper_core.results import Event
from lockkeeper_core.state import Action
from lockkeeper_core.wakeups import EVENTS_WAKEUP

events = LockEvent.__table__

# The indexes whose ranges the prefix and the time window are (``read_by``).
BY_PREFIX = "ix_lock_events_resource_id"
BY_TIME = "ix_lock_events_occurred_at"


@dataclass(frozen=True, slots=True)
class EventFilter:
    resource: str | None = None
    prefix: str | None = None
    owner: str | None = None
    action: str | None = None
    # Several actions: events with one of them, or with none of them when
    # ``except_actions`` (the dashboard's "everything but renewals").
    actions: tuple[str, ...] = ()
    except_actions: bool = False
    actor: str | None = None
    # The grant's mode ("exclusive" or "shared"); events before modes and
    # freezes have none and match neither.
    mode: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    # The prefixes of the asking API token: events of other resources are not seen.
    scope: tuple[str, ...] | None = None

    def validate(self) -> None:
        errors: list[tuple[str, str]] = []
        if self.resource is not None and validation.resource_error(self.resource):
            errors.append(("resource", validation.resource_error(self.resource)))
        for field in ("prefix", "owner", "actor"):
            value = getattr(self, field)
            if value is not None and (
                len(value) > validation.MAX_NAME
                or validation.has_control_characters(value)
            ):
                errors.append((field, "must be at most 255 printable characters"))
        for action in (self.action, *self.actions):
            if action is not None and action not in set(Action):
                errors.append(
                    ("action", "must be one of " + ", ".join(a.value for a in Action))
                )
                break
        if self.mode is not None and self.mode not in (EXCLUSIVE, SHARED):
            errors.append(("mode", "must be exclusive or shared"))
        for field in ("since", "until"):
            value = getattr(self, field)
            if value is not None and value.tzinfo is None:
                errors.append((field, "must include a timezone (e.g. Z)"))
        if self.since and self.until and self.since.tzinfo and self.until.tzinfo:
            if self.since > self.until:
                errors.append(("until", "must not be before since"))
        if errors:
            raise InvalidInput(errors)

    def apply(self, query: Select, *, read_by: str | None = None) -> Select:
        """``query`` narrowed to the matching events. ``read_by``: the index
        (``BY_PREFIX``, ``BY_TIME``) whose range of the prefix or the time
        window SQLite may read; it reads no other by those (``_newest_first``
        chooses). Elsewhere the same rows and the planner's own choice."""
        if self.resource is not None:
            query = query.where(events.c.resource == self.resource)
        if self.prefix:
            query = query.where(
                starts_with(events.c.resource, self.prefix, ranged=read_by == BY_PREFIX)
            )
        if self.scope is not None:
            # Row by row: a token's broad scope would read and sort its range.
            query = query.where(within(events.c.resource, self.scope, ranged=False))
        if self.owner is not None:
            query = query.where(events.c.owner == self.owner)
        if self.action is not None:
            query = query.where(events.c.action == self.action)
        if self.actions:
            chosen = [str(a) for a in self.actions]
            query = query.where(
                events.c.action.not_in(chosen)
                if self.except_actions
                else events.c.action.in_(chosen)
            )
        if self.actor is not None:
            query = query.where(events.c.actor == self.actor)
        if self.mode is not None:
            query = query.where(events.c.mode == self.mode)
        occurred_at = (
            events.c.occurred_at
            if read_by == BY_TIME
            else _Unindexed(events.c.occurred_at)
        )
        if self.since is not None:
            query = query.where(occurred_at >= self.since)
        if self.until is not None:
            query = query.where(occurred_at < self.until)
        return query


class _Unindexed(FunctionElement[Any]):
    """SQLite: ``+column``, the same value that no index serves (so the
    planner walks the ids rather than reading and sorting a wide range);
    elsewhere the column itself."""

    inherit_cache = True
    name = "lockkeeper_unindexed"

    def __init__(self, column) -> None:
        super().__init__(column)
        self.type = column.type


@compiles(_Unindexed)
def _the_column(element, compiler, **kw):
    return compiler.process(element.clauses, **kw)


@compiles(_Unindexed, "sqlite")
def _no_index(element, compiler, **kw):
    return "+" + compiler.process(element.clauses, **kw)


# Rows per read; a busy log is read in several steps, each its own short read.
FOLLOW_BATCH = 200
# MariaDB: how long an id missing below visible ones holds a follower back
# before it is taken as rolled back (see the module docstring).
HOLE_GRACE = 2.0
# MariaDB: ids checked by one locking read at the most.
LOCK_WINDOW = 1000

_NEWEST = select(events.c.id).order_by(events.c.id.desc()).limit(1)
_PG_CLOCK = text("SELECT clock_timestamp()")
# When the oldest transaction still open in this database began (other than the
# asking one); NULL when none is.
_PG_OLDEST_OPEN = text(
    "SELECT min(xact_start) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)
_FIRST_AFTER = select(func.min(events.c.id)).where(events.c.id > bindparam("after"))
# Waits (a second at most) for rows of open transactions in the range.
_MARIADB_SETTLED_IDS = text(
    "SET STATEMENT innodb_lock_wait_timeout = 1 FOR"
    " SELECT id FROM lock_events WHERE id > :after AND id <= :upto"
    " ORDER BY id LOCK IN SHARE MODE"
).bindparams(bindparam("after"), bindparam("upto"))


# The action of the rows a follower on Galera writes and deletes at once to
# close a hole: no event is one.
_CLOSED = "hole"
_DELETE_CLOSED = text(
    "DELETE FROM lock_events WHERE id BETWEEN :first AND :last"
    f" AND action = '{_CLOSED}' AND resource = ''"
)


@dataclass(frozen=True, slots=True)
class FollowPosition:
    """Where a follower is: every event with an id up to ``after`` has been read,
    and every id up to ``settled`` (>= ``after``) is settled.

    PostgreSQL: ``pending`` is (newest id seen, database time just after seeing
    it), settled once no transaction older than that time is open. MariaDB:
    ``hole`` is (the first missing id, when it was first seen missing).
    """

    after: int
    settled: int = 0
    pending: tuple[int, Any] | None = None
    hole: tuple[int, float] | None = None


def start_position(engine: Engine, after: int | None) -> FollowPosition:
    """After event ``after``, or after the newest event now when it is None."""
    if after is None:
        with engine.connect() as conn:
            after = conn.scalar(select(func.max(events.c.id))) or 0
    return FollowPosition(after, after)


def _settle(conn: Connection, dialect: str, position: FollowPosition) -> FollowPosition:
    """``position`` with ``settled`` raised as far as can be known now."""
    newest = conn.scalar(_NEWEST) or 0
    if newest <= position.settled:
        return position
    if dialect == "postgresql":
        return _settle_postgresql(conn, position, newest)
    if dialect in ("mysql", "mariadb"):
        return _settle_mariadb(conn, position, newest)
    # SQLite: one writer at a time, so ids commit in order.
    return replace(position, settled=newest)


def _settle_postgresql(conn, position: FollowPosition, newest: int) -> FollowPosition:
    # Read after the newest id: every id up to ``newest`` was drawn before ``now``.
    now = conn.scalar(_PG_CLOCK)
    pending = position.pending or (newest, now)
    # Read after ``now``, and after ``pending``'s time: a fresh look at who is
    # open (PostgreSQL reads the activity table once per transaction).
    oldest: datetime | None = conn.scalar(_PG_OLDEST_OPEN)
    if oldest is None or oldest > now:
        return replace(position, settled=newest, pending=None)
    if oldest > pending[1]:
        return replace(position, settled=pending[0], pending=(newest, now))
    return replace(position, pending=pending)


def _settle_mariadb(conn, position: FollowPosition, newest: int) -> FollowPosition:
    # A run of missing ids (deleted by a purge or between tests, rolled back, or
    # drawn before an empty table's first event) is one hole, waited out once:
    # the window reaches the first id present after it, not LOCK_WINDOW ids at a
    # time (a follower that started on an empty table whose counter stood at
    # 50,000 waited 100 s for its first event).
    galera = galera_connection(conn)
    first = conn.scalar(_FIRST_AFTER, {"after": position.settled}) or newest
    upto = min(newest, max(first, position.settled + LOCK_WINDOW))
    try:
        present = conn.scalars(
            _MARIADB_SETTLED_IDS, {"after": position.settled, "upto": upto}
        ).all()
    except OperationalError:
        return position  # a long transaction still writes: look again later
    settled, hole = position.settled, position.hole
    now = time.monotonic()
    # ``upto + 1`` closes the window: ids missing at its end are a hole too.
    for found in [*present, upto + 1]:
        if found == settled + 1:
            settled = found
            continue
        if hole is None or hole[0] != settled + 1:
            hole = (settled + 1, now)
        if now - hole[1] < HOLE_GRACE:
            break
        if galera:
            # Missing for the whole grace: every id still missing in the window
            # is closed at once (so none commits later). One hole at a time
            # would hold the follower back a grace per event: a node draws ids
            # at its own offset, so one writing node leaves a hole after each.
            last = min(upto, settled + LOCK_WINDOW)
            if _close_holes(conn, settled + 1, last):
                settled, hole = last, None
            break
        # Missing for the whole grace: rolled back.
        settled, hole = found, None
    settled = min(settled, upto)
    if hole is not None and hole[0] <= settled:
        hole = None
    return replace(position, settled=settled, hole=hole)


def _close_holes(conn: Connection, first: int, last: int) -> bool:
    """Galera: make sure no event with a missing id from ``first`` to ``last``
    ever commits, as the module docstring says; True when done. False when
    the cluster ordered a transaction holding one of them first (1213), or a
    transaction on this node still inserts one (its lock), or one committed
    meanwhile: looked at again on the next step."""
    try:
        # The ids are integers from the database; the sequence engine's table
        # names the range.
        ids = f"seq_{int(first)}_to_{int(last)}"
        conn.exec_driver_sql(
            "SET STATEMENT innodb_lock_wait_timeout = 1 FOR"
            " INSERT INTO lock_events (id, resource, action, occurred_at)"
            f" SELECT seq, '', '{_CLOSED}', UTC_TIMESTAMP(6) FROM {ids}"
            " WHERE seq NOT IN (SELECT id FROM lock_events"
            f" WHERE id BETWEEN {int(first)} AND {int(last)})"
        )
        conn.execute(_DELETE_CLOSED, {"first": first, "last": last})
        conn.commit()
    except (IntegrityError, OperationalError):
        conn.rollback()
        return False
    return True


def follow_step(
    engine: Engine,
    filters: EventFilter,
    position: FollowPosition,
    *,
    limit: int = FOLLOW_BATCH,
) -> tuple[list[Event], FollowPosition]:
    """The next settled events matching ``filters`` after ``position`` (oldest
    first, at most ``limit``) and the position after them.

    ``filters`` must have been validated. Fewer than ``limit`` events means the
    follower has caught up with what is settled now.
    """
    with engine.connect() as conn:
        if position.after >= position.settled:
            position = _settle(conn, engine.dialect.name, position)
        if position.after >= position.settled:
            return [], position
        # A statement of its own: its snapshot is taken after the settle check,
        # so it sees every settled event that committed.
        rows = conn.execute(
            filters.apply(select(events))
            .where(events.c.id > position.after, events.c.id <= position.settled)
            .order_by(events.c.id)
            .limit(limit)
        ).all()
    after = rows[-1].id if len(rows) == limit else position.settled
    return [Event.from_row(row) for row in rows], replace(position, after=after)


# -- sleeping between looks -------------------------------------------------------

# PostgreSQL, listener up: a look at least this often all the same (a NOTIFY sent
# before this process registered, or lost while the listener reconnected).
NOTIFY_SAFETY_INTERVAL = 1.0
# Writers notify while this table has a row (migration 0010); rows whose backend
# is gone (a process that died) go with the next registration.
_REGISTER = (
    text(
        "DELETE FROM lock_event_listeners"
        " WHERE pid NOT IN (SELECT pid FROM pg_stat_activity)"
    ),
    text("INSERT INTO lock_event_listeners (pid) VALUES (:pid) ON CONFLICT DO NOTHING"),
)
_UNREGISTER = text("DELETE FROM lock_event_listeners WHERE pid = :pid")
# The streams of this process by the database and the listener connection
# (backend pid) that registered for them: the row goes when its last stream
# does. (The server's streams and an embedded watcher may share a process.)
_registered_lock = threading.Lock()
_registered: dict[tuple[str, int], int] = {}


class FollowWakeup:
    """What a follower sleeps on between looks (a context manager): woken by the
    listener of ``queue`` on PostgreSQL, by time alone elsewhere or while the
    listener is down."""

    def __init__(self, queue: WaitQueue, engine: Engine, poll: float):
        self._queue = queue
        self._engine = engine
        self._poll = poll
        self._pid: int | None = None
        self._subscription = queue.wakeups.subscribe(EVENTS_WAKEUP)
        self._woken = None
        self._listener = None

    def __enter__(self) -> FollowWakeup:
        self._woken = self._subscription.__enter__()
        if self._engine.dialect.name == "postgresql":
            self._listener = self._queue.listener()
            self._register()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._move_to(None)
        finally:
            self._subscription.__exit__(*exc)

    def wait(self, longest: float, still_there: Callable[[], bool]) -> None:
        """Sleep until woken, ``longest`` seconds at the most, or until the client
        is gone (looked at every ``CLIENT_CHECK_INTERVAL``)."""
        notified = self._register()
        limit = NOTIFY_SAFETY_INTERVAL if notified else self._poll
        if not notified and self._listener is not None:
            # Starting or reconnecting: register as soon as it is up.
            limit = min(limit, CLIENT_CHECK_INTERVAL)
        until = time.monotonic() + max(0.0, min(longest, limit))
        while (left := until - time.monotonic()) > 0 and still_there():
            if self._woken.event.wait(min(left, CLIENT_CHECK_INTERVAL)):
                break
        self._woken.event.clear()

    def _register(self) -> bool:
        """Keep this process registered under its listener's current connection;
        whether NOTIFY wakes this follower now."""
        listener = self._listener
        if listener is None or not listener.healthy:
            return False
        pid = listener.backend_pid
        if pid is not None and pid != self._pid:
            self._move_to(pid)
        return pid is not None and pid == self._pid

    def _move_to(self, pid: int | None) -> None:
        old, self._pid = self._pid, None
        database = self._engine.url.render_as_string(hide_password=True)
        with _registered_lock:
            if old is not None:
                _registered[database, old] -= 1
                if not _registered[database, old]:
                    del _registered[database, old]
                    with self._engine.begin() as conn:
                        conn.execute(_UNREGISTER, {"pid": old})
            if pid is not None:
                if (database, pid) not in _registered:
                    with self._engine.begin() as conn:
                        conn.execute(_REGISTER[0])
                        conn.execute(_REGISTER[1], {"pid": pid})
                _registered[database, pid] = _registered.get((database, pid), 0) + 1
                self._pid = pid
