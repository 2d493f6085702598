"""The lock schema's migrations, run while the previous release serves: what
``lockkeeper db upgrade`` runs on the server's database, and
``python -m lockkeeper_core upgrade URL`` on a worker's without the server.

Each migration runs in its own transaction with its lock waits bounded
(``bound_lock_waits``, applied by ``lockkeeper_core/migrations/env.py``): one
that cannot take a lock within ``lock_timeout`` seconds rolls back alone, the
ones before it stay done, and it is tried again after a pause, up to
``attempts`` times. Each
wait that ran out is reported with what held the lock (the sessions with the
oldest open transactions on the database, their tables and statements), and a
migration that still fails ends the command with one paragraph, not a traceback.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from lockkeeper_core.engine import engine_for, reads_unbounded
from lockkeeper_core.schema import (
    MIGRATIONS_DIR,
    UPGRADE_COMMAND,
    VERSION_TABLE,
    database_revisions,
    legacy_revisions,
    scripts,
)

LOCK_TIMEOUT_ATTRIBUTE = "lockkeeper.lock_timeout"
# The connection the migrations run on (env.py reads it): the caller's.
CONNECTION_ATTRIBUTE = "connection"
DEFAULT_LOCK_TIMEOUT = 2.0
DEFAULT_ATTEMPTS = 5
# Between attempts: 1 s, 2 s, 4 s, … at most this long.
MAX_PAUSE = 10.0

# PostgreSQL lock_not_available (lock_timeout) and deadlock_detected; MariaDB's
# lock wait timeout (metadata or row) and deadlock.
_LOCK_SQLSTATES = frozenset({"55P03", "40P01"})
_LOCK_ERRNOS = frozenset({1205, 1213})


class UpgradeFailed(Exception):
    """A migration could not run; the message says which, why and what to do."""


@dataclass(frozen=True)
class Upgraded:
    before: frozenset[str]
    after: frozenset[str]


@contextlib.contextmanager
def bound_lock_waits(connection: Connection, seconds: float | None) -> Iterator[None]:
    """Every lock ``connection`` waits for, bounded to ``seconds`` while the
    migrations run; the server's defaults again afterwards (the connection goes
    back to the app's pool)."""
    seconds = DEFAULT_LOCK_TIMEOUT if seconds is None else seconds
    dialect = connection.dialect.name
    if dialect == "postgresql":
        set_, reset = (
            f"SET lock_timeout = '{max(1, round(seconds * 1000))}ms'",
            "RESET lock_timeout",
        )
    elif dialect in ("mysql", "mariadb"):
        whole = max(1, math.ceil(seconds))
        set_ = (
            f"SET SESSION lock_wait_timeout = {whole},"
            f" innodb_lock_wait_timeout = {whole}"
        )
        reset = (
            "SET SESSION lock_wait_timeout = DEFAULT,"
            " innodb_lock_wait_timeout = DEFAULT"
        )
    else:  # SQLite: one writer at a time, bounded by busy_timeout already
        yield
        return
    connection.exec_driver_sql(set_)
    # Alembic opens a transaction per migration only on a connection that is
    # in none: end the one the SET began.
    connection.commit()
    try:
        yield
    finally:
        with contextlib.suppress(SQLAlchemyError):
            connection.rollback()
            connection.exec_driver_sql(reset)
            connection.commit()


def waited_for_a_lock(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    if getattr(orig, "sqlstate", None) in _LOCK_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    return bool(args) and args[0] in _LOCK_ERRNOS


def migration_config(connection: Connection) -> Config:
    """Alembic's configuration for the lock schema's migrations, run on
    ``connection`` (no ini file: nothing in it would be the operator's to set)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes[CONNECTION_ATTRIBUTE] = connection
    return config


def upgrade(
    database: str | Engine,
    target: str = "head",
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    attempts: int = DEFAULT_ATTEMPTS,
    report: Callable[[str], None] = lambda _line: None,
    sleep: Callable[[float], None] = time.sleep,
    command_name: str = UPGRADE_COMMAND,
) -> Upgraded:
    """Run the migrations up to ``target`` on ``database`` (a URL or an
    engine); ``report`` hears of each retry; ``command_name`` is what the
    messages tell the operator to run again."""
    # An engine is used as it is (the server's, set up already); a URL gets the
    # core's setup, its shipped drivers included.
    engine = database if isinstance(database, Engine) else engine_for(database)
    try:
        with engine.connect() as conn:
            before = database_revisions(conn)
            adopt = not inspect(conn).has_table(VERSION_TABLE) and legacy_revisions(
                conn
            )
        if adopt:
            # A database that only releases up to 0.2 migrated keeps its
            # revision in ``alembic_version``: stamped in the schema's own
            # version table first, the migrations go on from there (and
            # ``env.py`` keeps the old row moving with them).
            with engine.connect() as connection, reads_unbounded(connection):
                command.stamp(migration_config(connection), sorted(adopt))
        for attempt in range(1, attempts + 1):
            try:
                with engine.connect() as connection, reads_unbounded(connection):
                    config = migration_config(connection)
                    config.attributes[LOCK_TIMEOUT_ATTRIBUTE] = lock_timeout
                    command.upgrade(config, target)
                break
            except SQLAlchemyError as exc:
                failed = _failed_migration(engine)
                reason = _first_line(exc)
                if not waited_for_a_lock(exc):
                    raise UpgradeFailed(
                        f"migration {failed} failed: {reason}. The migrations before"
                        " it are done; nothing of it is. Fix the cause and run"
                        f" `{command_name}` again."
                    ) from exc
                holders = _lock_holders(engine)
                if attempt == attempts:
                    raise UpgradeFailed(
                        f"migration {failed} could not take its lock within"
                        f" {lock_timeout:g} s in {attempts} attempts ({reason});"
                        f" held by: {holders}. The migrations before it are done."
                        f" Run `{command_name}` again when that is over, or"
                        " give it longer with --lock-timeout."
                    ) from exc
                pause = min(MAX_PAUSE, 2.0 ** (attempt - 1))
                report(
                    f"migration {failed} waited {lock_timeout:g} s for a lock held"
                    f" by: {holders}; trying again in {pause:g} s"
                    f" (attempt {attempt + 1} of {attempts})"
                )
                sleep(pause)
        with engine.connect() as conn:
            after = database_revisions(conn)
    finally:
        if not isinstance(database, Engine):  # made here from a URL
            engine.dispose()
    return Upgraded(before, after)


def _first_line(exc: BaseException) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


def _failed_migration(engine: Engine) -> str:
    """The migration after the database's revision (the one that failed), with
    the first line of its description."""
    with engine.connect() as conn:
        current = database_revisions(conn)
    for script in scripts().walk_revisions():
        down = script.down_revision
        downs = {down} if isinstance(down, str) else set(down or ())
        if downs == set(current) or (not current and not downs):
            return f"{script.revision} ({script.doc.splitlines()[0]})"
    return "?"


_POSTGRESQL_HOLDERS = text(
    """
    SELECT a.pid, a.application_name, a.state,
           extract(epoch FROM clock_timestamp() - a.xact_start) AS seconds,
           left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 80) AS query,
           (SELECT string_agg(DISTINCT c.relname, ', ')
              FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
             WHERE l.pid = a.pid AND l.granted AND c.relkind = 'r') AS tables
      FROM pg_stat_activity a
     WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
       AND a.xact_start IS NOT NULL
     ORDER BY a.xact_start
     LIMIT 3
    """
)
_MARIADB_HOLDERS = text(
    """
    SELECT p.ID, p.USER, p.COMMAND,
           TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6 AS seconds,
           left(regexp_replace(coalesce(p.INFO, ''), '\\\\s+', ' '), 80) AS query,
           t.trx_tables_locked
      FROM information_schema.INNODB_TRX t
      JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
     WHERE p.ID <> CONNECTION_ID() AND p.DB = DATABASE()
     ORDER BY t.trx_started
     LIMIT 3
    """
)


def _lock_holders(engine: Engine) -> str:
    """The sessions with the oldest open transactions on this database: what a
    migration's lock wait queued behind."""
    try:
        with engine.connect() as conn:
            dialect = conn.dialect.name
            if dialect == "postgresql":
                shown = [
                    f"pid {pid} ({app or 'no application_name'}, {state},"
                    f" transaction open {seconds:.1f} s"
                    + (f", locks on {tables}" if tables else "")
                    + (f": {query}" if query else "")
                    + ")"
                    for pid, app, state, seconds, query, tables in conn.execute(
                        _POSTGRESQL_HOLDERS
                    )
                ]
            elif dialect in ("mysql", "mariadb"):
                shown = [
                    f"connection {pid} ({user}, {command_}, transaction open"
                    f" {float(seconds):.1f} s, {tables} tables locked"
                    + (f": {query}" if query else "")
                    + ")"
                    for pid, user, command_, seconds, query, tables in conn.execute(
                        _MARIADB_HOLDERS
                    )
                ]
            else:
                shown = []
    except SQLAlchemyError as exc:
        return f"unknown ({_first_line(exc)})"
    return "; ".join(shown) or (
        "no transaction open now (a stream of short ones, or one that just ended)"
    )
