"""The database a command acts on: named on stderr before the command runs, and
refused when it cannot be the one the operator meant.

An operator's shell does not have the service's environment (systemd reads
``EnvironmentFile=`` for the service only). Rather than act on an empty local
SQLite file while the service runs on PostgreSQL, a command that finds no
``LOCKKEEPER_DATABASE_URL`` (environment, ``-e FILE`` or ``instance/config.py``)
and no default SQLite database stops and says where the setting goes; and a
command against a database that is not at this code's schema stops and says to
run ``lockkeeper db upgrade``.
"""

from __future__ import annotations

from pathlib import Path

import click
from flask import Flask, current_app
from flask.cli import ScriptInfo, with_appcontext
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from app.config import DEFAULT_DATABASE, database_source

NO_DATABASE = (
    "no database is configured and the default SQLite database {path} does not"
    " exist: set LOCKKEEPER_DATABASE_URL, pass the service's environment file with"
    " `lockkeeper -e FILE …`, or put it in {instance}/config.py"
    " (`lockkeeper db upgrade` creates the default SQLite database on purpose)"
)


def shown_url(app: Flask) -> str:
    """The app's database URL with its password hidden."""
    return make_url(app.config["SQLALCHEMY_DATABASE_URI"]).render_as_string(
        hide_password=True
    )


def name_database(app: Flask, *, may_create: bool = False) -> None:
    """Say which database the command acts on; refuse the SQLite default nobody
    created (unless the command is the one that creates it)."""
    source = database_source(app)
    click.echo(f"lockkeeper: database {shown_url(app)} ({source})", err=True)
    url = make_url(app.config["SQLALCHEMY_DATABASE_URI"])
    if (
        not may_create
        and source == DEFAULT_DATABASE
        and url.get_backend_name() == "sqlite"
        and url.database
        and not Path(url.database).exists()
    ):
        raise click.ClickException(
            NO_DATABASE.format(path=url.database, instance=app.instance_path)
        )


def require_schema(app: Flask) -> None:
    """Stop unless the database is at the schema this code needs."""
    from app.extensions import db
    from app.ops.schema import schema_state

    try:
        with db.engine.connect() as conn:
            state = schema_state(conn)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise click.ClickException(f"the database does not answer: {reason}") from exc
    problem = state.problem()
    if problem is not None:
        raise click.ClickException(problem)


@with_appcontext
def acts_on_database() -> None:
    """The callback of the groups whose commands read or change locks, users,
    tokens and events."""
    app = current_app._get_current_object()
    name_database(app)
    require_schema(app)


def naming_the_database(group: click.Group) -> click.Group:
    """``group`` (Flask-Migrate's ``db``) with the database named before its
    commands run, and ``db upgrade`` saying what it did. Only ``upgrade`` may
    create the default SQLite database."""
    if getattr(group, "_lockkeeper_named", False):
        return group  # a module-level group, met again by the next app
    group._lockkeeper_named = True  # type: ignore[attr-defined]
    original = group.callback

    @click.pass_context
    def callback(ctx: click.Context, **params):
        app = ctx.ensure_object(ScriptInfo).load_app()
        creates = ctx.invoked_subcommand == "upgrade"
        name_database(app, may_create=creates)
        if creates:
            from app.database import secure_files

            secure_files(app, create=True)
        if original is not None:
            return ctx.invoke(original, **params)
        return None

    group.callback = callback
    upgrade = group.commands.get("upgrade")
    if upgrade is not None:
        upgrade.callback = _reporting_upgrade(upgrade.callback)
    return group


def _revisions(app: Flask) -> frozenset[str]:
    from app.extensions import db
    from app.ops.schema import database_revisions

    with app.app_context(), db.engine.connect() as conn:
        return database_revisions(conn)


def _reporting_upgrade(upgrade):
    """Flask-Migrate's ``upgrade``, then one line: from which revision to which
    (Alembic itself prints nothing, as its logging is not configured)."""
    from app.ops.schema import shown_revisions

    @click.pass_context
    def callback(ctx: click.Context, **params):
        app = ctx.ensure_object(ScriptInfo).load_app()
        sql_only = params.get("sql")
        before = None if sql_only else _revisions(app)
        result = ctx.invoke(upgrade, **params)
        if before is not None:
            after = _revisions(app)
            if after == before:
                click.echo(
                    f"Already at revision {shown_revisions(after)}: nothing to do."
                )
            else:
                click.echo(
                    f"Upgraded the database from revision {shown_revisions(before)}"
                    f" to {shown_revisions(after)}."
                )
        return result

    return callback
