"""``lockkeeper``: the console script, a Flask CLI group bound to ``create_app``."""

from __future__ import annotations

import sys

from flask.cli import FlaskGroup

from app.cli import exec as exec_command
from app.factory import create_app


def main() -> None:
    cli = FlaskGroup(
        create_app=create_app,
        help="Lockkeeper: distributed locks kept in your database.",
    )
    # Commands on the group itself are found before FlaskGroup loads the app:
    # `exec` must not create or bootstrap a database on the worker host that runs it.
    for command in exec_command.COMMANDS:
        cli.add_command(command)
    sys.exit(cli.main())
