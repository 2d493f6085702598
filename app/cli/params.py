"""What the command groups share: parameter types, option shapes, and how an
expected refusal ends a command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import click
from flask.cli import with_appcontext

from app.timestamps import parse_duration


class Duration(click.ParamType):
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def older_than_option(help: str):  # noqa: A002 - click's own keyword
    """The required ``--older-than DURATION`` of the commands that delete old rows."""
    return click.option("--older-than", type=Duration(), required=True, help=help)


@contextmanager
def refusals_reported(*errors: type[Exception]) -> Iterator[None]:
    """One of ``errors`` (the service refusing, with a message for the user) ends
    the command as ``Error: <message>`` with status 1, not a traceback."""
    try:
        yield
    except errors as exc:
        raise click.ClickException(str(exc)) from exc


def name_command(
    group: click.Group,
    name: str,
    call: str,
    *,
    done: str,
    help: str | None = None,  # noqa: A002
) -> click.Command:
    """``GROUP NAME-OF-COMMAND NAME``: one call ``app.auth.service.<call>(NAME)``,
    an ``AuthError`` reported, ``done`` echoed (``{name}`` is NAME quoted).

    The service is imported when the command runs, as in every command: the
    console script starts without loading the app.
    """

    @group.command(name, help=help)
    @click.argument("name")
    @with_appcontext
    def command(name: str) -> None:
        from app.auth import service

        with refusals_reported(service.AuthError):
            getattr(service, call)(name)
        click.echo(done.format(name=repr(name)))

    return command
