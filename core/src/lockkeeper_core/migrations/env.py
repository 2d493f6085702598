"""Alembic environment of the lock schema, run by ``lockkeeper_core.upgrade``
on the connection it is handed (``config.attributes["connection"]``): the
server's engine, or a worker's, with no Flask in either case.

Migrations run under traffic (a rolling upgrade): each in its own transaction,
so one that cannot take its lock rolls back alone and the ones before it stay
done; and every lock a migration waits for is bounded (``lock_timeout`` on
PostgreSQL, ``lock_wait_timeout`` and ``innodb_lock_wait_timeout`` on MariaDB),
so a migration never queues the lock traffic behind it for longer than that.
``lockkeeper_core.upgrade`` retries a migration that timed out and names what held it.
"""

from alembic import context
from sqlalchemy import inspect, text

from lockkeeper_core.schema import COMPATIBILITY_TABLE, oldest_code
from lockkeeper_core.upgrade import (
    CONNECTION_ATTRIBUTE,
    LOCK_TIMEOUT_ATTRIBUTE,
    bound_lock_waits,
)

config = context.config


def record_compatibility(ctx, step, heads, run_args) -> None:
    """Write the oldest code an applied revision admits (``oldest_code``) into
    the database, in the migration's transaction; forget it on a downgrade."""
    conn = ctx.connection
    if not inspect(conn).has_table(COMPATIBILITY_TABLE):
        return  # before 0028
    revision = step.up_revision_id
    conn.execute(
        text(f"DELETE FROM {COMPATIBILITY_TABLE} WHERE revision = :revision"),
        {"revision": revision},
    )
    if step.is_upgrade:
        conn.execute(
            text(
                f"INSERT INTO {COMPATIBILITY_TABLE} (revision, oldest_code)"
                " VALUES (:revision, :oldest)"
            ),
            {"revision": revision, "oldest": oldest_code(revision)},
        )


def run_migrations_online() -> None:
    connection = config.attributes[CONNECTION_ATTRIBUTE]
    # SQLite: each migration's transaction takes the write lock as it
    # begins, so it queues on busy_timeout behind a running server's writes
    # (a deferred one upgrading to a writer fails at once, "database is
    # locked"). Ignored elsewhere.
    connection.execution_options(sqlite_immediate=True)
    timeout = config.attributes.get(LOCK_TIMEOUT_ATTRIBUTE)
    with bound_lock_waits(connection, timeout):
        context.configure(
            connection=connection,
            transaction_per_migration=True,
            on_version_apply=record_compatibility,
            # SQLite alters a table by copying it (the migrations' own
            # ``batch_alter_table``): a script rendered for a new migration does too.
            render_as_batch=True,
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
