"""``lockkeeper``: the console script, a Flask CLI group bound to ``create_app``.

Only the product's commands are offered: Flask's ``shell`` and ``routes`` and its
``-A/--app`` option are left out (``flask --app app …`` still has them), and
``--version`` is Lockkeeper's. ``-e FILE`` reads the service's environment file
(the one systemd's ``EnvironmentFile=`` names) so a shell acts on the service's
database; its values win over the shell's own.
"""

from __future__ import annotations

import sys
from importlib import metadata

import click
from flask.cli import FlaskGroup, ScriptInfo, run_command

from app.cli import exec as exec_command
from app.factory import create_app, start_serving


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


def _version() -> str:
    try:
        return metadata.version("lockkeeper")
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return "unknown"


def _serving_run() -> click.Command:
    """Flask's ``run`` (the development server), which starts a server: the
    first-start work runs here, as under gunicorn, and nowhere else in the CLI."""

    @click.pass_context
    def callback(ctx: click.Context, **params):
        start_serving(ctx.ensure_object(ScriptInfo).load_app())
        return ctx.invoke(run_command.callback, **params)

    return click.Command(
        "run",
        callback=callback,
        params=run_command.params,
        help=run_command.help,
        short_help="Run a development server (production: gunicorn).",
    )


def build_cli() -> FlaskGroup:
    cli = FlaskGroup(
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
    click.version_option(
        _version(), "--version", prog_name="lockkeeper", message="%(prog)s %(version)s"
    )(cli)
    cli.add_command(_serving_run())
    # Commands on the group itself are found before FlaskGroup loads the app:
    # `exec` must not create or bootstrap a database on the worker host that runs it.
    for command in exec_command.COMMANDS:
        cli.add_command(command)
    return cli


def main() -> None:
    sys.exit(build_cli().main())


__all__ = ["build_cli", "main"]
