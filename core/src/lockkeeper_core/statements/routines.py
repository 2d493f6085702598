"""The database's own routines as they are now: one ``.sql`` file per PostgreSQL
function and MariaDB procedure, in ``sql/<dialect>/``, beside the statements that
call them (``postgresql.py``, ``holders.py``, ``sessions.py``, ``mariadb.py``;
workers call the guard in their own transactions).

A file holds the routine's whole ``CREATE`` text, the one a migrated database
runs: ``tests/test_routines.py`` holds the database and the files equal. The
migrations never read these files: each installs a frozen copy of the text named
by its revision (``lockkeeper_core/migrations/replaceable.py``). To change a
routine, edit its file here and add a migration that carries a copy of the new
text under its own revision; the test fails until both agree.

The overloaded ``lockkeeper_release`` has two files: ``lockkeeper_release`` (five
arguments, kept for code older than 0017) and ``lockkeeper_release_with_details``
(six, the one the service calls).
"""

from __future__ import annotations

from importlib.resources import files

DIALECTS = ("postgresql", "mariadb")
# The guard pins its search_path to the schema it is created in (PostgreSQL).
SCHEMA_PLACEHOLDER = "{schema}"

_SQL = files(__package__).joinpath("sql")


def routine_names(dialect: str) -> list[str]:
    """The routines of ``dialect`` that have a current text, sorted."""
    return sorted(
        entry.name.removesuffix(".sql")
        for entry in _SQL.joinpath(dialect).iterdir()
        if entry.name.endswith(".sql")
    )


def current_text(dialect: str, name: str) -> str:
    """The current ``CREATE`` text of routine ``name`` on ``dialect``."""
    return _SQL.joinpath(dialect, f"{name}.sql").read_text(encoding="utf-8")


def for_schema(text: str, schema: str) -> str:
    """``text`` for a database whose current schema is ``schema`` (quoted as an
    identifier, as ``quote_ident`` gives it)."""
    return text.replace(SCHEMA_PLACEHOLDER, schema)
