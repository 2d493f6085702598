"""Is the database at the schema this code needs?

The revision the code needs is the head of its own migration scripts
(``app/migrations/versions``), read once per process: a new migration is picked up
by the code that ships it, never by a number written here. The database's revision
is Alembic's ``alembic_version`` row.

- no ``alembic_version`` table, or no row: an empty database, not ready;
- a revision the scripts know but not the head: behind, not ready;
- the head: ready;
- a revision the scripts do not know: a newer release migrated it (a rolling
  upgrade whose migration is additive keeps the old instances serving): ready,
  with a warning.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, inspect, text

from app.paths import MIGRATIONS_DIR

UPGRADE_COMMAND = "lockkeeper db upgrade"
VERSION_TABLE = "alembic_version"
# A database found ready is looked at again after this long (a downgrade, a
# restore of an older backup); one that is not ready is looked at on every check,
# so an instance turns ready as soon as the upgrade has run.
READY_RECHECK_SECONDS = 30.0


@functools.cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS_DIR))


@functools.cache
def required_revisions() -> frozenset[str]:
    """The heads of this code's migration scripts (one, unless a branch is open)."""
    return frozenset(_scripts().get_heads())


@functools.cache
def _known(revision: str) -> bool:
    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:  # not one of ours
        return False


def shown_revisions(revisions) -> str:
    return ", ".join(sorted(revisions)) or "none"


@dataclass(frozen=True)
class SchemaState:
    current: frozenset[str]  # empty: no schema at all
    required: frozenset[str]

    @property
    def newer(self) -> bool:
        return bool(self.current) and not all(_known(rev) for rev in self.current)

    @property
    def ready(self) -> bool:
        return self.current == self.required or self.newer

    @property
    def current_shown(self) -> str:
        return shown_revisions(self.current)

    @property
    def required_shown(self) -> str:
        return shown_revisions(self.required)

    def problem(self) -> str | None:
        """Why the code cannot serve on this database, or None."""
        if self.ready:
            return None
        state = "empty (no schema)" if not self.current else "behind"
        return (
            f"the lock database is {state}: it is at revision {self.current_shown},"
            f" this code needs {self.required_shown}; run `{UPGRADE_COMMAND}`"
        )

    def warning(self) -> str | None:
        if self.newer:
            return (
                f"the lock database is at revision {self.current_shown}, which this"
                f" code ({self.required_shown}) does not know: a newer release"
                " migrated it"
            )
        return None


def database_revisions(conn: Connection) -> frozenset[str]:
    """The revisions stamped in the database ``conn`` is connected to."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return frozenset()
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
    return frozenset(rows)


def schema_state(conn: Connection) -> SchemaState:
    return SchemaState(database_revisions(conn), required_revisions())


class SchemaCheck:
    """The last answer of ``schema_state`` in this process, kept while it is ready
    (for ``READY_RECHECK_SECONDS``); asked again every time while it is not."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ready_until = float("-inf")
        self._state: SchemaState | None = None

    def cached(self) -> SchemaState | None:
        """The last state if it is ready and recent enough, else None."""
        if self._clock() < self._ready_until:
            return self._state
        return None

    def check(self, conn: Connection) -> SchemaState:
        state = schema_state(conn)
        with self._lock:
            self._state = state
            self._ready_until = (
                self._clock() + READY_RECHECK_SECONDS if state.ready else float("-inf")
            )
        return state
