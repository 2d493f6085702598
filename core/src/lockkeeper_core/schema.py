"""Is the database at a schema this code may serve on? Asked by the server's
readiness (``/healthz``, ``lockkeeper db current``) and by a worker's embedded
mode before its first lock, with the same rules.

The revision the code needs is the head of its own migration scripts
(``lockkeeper_core/migrations/versions``), read once per process: a new
migration is picked up by the code that ships it, never by a number written
here. The database's revision is the row of the schema's own version table,
``lockkeeper_version``, so that an application's own Alembic history keeps
Alembic's default ``alembic_version`` to itself. Releases up to 0.2 kept the
revision in ``alembic_version``: a database only they migrated is read there,
and the first upgrade by this code copies it over (``lockkeeper_core.upgrade``)
and keeps it equal there while it holds one (``migrations/env.py``), for the
previous release's instances that still read it during a rolling upgrade.

Every migration names the oldest code that may run on its schema
(``oldest_code``: the revision of that code's head; the revision itself when the
previous code would not work on it, as when a function's answer changes shape).
``lockkeeper_core/migrations/env.py`` records it in the database
(``schema_compatibility``), so code that does not know a newer revision can
still read what it admits.

- no version table, or no row: an empty database, not ready;
- a revision the scripts know but not the head: behind (the code is newer than
  the database), not ready;
- the head: ready;
- a revision the scripts do not know (a newer release migrated it): ready if
  the oldest code it admits is one this code knows (at or before its head),
  with a warning; not ready if it admits only newer code, or says nothing.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, inspect, text

from lockkeeper_core.errors import LockError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
UPGRADE_COMMAND = "lockkeeper db upgrade"
VERSION_TABLE = "lockkeeper_version"
# Alembic's default, where releases up to 0.2 kept the schema's revision.
LEGACY_VERSION_TABLE = "alembic_version"
COMPATIBILITY_TABLE = "schema_compatibility"
# A database found ready is looked at again after this long (a downgrade, a
# restore of an older backup); one that is not ready is looked at on every check,
# so an instance turns ready as soon as the upgrade has run.
READY_RECHECK_SECONDS = 30.0


@functools.cache
def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS_DIR))


@functools.cache
def required_revisions() -> frozenset[str]:
    """The heads of this code's migration scripts (one, unless a branch is open)."""
    return frozenset(scripts().get_heads())


@functools.cache
def _known(revision: str) -> bool:
    try:
        return scripts().get_revision(revision) is not None
    except CommandError:  # not one of ours
        return False


@functools.cache
def oldest_code(revision: str) -> str:
    """The oldest code (by its head revision) that may run on ``revision``."""
    return getattr(scripts().get_revision(revision).module, "oldest_code", revision)


def shown_revisions(revisions) -> str:
    return ", ".join(sorted(revisions)) or "none"


@dataclass(frozen=True)
class SchemaState:
    current: frozenset[str]  # empty: no schema at all
    required: frozenset[str]
    # Of a newer revision: the oldest code it admits, as the database records
    # it (None: not recorded).
    admits: str | None = None

    @property
    def newer(self) -> bool:
        return bool(self.current) and not all(_known(rev) for rev in self.current)

    @property
    def code_too_old(self) -> bool:
        """A newer release migrated the database past what this code may run on."""
        return self.newer and not (self.admits is not None and _known(self.admits))

    @property
    def ready(self) -> bool:
        return self.current == self.required or (self.newer and not self.code_too_old)

    @property
    def command(self) -> str | None:
        """What the operator runs to make this code ready, if a command does."""
        return None if self.ready or self.code_too_old else UPGRADE_COMMAND

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
        if self.code_too_old:
            admits = (
                f"admits code of revision {self.admits} or newer"
                if self.admits
                else "does not say which code may run on it"
            )
            return (
                f"the lock database is at revision {self.current_shown}, which"
                f" {admits}; this code is at {self.required_shown}: run the"
                " newer release's code here"
            )
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
                f" migrated it, and it admits code of revision {self.admits} or"
                " newer"
            )
        return None

    def verdict(self) -> str:
        """One line: may this code serve on the database, and why."""
        if self.current == self.required:
            return "ready: this code's head"
        return (
            f"ready: {self.warning()}" if self.ready else f"not ready: {self.problem()}"
        )


def _versions(conn: Connection, table: str) -> frozenset[str]:
    if not inspect(conn).has_table(table):
        return frozenset()
    return frozenset(conn.execute(text(f"SELECT version_num FROM {table}")).scalars())


def legacy_revisions(conn: Connection) -> frozenset[str]:
    """This schema's revisions in ``alembic_version``, where releases up to 0.2
    kept them: its rows that are migrations of ours (another row is an
    application's own Alembic history, and is not ours to read)."""
    return frozenset(
        revision
        for revision in _versions(conn, LEGACY_VERSION_TABLE)
        if _known(revision)
    )


def database_revisions(conn: Connection) -> frozenset[str]:
    """The revisions stamped in the database ``conn`` is connected to: its own
    version table's, or where a release up to 0.2 left them."""
    if inspect(conn).has_table(VERSION_TABLE):
        return _versions(conn, VERSION_TABLE)
    return legacy_revisions(conn)


def admitted_code(conn: Connection, revisions: frozenset[str]) -> str | None:
    """The oldest code the database records for its revision (one head only)."""
    if len(revisions) != 1 or not inspect(conn).has_table(COMPATIBILITY_TABLE):
        return None
    return conn.execute(
        text(
            f"SELECT oldest_code FROM {COMPATIBILITY_TABLE} WHERE revision = :revision"
        ),
        {"revision": next(iter(revisions))},
    ).scalar()


def schema_state(conn: Connection) -> SchemaState:
    current = database_revisions(conn)
    state = SchemaState(current, required_revisions())
    if state.newer:
        state = SchemaState(current, state.required, admitted_code(conn, current))
    return state


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


class SchemaNotReady(LockError):
    """The database's lock schema is missing or behind this code, or a newer
    release's that this code may not run on; the message says what to do."""


# What a worker runs without the server (``lockkeeper_core.__main__``).
CORE_UPGRADE_COMMAND = "python -m lockkeeper_core upgrade URL"


def require_schema(engine: Engine) -> None:
    """Return if this code may run on ``engine``'s database, by the server's
    own rules (``SchemaState``); else raise ``SchemaNotReady`` naming what to
    run, from the server's package or from this one.

    :raise SchemaNotReady: no schema, one behind this code, or a newer one that
        does not admit it.
    """
    with engine.connect() as conn:
        problem = worker_problem(schema_state(conn))
    if problem is not None:
        raise SchemaNotReady(problem)


def worker_problem(state: SchemaState) -> str | None:
    """``state.problem()`` as a worker without the server reads it: the
    command it can run from its own environment too."""
    problem = state.problem()
    if problem is not None and state.command is not None:
        problem += f" (or `{CORE_UPGRADE_COMMAND}` from a worker, without the server)"
    return problem
