"""The database's own routines as they are now (``lockkeeper_core/statements/sql/``).

A migrated database runs exactly the texts of the current files, on PostgreSQL
and on MariaDB: installing every file again over it changes no routine's
definition (``pg_get_functiondef``, ``SHOW CREATE PROCEDURE``: the whole text,
body included), and every routine it has is one of the files. A database that
goes back to the oldest revision and up again, and one that a release's own code
made and this code upgraded, have the same objects as a fresh one (a frozen copy
edited after its release shows there). Every file ships with the package, and
the migrations install the texts from copies frozen by revision, the newest of
each equal to its current file.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import subprocess
import sys
import tomllib
from typing import Any

import pytest
from lockkeeper_core.migrations.replaceable import frozen_copies
from lockkeeper_core.schema import LEGACY_VERSION_TABLE, MIGRATIONS_DIR, scripts
from lockkeeper_core.statements.routines import (
    DIALECTS,
    current_text,
    for_schema,
    routine_names,
)
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection

from app import create_app
from app.extensions import db
from app.ops.upgrade import upgrade
from app.paths import PROJECT_ROOT
from tests.databases import downgrade_schema
from tests.old_release import release_tree

VERSIONS = MIGRATIONS_DIR / "versions"
# The schema heads of the first release and of the newest code this history
# holds before the current work (0.2.0's own tree, 0028, is not in it).
RELEASES = ("0007", "0027")
# Run in the old release's tree: its own code migrates the database.
MIGRATE_WITH_ITS_OWN_CODE = """
from app.factory import create_app, upgrade_schema
upgrade_schema(create_app())
"""

_SCHEMA_FUNCTIONS = """
SELECT p.oid::regprocedure::text AS signature, pg_get_functiondef(p.oid)
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema()
"""


def _functions(conn: Connection) -> dict[str, str]:
    """PostgreSQL: every function of the schema, by signature, as defined."""
    return dict(conn.execute(text(_SCHEMA_FUNCTIONS)).all())


def _procedures(conn: Connection) -> dict[str, tuple[str, ...]]:
    """MariaDB: every routine of the database, by kind and name, as defined."""
    routines = conn.execute(
        text(
            "SELECT routine_type, routine_name FROM information_schema.routines"
            " WHERE routine_schema = DATABASE()"
        )
    ).all()
    return {
        f"{kind} {name}": tuple(
            str(value)
            for value in conn.exec_driver_sql(f"SHOW CREATE {kind} {name}").one()
        )
        for kind, name in routines
    }


def _reinstalled_postgresql(conn: Connection) -> tuple[dict, dict, set[str]]:
    """The functions before and after every current file ran again, and the
    ones those files replaced; all in one transaction, rolled back."""
    before = _functions(conn)
    schema = conn.exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
    for name in routine_names("postgresql"):
        conn.execute(text(for_schema(current_text("postgresql", name), schema)))
    after = _functions(conn)
    # CREATE OR REPLACE writes the function's catalogue row anew, in this
    # transaction, even when nothing in it changes.
    replaced = set(
        conn.scalars(
            text(
                "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
                " JOIN pg_namespace AS n ON n.oid = p.pronamespace"
                " WHERE n.nspname = current_schema()"
                " AND p.xmin = pg_current_xact_id()::xid"
            )
        )
    )
    conn.rollback()
    return before, after, replaced


def _reinstalled_mariadb(conn: Connection) -> tuple[dict, dict, set[str]]:
    """The procedures before and after every current file ran again (dropped
    and created, as a migration installs one: MariaDB's DDL is not rolled back,
    so this runs on a database of this test's own)."""
    before = _procedures(conn)
    for name in routine_names("mariadb"):
        conn.exec_driver_sql(f"DROP PROCEDURE IF EXISTS {name}")
        conn.execute(text(current_text("mariadb", name)))
    after = _procedures(conn)
    replaced = {f"PROCEDURE {name}" for name in routine_names("mariadb")}
    return before, after, replaced


def _schema_objects(conn: Connection) -> dict[str, Any]:
    """Everything a migration makes: tables with their columns, keys and
    indexes, routines, triggers and sequences."""
    found = inspect(conn)
    tables = {}
    for table in sorted(found.get_table_names()):
        tables[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], c.get("default"))
                for c in found.get_columns(table)
            ],
            "primary key": found.get_pk_constraint(table),
            "foreign keys": sorted(map(repr, found.get_foreign_keys(table))),
            "unique": sorted(map(repr, found.get_unique_constraints(table))),
            "indexes": sorted(map(repr, found.get_indexes(table))),
        }
    if conn.dialect.name == "postgresql":
        routines: dict[str, Any] = _functions(conn)
        triggers = dict(
            conn.exec_driver_sql(
                "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
                " WHERE NOT tgisinternal"
            ).all()
        )
        sequences = sorted(
            conn.scalars(
                text(
                    "SELECT sequencename FROM pg_sequences"
                    " WHERE schemaname = current_schema()"
                )
            )
        )
    else:
        routines = _procedures(conn)
        triggers = {
            row[0]: tuple(map(str, row))
            for row in conn.exec_driver_sql("SHOW TRIGGERS").all()
        }
        sequences = []
    return {
        "tables": tables,
        "routines": routines,
        "triggers": triggers,
        "sequences": sequences,
    }


@pytest.fixture
def migrated_app(empty_url, tmp_path):
    """An app on a database of this test's own, migrated to the head."""
    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": empty_url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
        }
    )
    upgrade(app)
    try:
        with app.app_context():
            yield app
    finally:
        with app.app_context():
            db.engine.dispose()


@pytest.mark.usefixtures("backend")
@pytest.mark.backends("postgresql", "mariadb")
def test_the_migrated_database_runs_the_current_routine_files(migrated_app):
    with db.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            before, after, replaced = _reinstalled_postgresql(conn)
        else:
            before, after, replaced = _reinstalled_mariadb(conn)
    assert before, "the migrations left no routine"
    changed = sorted(
        k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
    )
    assert not changed, (
        f"the current files differ from the migrated database in {changed}: a"
        " routine's file changed without a migration that installs it"
    )
    assert replaced == set(before), (
        f"routines with no current file: {sorted(set(before) - replaced)}"
    )


@pytest.mark.usefixtures("backend")
@pytest.mark.backends("postgresql", "mariadb")
def test_back_to_the_oldest_revision_and_up_again_gives_a_fresh_databases_objects(
    migrated_app,
):
    with db.engine.connect() as conn:
        fresh = _schema_objects(conn)
    assert fresh["routines"]
    assert fresh["tables"]
    downgrade_schema(scripts().get_base())
    with db.engine.connect() as conn:
        assert _schema_objects(conn)["routines"] == {}
    upgrade(migrated_app)
    with db.engine.connect() as conn:
        upgraded = _schema_objects(conn)
    for kind in fresh:
        assert upgraded[kind] == fresh[kind], kind


def _objects_at(url: str) -> dict[str, Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return _schema_objects(conn)
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.usefixtures("backend")
@pytest.mark.backends("postgresql", "mariadb")
@pytest.mark.parametrize("release", RELEASES)
def test_a_database_a_release_made_and_this_code_upgraded_has_a_fresh_ones_objects(
    release, database_url, empty_url, tmp_path, tmp_path_factory
):
    """The routines a release's own migrations installed and no later one
    replaced stay as they were: they must be the ones this code's migrations
    install from their frozen copies (``database_url``: this code migrated it
    from nothing)."""
    tree = release_tree(release, tmp_path_factory.getbasetemp())
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(
            str(path) for path in (tree, tree / "core" / "src", tree / "client" / "src")
        ),
        "LOCKKEEPER_DATABASE_URL": empty_url,
        "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "old-instance"),
        "LOCKKEEPER_SECRET_KEY": "old-release",
        "LOCKKEEPER_BOOTSTRAP": "false",
        "LOCKKEEPER_AUTO_MIGRATE": "false",
    }
    made = subprocess.run(
        [sys.executable, "-c", MIGRATE_WITH_ITS_OWN_CODE],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": empty_url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
        }
    )
    try:
        assert upgrade(app).before == {release}
    finally:
        with app.app_context():
            db.engine.dispose()
    upgraded = _objects_at(empty_url)
    # The release kept its revision in Alembic's default table: this code
    # keeps that row in step beside its own (for the release's instances that
    # still read it), and the fresh database never had it.
    assert upgraded["tables"].pop(LEGACY_VERSION_TABLE)
    fresh = _objects_at(database_url)
    # ``database_url`` is this worker's database, which tests before this one
    # may have given tables of their own (a guarded write's table, say): only
    # the schema's tables, and any the upgraded one has, are compared.
    schema_tables = set(db.metadata.tables) | set(upgraded["tables"])
    fresh["tables"] = {
        name: table for name, table in fresh["tables"].items() if name in schema_tables
    }
    for kind in fresh:
        assert upgraded[kind] == fresh[kind], kind


# The lock core's distribution: its pyproject and the folder its packages are in.
DISTRIBUTIONS = {
    PROJECT_ROOT / "core" / "pyproject.toml": PROJECT_ROOT / "core" / "src"
}


@pytest.mark.parametrize("pyproject", DISTRIBUTIONS, ids=lambda path: path.parent.name)
def test_every_routine_file_ships_as_package_data(pyproject):
    """A non-editable install carries the ``.sql`` files: each is matched by a
    ``package-data`` pattern of its package."""
    setuptools = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]
    packages = DISTRIBUTIONS[pyproject]
    files = sorted(packages.rglob("*.sql"))
    assert files
    root = packages if packages.name == "src" else packages.parent
    unshipped = []
    for path in files:
        relative = path.relative_to(PROJECT_ROOT)
        shipped = False
        for package, globs in patterns.items():
            folder = root.joinpath(*package.split("."))
            if folder in path.parents:
                inside = path.relative_to(folder).as_posix()
                shipped = shipped or any(fnmatch.fnmatch(inside, g) for g in globs)
        if not shipped:
            unshipped.append(str(relative))
    assert not unshipped, f"not in {pyproject.name}'s package-data: {unshipped}"


def test_the_newest_frozen_copy_of_each_routine_is_its_current_file():
    """The migrations install frozen copies by revision; the newest copy of a
    routine is the text the head leaves, so it is the current file, byte for
    byte. A changed file needs a migration that freezes it."""
    copies = frozen_copies()
    current = {
        (dialect, name) for dialect in DIALECTS for name in routine_names(dialect)
    }
    assert set(copies) == current
    for (dialect, name), by_revision in sorted(copies.items()):
        newest = max(by_revision)
        assert by_revision[newest] == current_text(dialect, name), (
            f"{dialect}/{name}.sql differs from its copy frozen by {newest}: add a"
            " migration that installs the new text from a copy of its own"
        )


def test_migrations_never_import_one_another():
    """Each migration reads its routines' texts as frozen by revision
    (``lockkeeper_core.migrations.replaceable``), never another migration's module."""
    offenders = []
    for script in sorted(VERSIONS.glob("[0-9]*.py")):
        source = script.read_text()
        if "import_module" in source or "__import__" in source:
            offenders.append(f"{script.name}: imports a module by name")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names]
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                if any(n == "importlib" or ".versions" in n for n in names):
                    offenders.append(f"{script.name}: {ast.unparse(node)}")
    assert not offenders, offenders
