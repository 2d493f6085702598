"""At a server's start on a MariaDB Galera node: the settings it cannot be safe
with make it refuse to start, saying which and what to set.

What the service needs from the node (docs/deploy.md, "Galera"):

- ``wsrep_sync_wait`` with bits 1 and 2 on its own connections, which the
  service sets itself on each (``lockkeeper_core.engine``); a node that refuses it
  refuses the connection. Checked here on a connection of the service's pool.
- ``innodb_flush_log_at_trx_commit = 1``: with 0 or 2 a node that crashes can
  lose commits it acknowledged, a grant among them (Jepsen found lost commits
  on crashes under the recommended settings, 2026); a fence or an event seen
  by a worker must not vanish.
- ``binlog_format = ROW``, which Galera replicates by.
- A fence sequence the cluster orders: ``INCREMENT BY 0`` (each node at its own
  offset: two nodes drawing at once never draw the same value) and no cache
  (every draw written and replicated with its grant, so a node draws above
  the grants it has applied), as migrations 0034 and 0038 leave it. With a
  cache a node hands out values from a block it reserved before another
  node's draws, and the fences of a resource granted by several nodes can go
  backwards.
- The fences of grant events unique (``uq_lock_events_granted_fence``, which
  migration 0040 adds on a Galera node): two nodes can draw the same fence
  while one leaves or joins (their offsets of different cluster sizes), and
  certification compares a unique key, never the sequence's draws.

Off Galera (``wsrep_on`` OFF, or a server without it) nothing is checked.
"""

from __future__ import annotations

from lockkeeper_core.engine import GALERA_SYNC_WAIT
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

GRANTED_FENCES_INDEX = "uq_lock_events_granted_fence"
# What revision 0040 runs on a Galera node whose log holds no fence granted
# twice (it starts the column above the largest one that is).
GRANTED_FENCES_DDL = (
    "ALTER TABLE lock_events ADD COLUMN granted_fence BIGINT AS (CASE WHEN"
    " action IN ('acquired', 'took_over', 'claimed', 'force_claimed') AND"
    " fence > 0 THEN fence END) VIRTUAL, ADD UNIQUE INDEX"
    f" {GRANTED_FENCES_INDEX} (granted_fence)"
)


class UnsafeGaleraNode(RuntimeError):
    """A Galera node with settings the service cannot be safe with."""


def _variables(conn: Connection, *names: str) -> dict[str, str]:
    placeholders = ", ".join(f"'{name}'" for name in names)
    rows = conn.exec_driver_sql(
        f"SHOW VARIABLES WHERE Variable_name IN ({placeholders})"
    ).all()
    return {row[0].lower(): str(row[1]) for row in rows}


def galera_problems(conn: Connection) -> list[str] | None:
    """What is unsafe on the Galera node ``conn`` is on (empty: nothing), or
    None when it is on no Galera node."""
    if conn.dialect.name not in ("mariadb", "mysql"):
        return None
    found = _variables(
        conn,
        "wsrep_on",
        "wsrep_sync_wait",
        "innodb_flush_log_at_trx_commit",
        "binlog_format",
    )
    if found.get("wsrep_on", "OFF").upper() != "ON":
        return None
    problems = []
    sync_wait = int(found.get("wsrep_sync_wait") or 0)
    if sync_wait & GALERA_SYNC_WAIT != GALERA_SYNC_WAIT:
        problems.append(
            f"wsrep_sync_wait is {sync_wait} on the service's connection, which"
            f" needs at least bits {GALERA_SYNC_WAIT} (reads, updates and deletes"
            " wait for what the cluster committed); the service sets it on each"
            " connection: something (init_connect, a proxy) reset it"
        )
    flush = found.get("innodb_flush_log_at_trx_commit")
    if flush != "1":
        problems.append(
            f"innodb_flush_log_at_trx_commit is {flush}: a node that crashes can"
            " lose grants it acknowledged; set it to 1 on every node"
        )
    if found.get("binlog_format", "").upper() != "ROW":
        problems.append(
            f"binlog_format is {found.get('binlog_format')}: Galera replicates"
            " ROW only; set binlog_format=ROW on every node"
        )
    row = conn.execute(
        text("SELECT increment, cache_size FROM lock_fence_seq")
    ).one_or_none()
    if row is not None and (row.increment != 0 or row.cache_size > 0):
        problems.append(
            f"the fence sequence steps by {row.increment} with a cache of"
            f" {row.cache_size}, which the cluster cannot order across nodes:"
            " run `lockkeeper db upgrade` (revisions 0034 and 0038 make it"
            " INCREMENT BY 0 NOCACHE on a Galera node), or, on a database"
            " already upgraded off Galera, `ALTER SEQUENCE lock_fence_seq"
            " INCREMENT BY 0 NOCACHE` on one node"
        )
    if not _has_index(conn, "lock_events", GRANTED_FENCES_INDEX):
        problems.append(
            f"lock_events has no unique index {GRANTED_FENCES_INDEX}: two nodes"
            " could grant the same fence while one leaves or joins. Run"
            " `lockkeeper db upgrade` (revision 0040 adds it on a Galera node),"
            " or, on a database already upgraded off Galera, on one node:"
            f" {GRANTED_FENCES_DDL}"
        )
    return problems


def _has_index(conn: Connection, table: str, name: str) -> bool:
    return bool(
        conn.execute(
            text(
                "SELECT COUNT(*) FROM information_schema.STATISTICS"
                " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :table"
                " AND INDEX_NAME = :name AND NON_UNIQUE = 0"
            ),
            {"table": table, "name": name},
        ).scalar()
    )


def refuse_unsafe_galera(app) -> None:
    """Raise ``UnsafeGaleraNode`` (the server does not start) when the app's
    database is a Galera node with settings it cannot be safe with; say in the
    log what was checked. A database that does not answer is checked by no one
    here: every connection the service opens later still sets its
    ``wsrep_sync_wait`` or fails."""
    from app.extensions import db

    try:
        with app.app_context(), db.engine.connect() as conn:
            problems = galera_problems(conn)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        app.logger.warning("start: Galera settings not checked: %s", reason)
        return
    if problems is None:
        return
    if problems:
        message = "refusing to start on this Galera node: " + "; ".join(problems)
        app.logger.critical("start: %s", message)
        raise UnsafeGaleraNode(message)
    app.logger.info(
        "start: on a Galera node; wsrep_sync_wait, durability, the fence"
        " sequence and the unique granted fences are as the service needs them"
    )
