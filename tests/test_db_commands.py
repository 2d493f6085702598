"""``lockkeeper db``: the operator's commands only, each right on every database;
an upgrade whose lock wait runs out says what held the lock, retries, and ends
in one paragraph (no traceback) with the migrations before it done; every
migration names the oldest code that may run on it, and the database records it."""

from __future__ import annotations

import threading

import pytest
from alembic.script import ScriptDirectory
from lockkeeper_core.schema import (
    LEGACY_VERSION_TABLE,
    MIGRATIONS_DIR,
    VERSION_TABLE,
    database_revisions,
    oldest_code,
    required_revisions,
    schema_state,
    scripts,
)
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from app.ops.upgrade import upgrade

pytestmark = pytest.mark.usefixtures("backend")


def test_db_offers_the_operators_commands_only(app):
    result = app.test_cli_runner().invoke(args=["db", "--help"])
    assert result.exit_code == 0, result.output
    listed = [
        line.split()[0]
        for line in result.output.split("Commands:")[1].splitlines()
        if line.strip()
    ]
    assert listed == ["check", "current", "history", "upgrade"]


def test_db_check_and_current_say_ready_on_a_migrated_database(app):
    runner = app.test_cli_runner()
    (head,) = ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()
    for command in ("check", "current"):
        result = runner.invoke(args=["db", command])
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == f"{head}\tready: this code's head"


def test_db_check_fails_naming_the_command_on_a_database_behind(make_app, empty_url):
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app, "0026")
    result = app.test_cli_runner().invoke(args=["db", "check"])
    assert result.exit_code == 1
    assert "at revision 0026" in result.output
    assert "run `lockkeeper db upgrade`" in result.output
    current = app.test_cli_runner().invoke(args=["db", "current"])
    assert current.exit_code == 0
    assert current.stdout.startswith("0026\tnot ready: ")


def test_db_history_lists_every_revision_and_the_oldest_code_it_admits(app):
    result = app.test_cli_runner().invoke(args=["db", "history"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()[1:]]
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    revisions = [s.revision for s in reversed(list(scripts.walk_revisions()))]
    assert [row[0] for row in rows] == revisions
    assert [row[1] for row in rows] == [oldest_code(r) for r in revisions]
    assert [row[2] for row in rows].count("<- here") == 1
    assert rows[-1][2] == "<- here"


@pytest.mark.backends("sqlite")  # a property of the scripts: one database does
def test_every_migration_names_an_oldest_code_at_or_before_itself():
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    for script in scripts.walk_revisions():
        declared = getattr(script.module, "oldest_code", None)
        assert declared is not None, f"{script.revision} names no oldest_code"
        older = {s.revision for s in scripts.iterate_revisions(script.revision, "base")}
        assert declared in older, (script.revision, declared)


def test_the_database_records_what_each_applied_revision_admits(database_url):
    engine = create_engine(normalize_database_url(database_url))
    try:
        with engine.connect() as conn:
            recorded = dict(
                conn.execute(
                    text("SELECT revision, oldest_code FROM schema_compatibility")
                ).all()
            )
    finally:
        engine.dispose()
    # Every revision applied once the table was there (0028 created it).
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    since = [s.revision for s in scripts.walk_revisions() if s.revision >= "0028"]
    assert recorded == {revision: oldest_code(revision) for revision in since}


@pytest.mark.backends("postgresql", "mariadb")
def test_an_upgrade_that_cannot_take_its_lock_names_the_holder_and_stops_cleanly(
    backend, make_app, empty_url
):
    """A transaction holds distributed_locks (a worker's, or an operator's
    shell): 0026's index change waits at most --lock-timeout, is tried again,
    then `db upgrade` ends naming the holder, 0025 still done."""
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app, "0025")
    holder = create_engine(normalize_database_url(empty_url))
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.connect() as conn:
            if backend == "postgresql":
                conn.execute(text("SET application_name = 'the-blocker'"))
                conn.execute(text("LOCK TABLE distributed_locks IN SHARE MODE"))
            else:  # an open transaction that read the table holds its metadata lock
                conn.execute(text("SELECT count(*) FROM distributed_locks"))
            holding.set()
            release.wait(60)
            conn.rollback()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(30)
        result = app.test_cli_runner().invoke(
            args=["db", "upgrade", "--lock-timeout", "0.5", "--attempts", "2"]
        )
    finally:
        release.set()
        thread.join(30)
        holder.dispose()
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    retried, failed = [
        line for line in result.stderr.splitlines() if "migration 0026" in line
    ]
    assert "trying again in 1 s (attempt 2 of 2)" in retried
    assert "could not take its lock" in failed
    assert "The migrations before it are done." in failed
    if backend == "postgresql":
        assert "the-blocker" in failed
        assert "distributed_locks" in failed
    else:
        assert "transaction open" in failed
    # 0026 rolled back alone; a later upgrade goes on from 0025.
    current = app.test_cli_runner().invoke(args=["db", "current"])
    assert current.stdout.startswith("0025\t")
    done = app.test_cli_runner().invoke(args=["db", "upgrade"])
    assert done.exit_code == 0, done.output
    assert "Upgraded the database from revision 0025 to" in done.stdout


# -- the schema's own version table ---------------------------------------------

APPLICATIONS_OWN = "a1b2c3d4e5f6"  # a revision of an application's own history


def _versions(conn, table: str) -> set[str]:
    return set(conn.execute(text(f"SELECT version_num FROM {table}")).scalars())


def _legacy_table(conn, *revisions: str) -> None:
    """``alembic_version`` as Alembic makes it, holding ``revisions``."""
    conn.execute(
        text(
            f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32) NOT NULL,"
            f" CONSTRAINT {LEGACY_VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
        )
    )
    for revision in revisions:
        conn.execute(
            text(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES (:r)"), {"r": revision}
        )


def test_the_schema_keeps_its_revision_beside_an_applications_own_history(
    make_app, empty_url
):
    """A worker's application that runs its own Alembic migrations in the same
    database keeps ``alembic_version`` to itself: the lock schema's revision is
    in ``lockkeeper_version``, and the application's row is neither read as
    ours nor moved."""
    engine = create_engine(normalize_database_url(empty_url))
    try:
        with engine.begin() as conn:
            _legacy_table(conn, APPLICATIONS_OWN)
            assert database_revisions(conn) == frozenset()
        app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
        done = upgrade(app)
        assert done.before == frozenset()
        with engine.connect() as conn:
            assert _versions(conn, VERSION_TABLE) == set(required_revisions())
            assert _versions(conn, LEGACY_VERSION_TABLE) == {APPLICATIONS_OWN}
            assert schema_state(conn).ready
    finally:
        engine.dispose()


def test_a_database_a_release_up_to_0_2_migrated_is_taken_over_and_kept_in_step(
    make_app, empty_url
):
    """Releases up to 0.2 kept the revision in ``alembic_version``: it is read
    there, the first upgrade stamps the schema's own table from it and goes on,
    and the old row moves with each migration (that release's instances read it
    during a rolling upgrade)."""
    (head,) = required_revisions()
    previous = scripts().get_revision(head).down_revision
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app, previous)
    engine = create_engine(normalize_database_url(empty_url))
    try:
        with engine.begin() as conn:  # as an older release left it
            conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
            _legacy_table(conn, previous)
        with engine.connect() as conn:
            assert database_revisions(conn) == {previous}
            assert not schema_state(conn).ready
        done = upgrade(app)
        assert (done.before, done.after) == ({previous}, {head})
        with engine.connect() as conn:
            assert _versions(conn, VERSION_TABLE) == {head}
            assert _versions(conn, LEGACY_VERSION_TABLE) == {head}
            assert schema_state(conn).ready
    finally:
        engine.dispose()
