"""``lockkeeper db``: what an operator does with the schema.

``upgrade`` (under traffic, see ``app.ops.upgrade``), ``current``, ``history`` and
``check`` (is this database one this code can serve, by the same rule as
``/healthz``). Alembic's developer commands (``revision``, ``migrate``,
``downgrade``, ``stamp``, …) are not offered: they write into the installed
package or move a database backwards under a running fleet. Developers run
Alembic's own commands (``flask --app app db …`` has them).
"""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import with_appcontext
from lockkeeper_core.upgrade import (
    DEFAULT_ATTEMPTS,
    DEFAULT_LOCK_TIMEOUT,
    UpgradeFailed,
)
from sqlalchemy.exc import SQLAlchemyError

from app.cli.target import name_database
from app.ops.upgrade import upgrade


def _does_not_answer(exc: SQLAlchemyError) -> click.ClickException:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return click.ClickException(f"the database does not answer: {reason}")


@click.group("db", help="The database's schema: upgrade it and see where it is.")
def db_group() -> None:
    pass


@db_group.command("upgrade")
@click.option(
    "--lock-timeout",
    type=click.FloatRange(0.1, 600),
    default=DEFAULT_LOCK_TIMEOUT,
    show_default=True,
    help="Seconds a migration may wait for a lock before it is tried again "
    "(the running instances' requests queue behind it that long at most).",
)
@click.option(
    "--attempts",
    type=click.IntRange(1, 100),
    default=DEFAULT_ATTEMPTS,
    show_default=True,
    help="Tries of a migration whose lock wait ran out.",
)
@with_appcontext
def upgrade_command(lock_timeout: float, attempts: int) -> None:
    """Run the migrations this code has and the database has not (each in its
    own transaction; safe while the instances serve, see CHANGELOG.md for the
    migrations that are not additive)."""
    from lockkeeper_core.schema import shown_revisions

    from app.database import secure_files

    app = current_app._get_current_object()
    name_database(app, may_create=True)
    secure_files(app, create=True)
    try:
        done = upgrade(
            app,
            lock_timeout=lock_timeout,
            attempts=attempts,
            report=lambda line: click.echo(f"lockkeeper: {line}", err=True),
        )
    except UpgradeFailed as exc:
        raise click.ClickException(str(exc)) from exc
    except SQLAlchemyError as exc:
        raise _does_not_answer(exc) from exc
    if done.after == done.before:
        click.echo(f"Already at revision {shown_revisions(done.after)}: nothing to do.")
    else:
        click.echo(
            f"Upgraded the database from revision {shown_revisions(done.before)}"
            f" to {shown_revisions(done.after)}."
        )


def _state():
    from lockkeeper_core.schema import schema_state

    from app.extensions import db

    try:
        with db.engine.connect() as conn:
            return schema_state(conn)
    except SQLAlchemyError as exc:
        raise _does_not_answer(exc) from exc


@db_group.command("current")
@with_appcontext
def current_command() -> None:
    """The database's revision, and whether this code can serve on it."""
    name_database(current_app._get_current_object())
    state = _state()
    click.echo(f"{state.current_shown}\t{state.verdict()}")


@db_group.command("history")
@with_appcontext
def history_command() -> None:
    """This code's migrations, oldest first: revision, the oldest code that
    may run on it, and what it does; the database's revision marked."""
    from lockkeeper_core.schema import oldest_code, scripts

    name_database(current_app._get_current_object())
    current = _state().current
    click.echo("revision\toldest code\tdatabase\tmigration")
    for script in reversed(list(scripts().walk_revisions())):
        here = "<- here" if script.revision in current else ""
        click.echo(
            f"{script.revision}\t{oldest_code(script.revision)}\t{here}\t{script.doc.splitlines()[0]}"
        )


@db_group.command("check")
@with_appcontext
def check_command() -> None:
    """Exit 0 when this code can serve on the database (as /healthz decides),
    1 with the reason when it cannot."""
    name_database(current_app._get_current_object())
    state = _state()
    problem = state.problem()
    if problem is not None:
        raise click.ClickException(problem)
    click.echo(f"{state.current_shown}\t{state.verdict()}")


COMMANDS = [db_group]
