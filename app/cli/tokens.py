"""``lockkeeper tokens``: API tokens for workers."""

from __future__ import annotations

from datetime import timedelta

import click
from flask.cli import with_appcontext

from app.cli.params import Duration, name_command, refusals_reported

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

    with refusals_reported(AuthError):
        token = create_token(
            name,
            prefixes=prefixes,
            read_only=read_only,
            expires_in=expires_in,
            max_locks=max_locks,
        )
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


tokens_revoke = name_command(
    tokens, "revoke", "revoke_token", done="Revoked API token {name}."
)


COMMANDS = [tokens]
