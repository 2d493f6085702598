"""Lock statements sent straight through the DB-API drivers: the baselines.

Three designs, each as ``acquire(conn, resource, owner, ttl) -> row | None`` and
``release(conn, resource, owner) -> bool``:

``service``
    the very statements ``LockService`` sends (the PostgreSQL CTEs are imported from
    ``lockkeeper_core.statements``; the SQLite/MariaDB transaction is the same sequence
    written out, releases leaving the row free), without Flask, SQLAlchemy or
    validation: the service's ceiling.
``ideal``
    the best atomic statement, with no audit row: one upsert whose WHERE decides, one
    conditional DELETE. What a hand-tuned endpoint would send.
``seed``
    the seed's read-then-write design: SELECT, then INSERT or UPDATE, then SELECT,
    in one transaction (PostgreSQL only; on SQLite it fails under concurrency).

Connections are plain driver connections opened by ``connect(url)``; SQLite gets
the app's pragmas (WAL, busy_timeout, synchronous=NORMAL).
"""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

# The service's own PostgreSQL statements, so the comparison is like for like.
from lockkeeper_core.statements.postgresql import PostgresStatements
from sqlalchemy.engine import make_url

from app.config import normalize_database_url

BACKENDS = ("sqlite", "postgresql", "mariadb")
RETRIES = 5  # as LOCKKEEPER_DEADLOCK_RETRIES


def backend_of(url: str) -> str:
    name = make_url(normalize_database_url(url)).get_backend_name()
    return "mariadb" if name == "mysql" else name


def _pyformat(sql: str) -> str:
    """SQLAlchemy ``:name`` parameters to psycopg's ``%(name)s``."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", sql)


def _sqlite_time(moment: datetime) -> str:
    """The text SQLAlchemy stores for a naive-UTC DateTime on SQLite."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


# --- connections ------------------------------------------------------------------


def connect(url: str) -> Any:
    parsed = make_url(normalize_database_url(url))
    backend = backend_of(url)
    if backend == "sqlite":
        conn = sqlite3.connect(
            parsed.database, isolation_level=None, timeout=10, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn
    if backend == "postgresql":
        import psycopg

        conninfo = parsed.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        return psycopg.connect(conninfo, autocommit=True)
    if backend == "mariadb":
        import pymysql

        conn = pymysql.connect(
            host=parsed.host or "127.0.0.1",
            port=parsed.port or 3306,
            user=parsed.username,
            password=parsed.password or "",
            database=parsed.database,
            autocommit=False,
            charset="utf8mb4",
        )
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn
    raise ValueError(f"no driver baseline for {url}")


# --- PostgreSQL -------------------------------------------------------------------

# The service's own statements, as its driver seam sends them (server clock).
_PG_SERVICE = PostgresStatements()
_PG_SERVICE_ACQUIRE = _PG_SERVICE.acquire_sql.sql
_PG_SERVICE_RELEASE = _PG_SERVICE.release_sql.sql

_PG_IDEAL_ACQUIRE = """
INSERT INTO distributed_locks AS l (resource, owner, fence, acquired_at, expires_at)
VALUES (%(resource)s, %(owner)s, nextval('lock_fence_seq'), now(),
        now() + make_interval(secs => %(ttl)s))
ON CONFLICT (resource) DO UPDATE
SET owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at,
    expires_at = EXCLUDED.expires_at,
    fence = CASE WHEN l.expires_at > EXCLUDED.acquired_at THEN l.fence
                 ELSE EXCLUDED.fence END
WHERE l.expires_at <= EXCLUDED.acquired_at OR l.owner = EXCLUDED.owner
RETURNING resource, owner, fence, acquired_at, expires_at
"""
_PG_IDEAL_RELEASE = """
DELETE FROM distributed_locks
WHERE resource = %(resource)s AND owner = %(owner)s AND expires_at > now()
"""

_PG_SEED_READ = """
SELECT resource, owner, fence, acquired_at, expires_at, now() AS now
FROM distributed_locks WHERE resource = %(resource)s
"""
_PG_SEED_INSERT = """
INSERT INTO distributed_locks (resource, owner, fence, acquired_at, expires_at)
VALUES (%(resource)s, %(owner)s, nextval('lock_fence_seq'), now(),
        now() + make_interval(secs => %(ttl)s))
"""
_PG_SEED_UPDATE = """
UPDATE distributed_locks
SET owner = %(owner)s, fence = nextval('lock_fence_seq'), acquired_at = now(),
    expires_at = now() + make_interval(secs => %(ttl)s)
WHERE resource = %(resource)s
"""
_PG_SEED_DELETE = "DELETE FROM distributed_locks WHERE resource = %(resource)s"


class PostgresDriver:
    name = "postgresql"

    # As the API sends them: a token with the default quota of new tokens.
    token = {"token": "bench", "max_locks": 10000}

    def service_acquire(self, conn, resource, owner, ttl):
        row = conn.execute(
            _PG_SERVICE_ACQUIRE,
            {
                "resource": resource,
                "owner": owner,
                "ttl": ttl,
                "actor": None,
                "waiter": None,
                "now": None,
            }
            | self.token,
        ).fetchone()
        return row if row is not None and row[0] else None

    def service_release(self, conn, resource, owner) -> bool:
        row = conn.execute(
            _PG_SERVICE_RELEASE,
            {
                "resource": resource,
                "owner": owner,
                "actor": None,
                "token": "bench",
                "now": None,
                "details": None,
            },
        ).fetchone()
        return bool(row is not None and row[0])

    def ideal_acquire(self, conn, resource, owner, ttl):
        params = {"resource": resource, "owner": owner, "ttl": ttl}
        return conn.execute(_PG_IDEAL_ACQUIRE, params).fetchone()

    def ideal_release(self, conn, resource, owner) -> bool:
        params = {"resource": resource, "owner": owner}
        return conn.execute(_PG_IDEAL_RELEASE, params).rowcount == 1

    def seed_acquire(self, conn, resource, owner, ttl):
        params = {"resource": resource, "owner": owner, "ttl": ttl}
        with conn.transaction():
            row = conn.execute(_PG_SEED_READ, params).fetchone()
            if row is None:
                conn.execute(_PG_SEED_INSERT, params)
            elif row[4] <= row[5] or row[1] == owner:
                conn.execute(_PG_SEED_UPDATE, params)
            else:
                return None
            return conn.execute(_PG_SEED_READ, params).fetchone()

    def seed_release(self, conn, resource, owner) -> bool:
        params = {"resource": resource}
        with conn.transaction():
            row = conn.execute(_PG_SEED_READ, params).fetchone()
            if row is None or row[1] != owner:
                return False
            conn.execute(_PG_SEED_DELETE, params)
            return True


# --- SQLite and MariaDB: the service's locking-read transaction --------------------


class _TransactionalDriver:
    """The sequence of ``TransactionalStatements``: locking read, decide, write the
    row and its event, commit."""

    name = ""
    placeholder = "?"
    lock_suffix = ""

    def _q(self, sql: str) -> str:
        return sql.replace("?", self.placeholder)

    def _begin(self, cur) -> None:
        raise NotImplementedError

    def _commit(self, conn, cur) -> None:
        raise NotImplementedError

    def _now(self, cur) -> Any:
        raise NotImplementedError

    def _read(self, cur, resource):
        raise NotImplementedError

    def _next_fence(self, cur) -> int:
        raise NotImplementedError

    def _event(self, cur, action, resource, owner, previous, fence, acq, exp, now):
        cur.execute(
            self._q(
                "INSERT INTO lock_events (resource, action, owner, previous_owner,"
                " fence, acquired_at, expires_at, actor, reason, occurred_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)"
            ),
            (resource, action, owner, previous, fence, acq, exp, now),
        )

    def _retrying(self, conn, attempt):
        """Run ``attempt`` again after a deadlock, as ``LockService._run`` does."""
        return attempt()

    def service_acquire(self, conn, resource, owner, ttl):
        return self._retrying(
            conn, lambda: self._service_acquire(conn, resource, owner, ttl)
        )

    def service_release(self, conn, resource, owner) -> bool:
        return self._retrying(
            conn, lambda: self._service_release(conn, resource, owner)
        )

    def _service_acquire(self, conn, resource, owner, ttl):
        cur = conn.cursor()
        self._begin(cur)
        row, now = self._read(cur, resource)
        if row is None or row[1] is None:  # no row, or a free one (released)
            action, fence = "acquired", self._next_fence(cur)
        elif row[4] <= now:
            action, fence = "took_over", self._next_fence(cur)
        elif row[1] == owner:
            action, fence = "reacquired", row[2]
        else:
            self._commit(conn, cur)
            return None
        expires = self._plus(now, ttl)
        if row is None:
            cur.execute(
                self._q(
                    "INSERT INTO distributed_locks (resource, owner, fence,"
                    " acquired_at, expires_at) VALUES (?, ?, ?, ?, ?)"
                ),
                (resource, owner, fence, now, expires),
            )
        else:
            cur.execute(
                self._q(
                    "UPDATE distributed_locks SET owner = ?, fence = ?,"
                    " acquired_at = ?, expires_at = ? WHERE id = ?"
                ),
                (owner, fence, now, expires, row[0]),
            )
        previous = row[1] if row is not None else None
        self._event(cur, action, resource, owner, previous, fence, now, expires, now)
        self._commit(conn, cur)
        return (resource, owner, fence, now, expires)

    def _service_release(self, conn, resource, owner) -> bool:
        cur = conn.cursor()
        self._begin(cur)
        row, now = self._read(cur, resource)
        if row is None or row[1] != owner or row[4] <= now:
            self._commit(conn, cur)
            return False
        # Released rows stay, free (owner NULL), as the service leaves them.
        cur.execute(
            self._q(
                "UPDATE distributed_locks SET owner = NULL, expires_at = ? WHERE id = ?"
            ),
            (now, row[0]),
        )
        self._event(cur, "released", resource, owner, owner, row[2], row[3], now, now)
        self._commit(conn, cur)
        return True


class SqliteDriver(_TransactionalDriver):
    name = "sqlite"

    def _begin(self, cur) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def _commit(self, conn, cur) -> None:
        cur.execute("COMMIT")

    def _plus(self, now: str, ttl: float) -> str:
        moment = datetime.fromisoformat(now).replace(tzinfo=UTC)
        return _sqlite_time(moment + timedelta(seconds=ttl))

    def _read(self, cur, resource):
        now = _sqlite_time(datetime.now(UTC))
        cur.execute(
            "SELECT id, owner, fence, acquired_at, expires_at FROM distributed_locks"
            " WHERE resource = ?",
            (resource,),
        )
        return cur.fetchone(), now

    def _next_fence(self, cur) -> int:
        cur.execute(
            "UPDATE lock_fence_counter SET value = value + 1 WHERE id = 1"
            " RETURNING value"
        )
        return cur.fetchone()[0]

    def ideal_acquire(self, conn, resource, owner, ttl):
        """The fence needs the counter row (SQLite has no sequence), so the ideal
        is two statements in one ``BEGIN IMMEDIATE``: bump, then a deciding upsert."""
        now = datetime.now(UTC)
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        fence = self._next_fence(cur)
        cur.execute(
            """
            INSERT INTO distributed_locks AS l
                (resource, owner, fence, acquired_at, expires_at)
            VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (resource) DO UPDATE
            SET owner = excluded.owner, acquired_at = excluded.acquired_at,
                expires_at = excluded.expires_at,
                fence = CASE WHEN l.expires_at > excluded.acquired_at THEN l.fence
                             ELSE excluded.fence END
            WHERE l.expires_at <= excluded.acquired_at OR l.owner = excluded.owner
            RETURNING resource, owner, fence, acquired_at, expires_at
            """,
            (
                resource,
                owner,
                fence,
                _sqlite_time(now),
                _sqlite_time(now + timedelta(seconds=ttl)),
            ),
        )
        row = cur.fetchone()
        cur.execute("COMMIT")
        return row

    def ideal_release(self, conn, resource, owner) -> bool:
        cur = conn.execute(
            "DELETE FROM distributed_locks"
            " WHERE resource = ? AND owner = ? AND expires_at > ?",
            (resource, owner, _sqlite_time(datetime.now(UTC))),
        )
        return cur.rowcount == 1


class MariadbDriver(_TransactionalDriver):
    name = "mariadb"
    placeholder = "%s"

    def _begin(self, cur) -> None:
        pass  # pymysql without autocommit: the first statement opens it

    def _retrying(self, conn, attempt):
        import pymysql

        for _ in range(RETRIES):
            try:
                return attempt()
            except pymysql.err.OperationalError as exc:
                conn.rollback()
                if exc.args[0] not in (1213, 1205):  # deadlock, lock wait timeout
                    raise
        return attempt()

    def _commit(self, conn, cur) -> None:
        conn.commit()

    def _plus(self, now: datetime, ttl: float) -> datetime:
        return now + timedelta(seconds=ttl)

    def _read(self, cur, resource):
        cur.execute(
            "SELECT id, owner, fence, acquired_at, expires_at, UTC_TIMESTAMP(6)"
            " FROM distributed_locks WHERE resource = %s FOR UPDATE",
            (resource,),
        )
        row = cur.fetchone()
        if row is not None:
            return row, row[5]
        cur.execute("SELECT UTC_TIMESTAMP(6)")
        return None, cur.fetchone()[0]

    def _next_fence(self, cur) -> int:
        cur.execute("SELECT nextval(lock_fence_seq)")
        return cur.fetchone()[0]


DRIVERS = {
    "sqlite": SqliteDriver(),
    "postgresql": PostgresDriver(),
    "mariadb": MariadbDriver(),
}


def driver_for(url: str):
    return DRIVERS[backend_of(url)]
