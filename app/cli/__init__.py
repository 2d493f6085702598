"""The ``lockkeeper`` commands (the console script is ``app.cli.main``).

One module per command group; each exports ``COMMANDS``. ``exec`` needs no app
(it is a pure HTTP client), so it sits on the group itself and is not registered
with the app's commands.
"""

from __future__ import annotations

from flask import Flask


def register_commands(app: Flask) -> None:
    """The command groups that work on the app's database."""
    from app.cli import database, events, locks, tokens, users
    from app.cli.target import acts_on_database

    for module in (tokens, users, locks, events):
        for command in module.COMMANDS:
            # Every command of these groups names its database on stderr first,
            # and stops if it is not the one meant or not at this code's schema.
            command.callback = acts_on_database
            app.cli.add_command(command)
    for command in database.COMMANDS:
        app.cli.add_command(command)
