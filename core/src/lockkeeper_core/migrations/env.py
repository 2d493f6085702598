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

from lockkeeper_core.schema import (
    COMPATIBILITY_TABLE,
    LEGACY_VERSION_TABLE,
    VERSION_TABLE,
    oldest_code,
)
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


def mirror_to_legacy(ctx, step) -> None:
    """While ``alembic_version`` holds this schema's revision (a database that a
    release up to 0.2 migrated), move it with ours, in the same transaction:
    that release's instances read it during a rolling upgrade, to learn (with
    ``schema_compatibility``) whether they may still serve. A row of an
    application's own history is another revision, and is left alone."""
    sources, destinations = step.source_revision_ids, step.destination_revision_ids
    if len(sources) != 1 or len(destinations) != 1:
        return  # from or to nothing, or a merge: no release up to 0.2 made one
    conn = ctx.connection
    if not inspect(conn).has_table(LEGACY_VERSION_TABLE):
        return
    conn.execute(
        text(
            f"UPDATE {LEGACY_VERSION_TABLE} SET version_num = :destination"
            " WHERE version_num = :source"
        ),
        {"source": sources[0], "destination": destinations[0]},
    )


def after_each_step(ctx, step, heads, run_args) -> None:
    record_compatibility(ctx, step, heads, run_args)
    mirror_to_legacy(ctx, step)


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
            on_version_apply=after_each_step,
            version_table=VERSION_TABLE,
            # SQLite alters a table by copying it (the migrations' own
            # ``batch_alter_table``): a script rendered for a new migration does too.
            render_as_batch=True,
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
