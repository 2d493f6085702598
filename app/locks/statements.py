"""The atomic check-and-change of every lock operation, per dialect.

Two strategies give the same answers:

``PostgresStatements``
    acquire, renew and release are each ONE statement run in autocommit: a
    data-modifying CTE takes the row (insert, or conditional update/delete), writes
    the audit row and reports the outcome (or the current holder) in one round trip.
    A refused acquire locks and writes nothing: ``FOR UPDATE`` only touches a row
    that is free, expired or already ours, and ``nextval`` is only reached by a
    grant. Release keeps the row, free (``owner`` NULL): see ``DistributedLock``.

``TransactionalStatements``
    SQLite, MariaDB/MySQL (and PostgreSQL's operator actions): one short
    transaction that first takes the row with a locking read (``BEGIN IMMEDIATE``
    on SQLite, ``SELECT ... FOR UPDATE`` elsewhere), decides, then writes the row
    and its event. MariaDB has no ``UPDATE ... RETURNING`` nor data-modifying CTEs,
    so one statement cannot both decide and report; the row lock makes the
    sequence atomic instead. A first insert that loses a race to a concurrent
    insert raises ``IntegrityError`` and the service retries: it then sees the
    winner and is refused.

Both take ``now`` = None to read the database's clock inside the deciding statement,
or a datetime (SQLite's host clock, tests' fake clock).

The holder of a lock is the pair (token, owner): see ``holds``. An acquire that is a
new grant (not a re-acquire) is also refused when the token's quota of live locks is
full; that count is part of the same statement (PostgreSQL) or of reads the
transaction makes anyway (MariaDB), never a round trip of its own on re-acquire or
renew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Row,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.types import Integer

from app.locks.driver import DriverConnection, DriverSQL
from app.locks.models import (
    NO_TOKEN,
    DistributedLock,
    FenceCounter,
    LockEvent,
    LockWaiter,
    fence_sequence,
)
from app.locks.state import Action
from app.types import UTCDateTime

locks = DistributedLock.__table__
events = LockEvent.__table__
fence_counter = FenceCounter.__table__
waiters = LockWaiter.__table__


def queue_columns(resource, now, waiter=None):
    """The Lock's ``waiters`` (live waiters of ``resource``, ``waiter``'s own row
    excluded) and ``ahead`` (those in line before ``waiter``; everyone when
    ``waiter`` is None or binds NULL), as scalar subqueries. A row past its
    deadline never counts: it belongs to a request that gave up or an app
    instance that died."""
    live = and_(waiters.c.resource == resource, waiters.c.deadline > now)
    count = select(func.count()).select_from(waiters)
    if waiter is None:
        everyone = count.where(live).scalar_subquery()
        return everyone.label("waiters"), everyone.label("ahead")
    return (
        count.where(live, or_(waiter.is_(None), waiters.c.id != waiter))
        .scalar_subquery()
        .label("waiters"),
        count.where(live, or_(waiter.is_(None), waiters.c.id < waiter))
        .scalar_subquery()
        .label("ahead"),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt did.

    ``done``: the grant/renewal/release happened. ``row``: the lock row after the
    change (for a release: the row that was removed), or on refusal the current row
    (None when there is none). ``now``: the clock reading the decision used.
    """

    done: bool
    action: Action | None
    row: Any
    now: datetime
    over_quota: bool = False


def holds(row, owner: str, token: str | None) -> bool:
    """Whether (``token``, ``owner``) is the holder recorded on ``row``.

    A row with no token recorded (granted before tokens were) is held by its owner
    under any token; ``NO_TOKEN`` (an operator's claim for no token) by no worker.
    """
    return row.owner == owner and (row.token is None or row.token == token)


def token_or_none(token: str | None) -> str | None:
    """The token as shown to people: ``NO_TOKEN`` is no token."""
    return token if token != NO_TOKEN else None


# --- PostgreSQL: one statement per hot operation ---------------------------------

_PG_NOW_SERVER = "clock_timestamp()"
_PG_NOW_PARAM = "CAST(:now AS timestamptz)"

_PG_ACQUIRE = """
WITH clock AS (SELECT {now} AS now),
prior AS (
    SELECT l.id, l.owner, l.expires_at,
           l.owner IS NOT NULL AND l.expires_at > clock.now AS valid
    FROM distributed_locks AS l, clock
    WHERE l.resource = :resource
      AND (l.owner IS NULL OR l.expires_at <= clock.now
           OR (l.owner = :owner AND (l.token IS NULL OR l.token = :token)))
      AND ((l.owner = :owner AND (l.token IS NULL OR l.token = :token)
            AND l.expires_at > clock.now)
           OR NOT EXISTS ({ahead}))
    FOR UPDATE OF l
),
quota AS (
    SELECT CAST(:max_locks AS integer) IS NOT NULL AND (
        SELECT count(*) FROM (
            SELECT 1 FROM distributed_locks AS q, clock
            WHERE q.token = :token AND q.expires_at > clock.now
            LIMIT :max_locks
        ) AS live
    ) >= :max_locks AS reached
),
updated AS (
    UPDATE distributed_locks AS l
    SET owner = :owner,
        token = :token,
        acquired_at = clock.now,
        expires_at = clock.now + make_interval(secs => :ttl),
        fence = CASE WHEN prior.valid THEN l.fence
                     ELSE nextval('lock_fence_seq') END
    FROM prior, clock
    WHERE l.id = prior.id AND (prior.valid OR NOT (SELECT reached FROM quota))
    RETURNING l.resource, l.owner, l.token, l.fence, l.acquired_at, l.expires_at,
              prior.owner AS previous_owner,
              CASE WHEN prior.owner IS NULL THEN 'acquired'
                   WHEN prior.valid THEN 'reacquired'
                   ELSE 'took_over' END AS action
),
inserted AS (
    INSERT INTO distributed_locks (resource, owner, token, fence, acquired_at,
                                   expires_at)
    SELECT :resource, :owner, :token, nextval('lock_fence_seq'),
           clock.now, clock.now + make_interval(secs => :ttl)
    FROM clock
    WHERE NOT EXISTS (SELECT 1 FROM distributed_locks WHERE resource = :resource)
      AND NOT (SELECT reached FROM quota)
    ON CONFLICT (resource) DO NOTHING
    RETURNING resource, owner, token, fence, acquired_at, expires_at,
              CAST(NULL AS varchar) AS previous_owner, 'acquired' AS action
),
granted AS (SELECT * FROM updated UNION ALL SELECT * FROM inserted),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at)
    SELECT g.resource, g.action, g.owner, g.previous_owner, g.token, g.fence,
           g.acquired_at, g.expires_at, :actor, clock.now
    FROM granted AS g, clock
),
dequeued AS (
    DELETE FROM lock_waiters
    WHERE id = CAST(:waiter AS bigint) AND EXISTS (SELECT 1 FROM granted)
),
{queue}
SELECT true AS done, g.action, g.resource, g.owner, g.token, g.fence,
       g.acquired_at, g.expires_at, clock.now, queue.waiters, false AS over_quota
FROM granted AS g, clock, queue
UNION ALL
SELECT false, NULL, CAST(:resource AS varchar), l.owner, l.token, l.fence,
       l.acquired_at, l.expires_at, clock.now, queue.waiters,
       -- Only a grant can be over quota: a valid lock here is another holder's.
       CASE WHEN l.owner IS NOT NULL AND l.expires_at > clock.now THEN false
            ELSE (SELECT reached FROM quota) END
FROM clock CROSS JOIN queue
LEFT JOIN distributed_locks AS l ON l.resource = :resource
WHERE NOT EXISTS (SELECT 1 FROM granted)
"""

_PG_RENEW = """
WITH clock AS (SELECT {now} AS now),
renewed AS (
    UPDATE distributed_locks AS l
    SET expires_at = clock.now + make_interval(secs => :ttl)
    FROM clock
    WHERE l.resource = :resource AND l.owner = :owner
      AND (l.token IS NULL OR l.token = :token) AND l.expires_at > clock.now
    RETURNING l.resource, l.owner, l.token, l.fence, l.acquired_at, l.expires_at
),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at)
    SELECT r.resource, 'renewed', r.owner, r.owner, CAST(:token AS varchar),
           r.fence, r.acquired_at, r.expires_at, :actor, clock.now
    FROM renewed AS r, clock
),
{queue}
SELECT true AS done, 'renewed' AS action, r.resource, r.owner, r.token, r.fence,
       r.acquired_at, r.expires_at, clock.now, queue.waiters
FROM renewed AS r, clock, queue
UNION ALL
SELECT false, NULL, l.resource, l.owner, l.token, l.fence, l.acquired_at,
       l.expires_at, clock.now, queue.waiters
FROM distributed_locks AS l, clock, queue
WHERE l.resource = :resource AND NOT EXISTS (SELECT 1 FROM renewed)
"""

_PG_RELEASE = """
WITH clock AS (SELECT {now} AS now),
released AS (
    UPDATE distributed_locks AS l
    SET owner = NULL, token = NULL, expires_at = clock.now
    FROM clock
    WHERE l.resource = :resource AND l.owner = :owner
      AND (l.token IS NULL OR l.token = :token) AND l.expires_at > clock.now
    RETURNING l.resource, CAST(:owner AS varchar) AS owner,
              CAST(:token AS varchar) AS token, l.fence, l.acquired_at,
              l.expires_at
),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at)
    SELECT r.resource, 'released', r.owner, r.owner, r.token, r.fence,
           r.acquired_at, r.expires_at, :actor, clock.now
    FROM released AS r, clock
),
{queue}
SELECT true AS done, 'released' AS action, r.resource, r.owner, r.token, r.fence,
       r.acquired_at, r.expires_at, clock.now, queue.waiters
FROM released AS r, clock, queue
UNION ALL
SELECT false, NULL, l.resource, l.owner, l.token, l.fence, l.acquired_at,
       l.expires_at, clock.now, queue.waiters
FROM distributed_locks AS l, clock, queue
WHERE l.resource = :resource AND NOT EXISTS (SELECT 1 FROM released)
"""

_PG_READ_NOW = DriverSQL("SELECT clock_timestamp() AS now")

# Live waiters queued for the resource (a waiter's own row excluded): the Lock's
# ``waiters``. Rows past their deadline (a killed app instance's) never count.
_PG_QUEUE = """queue AS (
    SELECT count(*) AS waiters FROM lock_waiters AS w, clock
    WHERE w.resource = :resource AND w.deadline > clock.now
      AND w.id IS DISTINCT FROM CAST(:waiter AS bigint)
)"""

# Someone is in line before this acquire: anyone for a non-waiting acquire
# (:waiter NULL), the waiters that arrived earlier for a waiting one.
_PG_AHEAD = """SELECT 1 FROM lock_waiters AS w
        WHERE w.resource = :resource AND w.deadline > clock.now
          AND (CAST(:waiter AS bigint) IS NULL OR w.id < CAST(:waiter AS bigint))"""


def _pg_statements(template: str) -> dict[bool, DriverSQL]:
    """The same SQL twice, keyed by "reads the server clock": with ``clock_timestamp()``
    (production), and with a ``:now`` parameter (a test's fake clock)."""
    pieces = {"queue": _PG_QUEUE, "ahead": _PG_AHEAD}
    return {
        True: DriverSQL(template.format(now=_PG_NOW_SERVER, **pieces)),
        False: DriverSQL(template.format(now=_PG_NOW_PARAM, **pieces)),
    }


class PostgresStatements:
    """Single-statement acquire/renew/release; operator actions as transactions.

    The hot operations take a ``DriverConnection`` (``app.locks.driver``), not a
    SQLAlchemy connection: their SQL is fixed, so it goes to the driver's cursor.
    """

    autocommit = True

    def __init__(self) -> None:
        self._acquire = _pg_statements(_PG_ACQUIRE)
        self._renew = _pg_statements(_PG_RENEW)
        self._release = _pg_statements(_PG_RELEASE)
        self.transactional = TransactionalStatements("postgresql")

    def _run(
        self, conn: DriverConnection, statements, now, waiter=None, **params
    ) -> Outcome:
        params["waiter"] = waiter
        if now is not None:
            params["now"] = now
        row = conn.one(statements[now is None], params)
        if row is None:
            return Outcome(False, None, None, now or conn.one(_PG_READ_NOW, {}).now)
        if row.done:
            return Outcome(True, Action(row.action), row, row.now)
        over_quota = bool(getattr(row, "over_quota", False))
        # A refused acquire always answers one row; fence NULL: there is no row.
        holder = row if row.fence is not None else None
        return Outcome(False, None, holder, row.now, over_quota)

    def acquire(
        self, conn, resource, owner, token, ttl, actor, max_locks, now, waiter=None
    ) -> Outcome:
        return self._run(
            conn,
            self._acquire,
            now,
            waiter,
            resource=resource,
            owner=owner,
            token=token,
            ttl=ttl,
            actor=actor,
            max_locks=max_locks,
        )

    def renew(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        return self._run(
            conn,
            self._renew,
            now,
            resource=resource,
            owner=owner,
            token=token,
            ttl=ttl,
            actor=actor,
        )

    def release(self, conn, resource, owner, token, actor, now) -> Outcome:
        return self._run(
            conn,
            self._release,
            now,
            resource=resource,
            owner=owner,
            token=token,
            actor=actor,
        )


# --- Everything else: a short transaction around a locking read ------------------


_SERVER_NOW = {
    "postgresql": func.clock_timestamp,
    "mysql": lambda: func.utc_timestamp(6),
    "mariadb": lambda: func.utc_timestamp(6),
}


_INSERT_EVENT = insert(events)


class TransactionalStatements:
    """Locking read, decision, write, event: one transaction per call."""

    autocommit = False

    def __init__(self, dialect_name: str) -> None:
        self.dialect_name = dialect_name
        self._server_now = _SERVER_NOW.get(dialect_name)
        self.uses_sequence = dialect_name != "sqlite"
        # The hot statements are built once: building Core constructs on every
        # call cost about a fifth of an acquire+release cycle's CPU on SQLite.
        by_resource = locks.c.resource == bindparam("resource")
        waiter = bindparam("waiter", type_=BigInteger())
        given_now = bindparam("now", type_=UTCDateTime())
        server_now = (
            self._server_now().cast(UTCDateTime())
            if self._server_now is not None
            else None
        )
        # Keyed by (reads the server clock, counts the token's live locks): the
        # quota count rides on the locking read (and on the clock read when there
        # is no row), so it costs no statement of its own.
        self._lock_row = {}
        self._clock_row = {}
        for on_server, now_column in ((False, given_now), (True, server_now)):
            if now_column is None:
                continue
            for counting in (False, True):
                columns = [
                    now_column.label("now"),
                    *queue_columns(bindparam("resource"), now_column, waiter),
                ]
                if counting:
                    columns.append(_live_locks(now_column).label("live"))
                self._lock_row[on_server, counting] = (
                    select(locks, *columns).where(by_resource).with_for_update()
                )
                if counting:
                    self._clock_row[on_server] = select(
                        now_column.label("now"),
                        _live_locks(now_column).label("live"),
                    )
        self._next_fence_statement = (
            select(fence_sequence.next_value())
            if self.uses_sequence
            else update(fence_counter)
            .where(fence_counter.c.id == 1)
            .values(value=fence_counter.c.value + 1)
            .returning(fence_counter.c.value)
        )

    # -- reads --------------------------------------------------------------

    def read_now(self, conn: Connection) -> datetime:
        if self._server_now is None:
            raise RuntimeError("SQLite has no server clock: pass the host's time")
        return conn.scalar(select(self._server_now().cast(UTCDateTime())))

    def lock_row(
        self,
        conn: Connection,
        resource: str,
        now: datetime | None,
        waiter: int | None = None,
    ) -> tuple[Row | None, datetime]:
        """The row of ``resource``, locked until commit, and the deciding clock;
        the row also carries its queue (``waiters``, and ``ahead`` of ``waiter``)."""
        row, now, _ = self._counted_lock_row(conn, resource, now, waiter)
        return row, now

    def _counted_lock_row(
        self,
        conn: Connection,
        resource: str,
        now: datetime | None,
        waiter: int | None = None,
        quota_token: str | None = None,
        max_locks: int | None = None,
    ) -> tuple[Row | None, datetime, int | None]:
        """``lock_row``, and with ``max_locks`` how many live locks ``quota_token``
        holds, counted up to ``max_locks``."""
        counting = bool(max_locks) and quota_token is not None
        on_server = now is None
        params: dict[str, Any] = {"resource": resource, "waiter": waiter}
        if not on_server:
            params["now"] = now
        if counting:
            params.update(quota_token=quota_token, max_locks=max_locks)
        row = conn.execute(self._lock_row[on_server, counting], params).one_or_none()
        if row is not None:
            return row, row.now, row.live if counting else None
        if not counting:
            return None, now if now is not None else self.read_now(conn), None
        # No row: the count comes with the clock read (MariaDB), or alone (SQLite,
        # whose clock is the host's and needs no read).
        clock = conn.execute(self._clock_row[on_server], params).one()
        return None, clock.now, clock.live

    def _next_fence(self, conn: Connection) -> int:
        return conn.scalar(self._next_fence_statement)

    # -- writes -------------------------------------------------------------

    def _grant(
        self,
        conn,
        row,
        resource,
        owner,
        token,
        fence,
        now,
        ttl,
        action,
        actor,
        reason=None,
    ) -> Outcome:
        values = {
            "owner": owner,
            "token": token,
            "fence": fence,
            "acquired_at": now,
            "expires_at": now + timedelta(seconds=ttl),
        }
        if row is None:
            conn.execute(insert(locks).values(resource=resource, **values))
        else:
            conn.execute(update(locks).where(locks.c.id == row.id).values(**values))
        granted = _LockRow(
            resource=resource,
            waiters=row.waiters if row is not None else 0,
            **values,
        )
        previous_owner = row.owner if row is not None else None
        self._log(conn, action, granted, previous_owner, token, actor, reason, now)
        return Outcome(True, action, granted, now)

    def _log(
        self, conn, action, lock, previous_owner, token, actor, reason, now
    ) -> None:
        conn.execute(
            _INSERT_EVENT,
            {
                "resource": lock.resource,
                "action": action.value,
                "owner": lock.owner,
                "previous_owner": previous_owner,
                "token": token_or_none(token),
                "fence": lock.fence,
                "acquired_at": lock.acquired_at,
                "expires_at": lock.expires_at,
                "actor": actor,
                "reason": reason,
                "occurred_at": now,
            },
        )

    # -- operations ---------------------------------------------------------

    def acquire(
        self, conn, resource, owner, token, ttl, actor, max_locks, now, waiter=None
    ) -> Outcome:
        row, now, live = self._counted_lock_row(
            conn, resource, now, waiter, token, max_locks
        )
        valid_ours = (
            row is not None and holds(row, owner, token) and row.expires_at > now
        )
        if row is not None and row.ahead and not valid_ours:
            return Outcome(False, None, row, now)  # others are in line first
        outcome = self._decide_acquire(
            conn, row, resource, owner, token, ttl, actor, now, live, max_locks
        )
        if outcome.done and waiter is not None:
            conn.execute(delete(waiters).where(waiters.c.id == waiter))
        return outcome

    def _decide_acquire(
        self, conn, row, resource, owner, token, ttl, actor, now, live, max_locks
    ):
        if row is None or row.owner is None:
            action = Action.ACQUIRED
        elif row.expires_at <= now:
            action = Action.TOOK_OVER
        elif holds(row, owner, token):
            action = Action.REACQUIRED
        else:
            return Outcome(False, None, row, now)
        if action is Action.REACQUIRED:
            fence = row.fence
        elif live is not None and live >= max_locks:
            # Only a new grant counts against the quota; nothing is written.
            holder = row if row is not None and row.owner is not None else None
            return Outcome(False, None, holder, now, over_quota=True)
        else:
            fence = self._next_fence(conn)
        return self._grant(
            conn, row, resource, owner, token, fence, now, ttl, action, actor
        )

    def renew(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        row, now = self.lock_row(conn, resource, now)
        if row is None or not holds(row, owner, token) or row.expires_at <= now:
            return Outcome(False, None, row, now)
        expires_at = now + timedelta(seconds=ttl)
        conn.execute(
            update(locks).where(locks.c.id == row.id).values(expires_at=expires_at)
        )
        renewed = _LockRow.of(row, expires_at=expires_at)
        self._log(conn, Action.RENEWED, renewed, owner, token, actor, None, now)
        return Outcome(True, Action.RENEWED, renewed, now)

    def release(self, conn, resource, owner, token, actor, now) -> Outcome:
        row, now = self.lock_row(conn, resource, now)
        if row is None or not holds(row, owner, token) or row.expires_at <= now:
            return Outcome(False, None, row, now)
        return self._remove(conn, row, Action.RELEASED, token, actor, None, now)

    def force_release(self, conn, resource, actor, reason, now) -> Outcome:
        row, now = self.lock_row(conn, resource, now)
        if row is None or row.owner is None:
            return Outcome(False, None, None, now)
        return self._remove(
            conn, row, Action.FORCE_RELEASED, row.token, actor, reason, now
        )

    def claim(
        self, conn, resource, owner, token, ttl, actor, reason, force, now
    ) -> Outcome:
        """Grant to (``token``, ``owner``); ``token`` NO_TOKEN: bound to no token."""
        row, now = self.lock_row(conn, resource, now)
        held_by_other = (
            row is not None
            and row.owner is not None
            and row.expires_at > now
            and not (row.owner == owner and row.token == token)
        )
        if held_by_other and not force:
            return Outcome(False, None, row, now)
        action = Action.FORCE_CLAIMED if held_by_other else Action.CLAIMED
        fence = self._next_fence(conn)
        return self._grant(
            conn, row, resource, owner, token, fence, now, ttl, action, actor, reason
        )

    def _remove(self, conn, row, action, token, actor, reason, now) -> Outcome:
        """Free the row (see ``DistributedLock``); the event says when it ended."""
        conn.execute(
            update(locks)
            .where(locks.c.id == row.id)
            .values(owner=None, token=None, expires_at=now)
        )
        ended = _LockRow.of(row, expires_at=now)
        self._log(conn, action, ended, row.owner, token, actor, reason, now)
        return Outcome(True, action, ended, now)

    def purge_stale_batch(self, conn, cutoff: datetime, batch: int) -> list[Row]:
        """Delete up to ``batch`` rows that expired (or were released) at or before
        ``cutoff``; returns their (resource, owner), owner None for free rows.

        The rows are locked first, so a row re-acquired meanwhile is not taken.
        """
        candidates = conn.execute(
            select(locks.c.id, locks.c.resource, locks.c.owner)
            .where(locks.c.expires_at <= cutoff)
            .order_by(locks.c.expires_at)
            .limit(batch)
            .with_for_update()
        ).all()
        if candidates:
            conn.execute(
                delete(locks).where(locks.c.id.in_([c.id for c in candidates]))
            )
        return candidates


def _live_locks(now_column):
    """How many live locks the token ``:quota_token`` holds, counted no further
    than ``:max_locks`` (an index range on (token, expires_at), bounded)."""
    mine = locks.alias("mine")
    live = (
        select(literal(1))
        .select_from(mine)
        .where(
            mine.c.token == bindparam("quota_token"),
            mine.c.expires_at > now_column,
        )
        .limit(bindparam("max_locks", type_=Integer()))
        .subquery("live")
    )
    return select(func.count()).select_from(live).scalar_subquery()


@dataclass(frozen=True, slots=True)
class _LockRow:
    resource: str
    owner: str
    token: str | None
    fence: int
    acquired_at: datetime
    expires_at: datetime
    waiters: int = 0

    @classmethod
    def of(cls, row, **changes) -> _LockRow:
        values = {name: getattr(row, name, 0) for name in cls.__slots__}
        values.update(changes)
        return cls(**values)


def statements_for(dialect_name: str):
    if dialect_name == "postgresql":
        return PostgresStatements()
    return TransactionalStatements(dialect_name)
