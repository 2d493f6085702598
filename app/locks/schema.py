"""Whether a worker's database holds the lock schema this code needs, for the
embedded mode (the server's own check, with its compatibility rules, is
``app.ops.schema``; both read the same migrations and the same version row).

The schema's revisions are the migration scripts' (``app/migrations``, which
move with the core when it becomes its own distribution); the database's is
Alembic's ``alembic_version`` row, written by ``lockkeeper db upgrade``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from sqlalchemy import Engine, inspect, text

from app.locks.errors import LockError

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
VERSION_TABLE = "alembic_version"
UPGRADE_COMMAND = "lockkeeper db upgrade"


class SchemaNotReady(LockError):
    """The database's lock schema is missing or behind this code; the message
    names the command to run."""


@functools.cache
def _revisions() -> dict[str, tuple[str, ...]]:
    """Each migration's revision and the revisions it follows, read from the
    scripts' text (``revision = ...``, ``down_revision = ...``) without
    importing them: they import the server's models, which need Flask."""
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        values: dict[str, object] = {}
        for node in ast.parse(path.read_text()).body:
            target = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and target.id in (
                "revision",
                "down_revision",
            ):
                values[target.id] = ast.literal_eval(value)
        revision = values.get("revision")
        if not isinstance(revision, str):
            continue
        down = values.get("down_revision")
        if down is None:
            follows: tuple[str, ...] = ()
        elif isinstance(down, str):
            follows = (down,)
        else:
            follows = tuple(down)  # type: ignore[arg-type]
        found[revision] = follows
    return found


def required_revisions() -> frozenset[str]:
    """The heads of the migration scripts: revisions no other one follows."""
    revisions = _revisions()
    followed = {down for downs in revisions.values() for down in downs}
    return frozenset(set(revisions) - followed)


def _known_revisions() -> frozenset[str]:
    return frozenset(_revisions())


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
    required = required_revisions()
    if current == required or (current and not current <= _known_revisions()):
        return
    state = "empty (no lock schema)" if not current else "behind"
    shown = ", ".join(sorted(current)) or "none"
    raise SchemaNotReady(
        f"the lock database is {state}: it is at revision {shown}, this code"
        f" needs {', '.join(sorted(required))}; run `{UPGRADE_COMMAND}` with"
        " LOCKKEEPER_DATABASE_URL set to this database"
    )
