"""``lockkeeper users``: dashboard accounts."""

from __future__ import annotations

import sys

import click
from flask.cli import with_appcontext

from app.auth.models import ROLES

users = click.Group("users", help="Dashboard accounts (operators and viewers).")


@users.command("create")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="viewer",
    show_default=True,
    help="viewer reads; operator also force-releases and claims locks.",
)
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of stdin instead of a prompt.",
)
@with_appcontext
def users_create(name: str, role: str, password_stdin: bool) -> None:
    """Create the account NAME; the password is never taken as an argument
    (it would land in the shell history and the process list)."""
    from app.auth.service import AuthError, create_user

    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(
            "Password", hide_input=True, confirmation_prompt=True, err=True
        )
    try:
        create_user(name, password, role)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Created {role} {name!r}.")


COMMANDS = [users]
