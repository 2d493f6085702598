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

    password = _read_password(password_stdin)
    try:
        create_user(name, password, role)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Created {role} {name!r}.")


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)


_PASSWORD_STDIN = click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of stdin instead of a prompt.",
)


@users.command("set-password")
@click.argument("name")
@_PASSWORD_STDIN
@with_appcontext
def users_set_password(name: str, password_stdin: bool) -> None:
    """Give NAME a new password; unlocks it and ends all of its dashboard sessions."""
    from app.auth.service import AuthError, set_password

    password = _read_password(password_stdin)
    try:
        set_password(name, password)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Set a new password for {name!r}; its sessions have ended.")


@users.command("disable")
@click.argument("name")
@with_appcontext
def users_disable(name: str) -> None:
    """Refuse NAME's logins and end all of its dashboard sessions now."""
    from app.auth.service import AuthError, disable_user

    try:
        disable_user(name)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Disabled {name!r}; its sessions have ended.")


@users.command("enable")
@click.argument("name")
@with_appcontext
def users_enable(name: str) -> None:
    """Let the disabled account NAME log in again."""
    from app.auth.service import AuthError, enable_user

    try:
        enable_user(name)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Enabled {name!r}.")


COMMANDS = [users]
