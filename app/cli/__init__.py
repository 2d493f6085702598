"""The ``lockkeeper`` commands (the console script is ``app.cli.main``).

One module per command group; each exports ``COMMANDS``. ``exec`` needs no app
(it is a pure HTTP client), so it sits on the group itself and is not registered
with the app's commands.
"""

from __future__ import annotations

from flask import Flask


def register_commands(app: Flask) -> None:
    """The command groups that work on the app's database."""
    from app.cli import events, locks, tokens, users

    for module in (tokens, users, locks, events):
        for command in module.COMMANDS:
            app.cli.add_command(command)
