"""``lockkeeper``: the console script, a Flask CLI group bound to ``create_app``.

Only the product's commands are offered: Flask's ``shell`` and ``routes`` and its
``-A/--app`` option are left out (``flask --app app …`` still has them), and
``--version`` is Lockkeeper's. ``-e FILE`` reads the service's environment file
(the one systemd's ``EnvironmentFile=`` names) so a shell acts on the service's
database; its values win over the shell's own.
"""

from __future__ import annotations

import sys

import click
from flask.cli import FlaskGroup, ScriptInfo, run_command

# Commands on the group itself, imported only when named (or listed by
# --help): ``exec`` is the worker client's (httpx), which no other command
# needs, and the app (Flask's views, SQLAlchemy's models) is not imported for
# ``exec`` or ``--version``; every other command builds it anyway.
GROUP_COMMANDS = {"exec": "app.cli.exec"}


def create_app():
    from app.factory import create_app as create

    return create()


def _load_env_file(ctx: click.Context, _param, path: str | None) -> None:
    if path is None:
        return
    import dotenv

    # override: the file was named on purpose; a stale export in the shell
    # must not send the command to another database.
    dotenv.load_dotenv(path, override=True, encoding="utf-8")


ENV_FILE_OPTION = click.Option(
    ["-e", "--env-file"],
    type=click.Path(exists=True, dir_okay=False),
    is_eager=True,
    expose_value=False,
    callback=_load_env_file,
    help="Read LOCKKEEPER_* settings from this file (KEY=value lines, as systemd's "
    "EnvironmentFile=); they win over the shell's environment.",
)


def version_line() -> str:
    """``lockkeeper 0.2.0 (schema 0035)``: the release and the schema revision
    this code needs (read from its migrations, so a build between releases that
    adds one says so)."""
    from lockkeeper_core.schema import required_revisions, shown_revisions

    from app.ops.version import RELEASE

    return f"lockkeeper {RELEASE} (schema {shown_revisions(required_revisions())})"


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(version_line())
    ctx.exit()


VERSION_OPTION = click.Option(
    ["--version"],
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_print_version,
    help="Show the version and the schema revision it needs, and exit.",
)


def _serving_run() -> click.Command:
    """Flask's ``run`` (the development server), which starts a server: the
    first-start work runs here, as under gunicorn, and nowhere else in the CLI."""

    @click.pass_context
    def callback(ctx: click.Context, **params):
        from app.factory import start_serving

        start_serving(ctx.ensure_object(ScriptInfo).load_app())
        return ctx.invoke(run_command.callback, **params)

    return click.Command(
        "run",
        callback=callback,
        params=run_command.params,
        help=run_command.help,
        short_help="Run a development server (production: gunicorn).",
    )


class LockkeeperGroup(FlaskGroup):
    """Flask's group, with ``GROUP_COMMANDS`` found (and imported) by name before
    the app is loaded: ``exec`` must not create or bootstrap a database on the
    worker host that runs it."""

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in GROUP_COMMANDS and name not in self.commands:
            from importlib import import_module

            for command in import_module(GROUP_COMMANDS[name]).COMMANDS:
                self.add_command(command)
        return super().get_command(ctx, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *GROUP_COMMANDS})


def build_cli() -> FlaskGroup:
    cli = LockkeeperGroup(
        create_app=create_app,
        add_default_commands=False,
        add_version_option=False,
        # No .env/.flaskenv picked up from whatever folder the shell is in.
        load_dotenv=False,
        help="Lockkeeper: distributed locks kept in your database.",
    )
    cli.params = [
        ENV_FILE_OPTION,
        *(p for p in cli.params if p.name not in ("env_file", "app")),
    ]
    cli.params.append(VERSION_OPTION)
    cli.add_command(_serving_run())
    return cli


def main() -> None:
    sys.exit(build_cli().main())


__all__ = ["build_cli", "main"]
