"""``lockkeeper users``: dashboard accounts."""

from __future__ import annotations

import sys

import click
from flask.cli import with_appcontext

from app.auth.models import ROLES
from app.cli.params import name_command, refusals_reported

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
    with refusals_reported(AuthError):
        create_user(name, password, role)
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
    with refusals_reported(AuthError):
        set_password(name, password)
    click.echo(f"Set a new password for {name!r}; its sessions have ended.")


users_disable = name_command(
    users,
    "disable",
    "disable_user",
    help="Refuse NAME's logins and end all of its dashboard sessions now.",
    done="Disabled {name}; its sessions have ended.",
)
users_enable = name_command(
    users,
    "enable",
    "enable_user",
    help="Let the disabled account NAME log in again.",
    done="Enabled {name}.",
)
users_delete = name_command(
    users,
    "delete",
    "delete_user",
    help="Remove the account NAME (the first start's 'admin', say) and its sessions.",
    done="Deleted {name}; its sessions have ended.",
)


@users.command("list")
@with_appcontext
def users_list() -> None:
    """Every account: role, status and when it was created."""
    from app.auth.service import list_users, token_clock

    now = token_clock()
    click.echo("name\trole\tstatus\tcreated")
    for user in list_users():
        if user.disabled_at is not None:
            status = "disabled"
        elif user.locked_until is not None and user.locked_until > now:
            status = "locked"
        else:
            status = "active"
        click.echo(
            "\t".join((user.username, user.role, status, user.created_at.isoformat()))
        )


COMMANDS = [users]
