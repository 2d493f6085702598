"""The ``lockkeeper`` command: a Flask CLI group bound to ``create_app``."""

from __future__ import annotations

import re
import sys
from datetime import timedelta

import click
from flask import Flask
from flask.cli import FlaskGroup, with_appcontext

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 7d, 12h, 30m or 45s")
    amount, unit = match.groups()
    return timedelta(seconds=float(amount) * _UNITS[unit])


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


tokens = click.Group("tokens", help="API tokens for workers.")


@tokens.command("create")
@click.argument("name")
@click.option(
    "--prefix",
    "prefixes",
    multiple=True,
    help="Only resources starting with this (repeatable). None: every resource.",
)
@click.option("--read-only", is_flag=True, help="GET requests only.")
@click.option(
    "--expires-in",
    type=Duration(),
    help="Refuse the token after this long (e.g. 90d, 12h, 30m).",
)
@click.option(
    "--max-locks",
    type=click.IntRange(min=0),
    help="Most live locks at once; 0: no limit. "
    "Default: LOCKKEEPER_MAX_LOCKS_PER_TOKEN.",
)
@with_appcontext
def tokens_create(
    name: str,
    prefixes: tuple[str, ...],
    read_only: bool,
    expires_in: timedelta | None,
    max_locks: int | None,
) -> None:
    """Create a token; the token is printed alone on the last line, once."""
    from app.auth.service import AuthError, create_token

    try:
        token = create_token(
            name,
            prefixes=prefixes,
            read_only=read_only,
            expires_in=expires_in,
            max_locks=max_locks,
        )
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Created API token {name!r}. Store it now; it is not shown again:")
    click.echo(token)


@tokens.command("list")
@with_appcontext
def tokens_list() -> None:
    """Every token: status, scope, read-only flag, expiry and lock quota."""
    from app.auth.service import list_tokens, token_clock

    now = token_clock()
    click.echo("name\tstatus\tprefixes\taccess\texpires\tmax_locks\tcreated")
    for token in list_tokens():
        if token.revoked_at:
            status = "revoked"
        elif token.expires_at is not None and token.expires_at <= now:
            status = "expired"
        else:
            status = "active"
        prefixes = ",".join(token.prefixes.split("\n")) if token.prefixes else "*"
        click.echo(
            "\t".join(
                (
                    token.name,
                    status,
                    prefixes,
                    "read-only" if token.read_only else "read-write",
                    token.expires_at.isoformat() if token.expires_at else "never",
                    str(token.max_locks) if token.max_locks else "unlimited",
                    token.created_at.isoformat(),
                )
            )
        )


@tokens.command("revoke")
@click.argument("name")
@with_appcontext
def tokens_revoke(name: str) -> None:
    from app.auth.service import AuthError, revoke_token

    try:
        revoke_token(name)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Revoked API token {name!r}.")


def register_commands(app: Flask) -> None:
    """Command groups live beside the face that owns them."""
    from app import cli_events, cli_exec, cli_locks, cli_users

    for command in (
        tokens,
        *cli_users.COMMANDS,
        *cli_locks.COMMANDS,
        *cli_events.COMMANDS,
        *cli_exec.COMMANDS,
    ):
        app.cli.add_command(command)


def _create_cli_app() -> Flask:
    from app import create_app

    return create_app()


def main() -> None:
    cli = FlaskGroup(
        create_app=_create_cli_app,
        help="Lockkeeper: distributed locks kept in your database.",
    )
    # Commands on the group itself are found before FlaskGroup loads the app:
    # `exec` is a pure HTTP client and must not create or bootstrap a database on
    # the worker host that runs it.
    from app.cli_exec import COMMANDS as app_free_commands

    for command in app_free_commands:
        cli.add_command(command)
    sys.exit(cli.main())
