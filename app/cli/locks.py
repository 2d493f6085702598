"""``lockkeeper locks``: list, force-release and purge locks from a shell."""

from __future__ import annotations

import getpass

import click
from flask.cli import with_appcontext

from app.cli.params import Duration, older_than_option, refusals_reported

locks = click.Group("locks", help="Inspect and administer locks.")


def operator_actor() -> str:
    """Who an operator action from this shell is recorded as: ``cli:<OS user>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER (some containers)
        user = "unknown"
    return f"cli:{user}"


class ChangedHands(click.ClickException):
    """The grant confirmed by ``--fence`` is no longer the lock's: nothing was done."""

    exit_code = 3


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
    """Every matching grant, one per line, tab-separated, ordered by resource:
    each holder of a semaphore and each shared grant a line of its own."""
    from lockkeeper_core.errors import InvalidInput
    from lockkeeper_core.filters import ENTRIES_GRANTS
    from lockkeeper_core.pagination import MAX_PAGE

    from app.extensions import lock_service
    from app.timestamps import rfc3339

    service = lock_service()
    cursor = None
    click.echo(
        "resource\towner\tfence\tstate\tacquired_at\texpires_at\tttl_remaining"
        "\ttoken\tmode\tlimit"
    )
    while True:
        with refusals_reported(InvalidInput):
            page = service.list_locks(
                state=state,
                prefix=prefix,
                owner=owner,
                limit=MAX_PAGE,
                cursor=cursor,
                entries=ENTRIES_GRANTS,
            )
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
                        lock.mode,
                        str(lock.limit),
                    )
                )
            )
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@locks.command("release")
@click.argument("resource", required=False)
@click.option("--reason", help="Why; kept in the audit log (required).")
@click.option(
    "--fence",
    "fences",
    type=click.IntRange(min=1),
    multiple=True,
    help="Release only the grant with this fence (refused if it changed hands); "
    "repeat it for several grants of a resource held by places. None: every "
    "grant of RESOURCE.",
)
@click.option(
    "--stale",
    is_flag=True,
    help="Instead of RESOURCE: every stale lock (narrowed by --prefix/--owner).",
)
@click.option("--prefix", help="With --stale: only resources starting with this.")
@click.option("--owner", help="With --stale: only locks of this owner.")
@with_appcontext
def locks_release(
    resource: str | None,
    reason: str | None,
    fences: tuple[int, ...],
    stale: bool,
    prefix: str | None,
    owner: str | None,
) -> None:
    """Force-release RESOURCE whoever holds it (every grant of a resource held
    by holders: a semaphore's, shared grants), or with --stale every stale lock
    (recorded as cli:<OS user>, one event per grant)."""
    from lockkeeper_core.errors import InvalidInput, LockNotFound

    from app.extensions import lock_service

    if stale == (resource is not None):
        raise click.UsageError("give either RESOURCE or --stale")
    if not stale and (prefix is not None or owner is not None):
        raise click.UsageError("--prefix and --owner go with --stale")
    if stale and fences:
        raise click.UsageError("--fence goes with RESOURCE")
    service = lock_service()
    if stale:
        with refusals_reported(InvalidInput):
            released = service.release_stale(
                actor=operator_actor(), reason=reason, prefix=prefix, owner=owner
            )
        for lock in released:
            click.echo(f"{lock.resource}\t{lock.owner}\t{lock.fence}")
        click.echo(f"Force-released {len(released)} stale lock(s).")
        return
    try:
        done = service.force_release_all(
            resource, actor=operator_actor(), reason=reason, fences=fences or None
        )
    except (InvalidInput, LockNotFound) as exc:
        raise click.ClickException(str(exc)) from exc
    for lock in done.released:
        mode = "" if lock.mode == "exclusive" else f", {lock.mode}"
        click.echo(
            f"Force-released {lock.resource!r} "
            f"(owner {lock.owner!r}, fence {lock.fence}{mode})."
        )
    if done.gone:
        gone = ", ".join(str(fence) for fence in done.gone)
        now = "; ".join(
            f"held by {lock.owner!r} with fence {lock.fence}"
            for lock in done.left_alone
        )
        outcome = (
            "the others confirmed were released"
            if done.released
            else "nothing was released"
        )
        raise ChangedHands(
            f"no grant of {resource!r} carries fence {gone} any more (it changed "
            f"hands or ended since it was confirmed); it is now "
            f"{now or 'held by nobody'}; {outcome}."
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
@click.option(
    "--reason",
    help="Why; kept in the audit log (required to take it from a valid holder).",
)
@click.option("--force", is_flag=True, help="Take it even if someone validly holds it.")
@click.option(
    "--fence",
    type=click.IntRange(min=1),
    help="Claim only if the grant in place has this fence (refused if it changed "
    "hands or ended).",
)
@click.option(
    "--mode",
    type=click.Choice(["exclusive", "shared"]),
    default="exclusive",
    show_default=True,
    help="shared: a shared grant beside the readers (of a free resource too).",
)
@with_appcontext
def locks_claim(
    resource: str,
    owner: str,
    for_token: str | None,
    ttl: float | None,
    reason: str | None,
    force: bool,
    fence: int | None,
    mode: str,
) -> None:
    """Grant RESOURCE to OWNER with a new fence (recorded as cli:<OS user>); of
    a semaphore, one free place."""
    from lockkeeper_core.errors import (
        HeldByHolders,
        InvalidInput,
        LockChanged,
        LockHeld,
        ResourceFrozen,
    )

    from app.extensions import lock_service

    try:
        lock = lock_service().claim(
            resource,
            owner,
            ttl,
            actor=operator_actor(),
            reason=reason,
            force=force,
            for_token=for_token,
            expected_fence=fence,
            mode=mode,
        )
    except LockChanged as exc:
        raise ChangedHands(f"{exc}; nothing was claimed.") from exc
    except HeldByHolders as exc:
        raise click.ClickException(f"{exc}; nothing was claimed.") from exc
    except LockHeld as exc:
        raise click.ClickException(f"{exc} (pass --force to take it)") from exc
    except ResourceFrozen as exc:
        raise click.ClickException(f"{exc} (pass --force to claim it anyway)") from exc
    except InvalidInput as exc:
        raise click.ClickException(str(exc)) from exc
    token = f"token {lock.token!r}" if lock.token else "no token"
    kind = "" if lock.mode == "exclusive" else f", {lock.mode}"
    if lock.limit > 1:
        kind = f", one place of {lock.limit}"
    click.echo(
        f"Claimed {lock.resource!r} for {lock.owner!r} "
        f"({token}, fence {lock.fence}{kind})."
    )


@locks.command("freeze")
@click.argument("prefix")
@click.option("--reason", help="Why; kept in the audit log (required).")
@click.option(
    "--for",
    "duration",
    type=Duration(),
    help="End the freeze by itself after this long (e.g. 30m, 2h); default: never.",
)
@with_appcontext
def locks_freeze(prefix: str, reason: str | None, duration) -> None:
    """No new grants of resources starting with PREFIX (no acquire, take-over or
    claim without force); locks already held can still be renewed and released."""
    from lockkeeper_core.errors import InvalidInput

    from app.extensions import lock_service

    with refusals_reported(InvalidInput):
        freeze = lock_service().freeze(
            prefix, actor=operator_actor(), reason=reason, duration=duration
        )
    click.echo(f"Froze {freeze.prefix!r} {_until(freeze)}.")


@locks.command("unfreeze")
@click.argument("prefix")
@click.option("--reason", help="Why; kept in the audit log (required).")
@with_appcontext
def locks_unfreeze(prefix: str, reason: str | None) -> None:
    """End the freeze of PREFIX now."""
    from lockkeeper_core.errors import InvalidInput, NotFrozen

    from app.extensions import lock_service

    with refusals_reported(InvalidInput, NotFrozen):
        freeze = lock_service().unfreeze(prefix, actor=operator_actor(), reason=reason)
    click.echo(f"Unfroze {freeze.prefix!r} (frozen for: {freeze.reason}).")


@locks.command("freezes")
@with_appcontext
def locks_freezes() -> None:
    """The freezes in force, one per line, tab-separated."""
    from app.extensions import lock_service
    from app.timestamps import rfc3339

    click.echo("prefix\tends_at\tactor\treason")
    for freeze in lock_service().list_freezes():
        ends = rfc3339(freeze.ends_at) if freeze.ends_at else "-"
        reason = " ".join(freeze.reason.split())
        click.echo(f"{freeze.prefix}\t{ends}\t{freeze.actor}\t{reason}")


def _until(freeze) -> str:
    from app.timestamps import rfc3339

    if freeze.ends_at is None:
        return "until unfrozen"
    return f"until {rfc3339(freeze.ends_at)}"


@locks.command("purge-stale")
@older_than_option("Delete rows expired for longer than this (e.g. 7d, 12h).")
@with_appcontext
def locks_purge_stale(older_than) -> None:
    """Delete long-expired lock rows. Fences stay monotonic: they come from a
    sequence, so a purged resource's next grant still gets a larger fence."""
    from lockkeeper_core.errors import InvalidInput

    from app.extensions import lock_service

    with refusals_reported(InvalidInput):
        purged = lock_service().purge_stale(older_than)
    click.echo(f"Purged {len(purged)} stale lock(s).")


COMMANDS = [locks]
