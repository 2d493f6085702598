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
from flask.cli import with_appcontext
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
    from lockkeeper_core.schema import schema_state

    from app.extensions import db

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
