"""Routines installed by revision: Alembic's "replaceable objects" recipe.

A migration that creates or changes a PostgreSQL function or a MariaDB procedure
installs a whole copy of its text frozen under the migration's revision,
``frozen/<revision>/<dialect>/<name>.sql``; a downgrade installs the copy of the
revision it goes back to, named by that revision. A frozen copy is never edited
once a release shipped it: the database a revision leaves is the one it always
left. Migrations read their copies through this module and never import one
another.

The copy a change freezes is the routine's current file at that time
(``lockkeeper_core/statements/sql/``, ``lockkeeper_core.statements.routines``):
the newest copy of each routine equals its current file
(``tests/test_routines.py``). Nothing here reads the current files or the code
that calls them: a revision installs the same text whatever the code beside it.
"""

from __future__ import annotations

from importlib.resources import files

from alembic import op

_FROZEN = files(__package__).joinpath("frozen")
# Where a frozen PostgreSQL text names the schema it is created in (the guard
# pins its search_path to it). Shipped copies hold it: it never changes.
_SCHEMA = "{schema}"


def frozen_text(revision: str, dialect: str, name: str) -> str:
    """The text of routine ``name`` on ``dialect`` as ``revision`` installs it."""
    return _FROZEN.joinpath(revision, dialect, f"{name}.sql").read_text(
        encoding="utf-8"
    )


def frozen_copies() -> dict[tuple[str, str], dict[str, str]]:
    """Every frozen copy: ``{(dialect, name): {revision: text}}``."""
    copies: dict[tuple[str, str], dict[str, str]] = {}
    for revision in _FROZEN.iterdir():
        for dialect in revision.iterdir():
            for copy in dialect.iterdir():
                key = (dialect.name, copy.name.removesuffix(".sql"))
                copies.setdefault(key, {})[revision.name] = copy.read_text(
                    encoding="utf-8"
                )
    return copies


def routine_dialect() -> str | None:
    """``postgresql`` or ``mariadb``: the database this migration runs on, if it
    has routines (SQLite has none)."""
    dialect = op.get_bind().dialect
    if dialect.name == "postgresql":
        return "postgresql"
    if dialect.name == "mariadb" or getattr(dialect, "is_mariadb", False):
        return "mariadb"
    return None


def install(revision: str, *names: str) -> None:
    """Create or replace routines ``names`` on this database as ``revision``
    froze them. A MariaDB procedure is dropped first (it cannot be replaced in
    place by a plain ``CREATE``); a PostgreSQL function whose answer changes must
    be dropped by the migration before (``CREATE OR REPLACE`` cannot change it)."""
    dialect = routine_dialect()
    if dialect is None:
        raise RuntimeError("this database has no routines to install")
    for name in names:
        text = frozen_text(revision, dialect, name)
        if _SCHEMA in text:
            schema = (
                op.get_bind()
                .exec_driver_sql("SELECT quote_ident(current_schema())")
                .scalar()
            )
            text = text.replace(_SCHEMA, schema)
        if dialect == "mariadb":
            op.execute(f"DROP PROCEDURE IF EXISTS {name}")
        op.execute(text)
