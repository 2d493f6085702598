"""Whether a worker's database holds the lock schema this code needs, for the
embedded mode (the server's own check, with its compatibility rules, is
``app.ops.schema``; both read the same version row).

The schema's migrations are the server's (``app/migrations``, applied by
``lockkeeper db upgrade``); the database's revision is Alembic's
``alembic_version`` row. This distribution does not carry the migration
scripts, so it names the revision it was written for: ``SCHEMA_REVISION``,
which the server's test suite holds equal to the scripts' head. Revisions are
numbered in the order they run (``0001``, ``0002``…; that test checks it
too), so a higher number is a newer release's schema.
"""

from __future__ import annotations

from sqlalchemy import Engine, inspect, text

from lockkeeper_core.errors import LockError

# The head of the server's migrations that this code runs against: a migration
# that changes what the core reads or writes moves it.
SCHEMA_REVISION = "0037"
VERSION_TABLE = "alembic_version"
UPGRADE_COMMAND = "lockkeeper db upgrade"


class SchemaNotReady(LockError):
    """The database's lock schema is missing or behind this code; the message
    names the command to run."""


def _is_behind(revision: str) -> bool:
    """Older than ``SCHEMA_REVISION``; a revision not numbered as ours is a
    newer release's, whose own readiness rule is the server's."""
    return revision.isdigit() and int(revision) < int(SCHEMA_REVISION)


def require_schema(engine: Engine) -> None:
    """Return if ``engine``'s database is at this code's head (or at a newer
    revision, which a newer release wrote: its own readiness rule is the
    server's); else raise ``SchemaNotReady`` naming what to run.

    :raise SchemaNotReady: no schema, or one behind this code.
    """
    with engine.connect() as conn:
        if inspect(conn).has_table(VERSION_TABLE):
            current = frozenset(
                conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
            )
        else:
            current = frozenset()
    if current and not any(_is_behind(revision) for revision in current):
        return
    state = "empty (no lock schema)" if not current else "behind"
    shown = ", ".join(sorted(current)) or "none"
    raise SchemaNotReady(
        f"the lock database is {state}: it is at revision {shown}, this code"
        f" needs {SCHEMA_REVISION}; run `{UPGRADE_COMMAND}` with"
        " LOCKKEEPER_DATABASE_URL set to this database"
    )
