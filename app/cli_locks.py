"""``lockkeeper locks``: list, force-release and purge locks from a shell."""

from __future__ import annotations

import getpass

import click
from flask.cli import with_appcontext

from app.cli import Duration

locks = click.Group("locks", help="Inspect and administer locks.")


def operator_actor() -> str:
    """Who an operator action from this shell is recorded as: ``cli:<OS user>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER (some containers)
        user = "unknown"
    return f"cli:{user}"


def _fail_on_invalid(exc) -> click.ClickException:
    return click.ClickException(str(exc))


@locks.command("list")
@click.option(
    "--state",
    type=click.Choice(["held", "expiring", "stale", "all"]),
    default="all",
    show_default=True,
)
@click.option("--prefix", help="Only resources starting with this.")
@click.option("--owner", help="Only locks held by this owner.")
@with_appcontext
def locks_list(state: str, prefix: str | None, owner: str | None) -> None:
    """Every matching lock, one per line, tab-separated, ordered by resource."""
    from app.formatting import rfc3339
    from app.locks.errors import InvalidInput
    from app.locks.service import MAX_PAGE, lock_service

    service = lock_service()
    cursor = None
    click.echo(
        "resource\towner\tfence\tstate\tacquired_at\texpires_at\tttl_remaining\ttoken"
    )
    while True:
        try:
            page = service.list_locks(
                state=state, prefix=prefix, owner=owner, limit=MAX_PAGE, cursor=cursor
            )
        except InvalidInput as exc:
            raise _fail_on_invalid(exc) from exc
        for lock in page.items:
            click.echo(
                "\t".join(
                    (
                        lock.resource,
                        lock.owner,
                        str(lock.fence),
                        lock.state.value,
                        rfc3339(lock.acquired_at),
                        rfc3339(lock.expires_at),
                        f"{lock.ttl_remaining:.1f}",
                        lock.token or "",
                    )
                )
            )
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@locks.command("release")
@click.argument("resource")
@click.option("--reason", required=True, help="Why; kept in the audit log.")
@with_appcontext
def locks_release(resource: str, reason: str) -> None:
    """Force-release RESOURCE whoever holds it (recorded as cli:<OS user>)."""
    from app.locks.errors import InvalidInput, LockNotFound
    from app.locks.service import lock_service

    try:
        lock = lock_service().force_release(
            resource, actor=operator_actor(), reason=reason
        )
    except (InvalidInput, LockNotFound) as exc:
        raise _fail_on_invalid(exc) from exc
    click.echo(
        f"Force-released {lock.resource!r} (owner {lock.owner!r}, fence {lock.fence})."
    )


@locks.command("claim")
@click.argument("resource")
@click.option("--owner", required=True, help="The owner the lock is granted to.")
@click.option(
    "--for-token",
    "for_token",
    metavar="NAME",
    help="The API token whose workers may renew and release it. "
    "None: only an operator can end it.",
)
@click.option("--ttl", type=float, help="Seconds (default LOCKKEEPER_DEFAULT_TTL).")
@click.option("--reason", required=True, help="Why; kept in the audit log.")
@click.option("--force", is_flag=True, help="Take it even if someone validly holds it.")
@with_appcontext
def locks_claim(
    resource: str,
    owner: str,
    for_token: str | None,
    ttl: float | None,
    reason: str,
    force: bool,
) -> None:
    """Grant RESOURCE to OWNER with a new fence (recorded as cli:<OS user>)."""
    from app.locks.errors import InvalidInput, LockHeld
    from app.locks.service import lock_service

    try:
        lock = lock_service().claim(
            resource,
            owner,
            ttl,
            actor=operator_actor(),
            reason=reason,
            force=force,
            for_token=for_token,
        )
    except LockHeld as exc:
        raise click.ClickException(f"{exc} (pass --force to take it)") from exc
    except InvalidInput as exc:
        raise _fail_on_invalid(exc) from exc
    token = f"token {lock.token!r}" if lock.token else "no token"
    click.echo(
        f"Claimed {lock.resource!r} for {lock.owner!r} ({token}, fence {lock.fence})."
    )


@locks.command("purge-stale")
@click.option(
    "--older-than",
    type=Duration(),
    required=True,
    help="Delete rows expired for longer than this (e.g. 7d, 12h).",
)
@with_appcontext
def locks_purge_stale(older_than) -> None:
    """Delete long-expired lock rows. Fences stay monotonic: they come from a
    sequence, so a purged resource's next grant still gets a larger fence."""
    from app.locks.errors import InvalidInput
    from app.locks.service import lock_service

    try:
        purged = lock_service().purge_stale(older_than)
    except InvalidInput as exc:
        raise _fail_on_invalid(exc) from exc
    click.echo(f"Purged {len(purged)} stale lock(s).")


COMMANDS = [locks]
