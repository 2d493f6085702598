"""Freezes and the bulk release of stale locks, for operators.

The same pattern as force-release and claim (``views``), answered as ``forms.py``
describes; a success goes back to the overview unless the form says where.
"""

from __future__ import annotations

from datetime import timedelta

from flask import request, url_for
from flask_login import current_user
from lockkeeper_core.errors import InvalidInput, NotFrozen
from lockkeeper_core.filters import ENTRIES_GRANTS
from lockkeeper_core.validation import MAX_BIGINT, client_integer

from app.auth.views import login_required, operator_required
from app.dashboard import forms
from app.dashboard.blueprint import bp
from app.dashboard.forms import (
    action_response,
    finished,
    reason_field,
    return_to,
    stripped,
    text_arg,
    text_field,
)
from app.dashboard.htmx import is_htmx, render_page_or_fragment
from app.extensions import lock_service
from app.timestamps import parse_duration


@bp.get("/freezes")
@login_required
def freezes():
    """The freezes in force; ``?resource=`` narrows to those covering it (the
    banner of a lock page). The banner alone for htmx aiming at ``#freezes``."""
    resource = text_arg("resource")
    service = lock_service()
    found = service.freezes_over(resource) if resource else service.list_freezes()
    return render_page_or_fragment(
        "dashboard/freezes.html",
        {"freezes": "dashboard/_freezes.html"},
        freezes=found,
        now=service.now(),
        # The page of freezes shows the list open; a banner, one line.
        freezes_open=not is_htmx(),
        banner_resource=resource,
        banner_url=request.full_path.rstrip("?"),
        banner_return=(
            url_for("dashboard.lock_page", resource=resource) if resource else "/"
        ),
    )


@bp.route("/freezes/new", methods=["GET", "POST"])
@operator_required
def freeze():
    context = {"next_url": return_to(), "resource": None, "title": "Freeze"}
    if request.method == "GET":
        return action_response(
            "dashboard/_freeze_form.html",
            prefix=request.args.get("prefix", ""),
            reason="",
            duration="",
            **context,
        )
    prefix = text_field("prefix") or ""
    raw_duration = text_field("for") or ""
    reason = reason_field()
    errors: list[tuple[str, str]] = []
    duration: timedelta | None = None
    if raw_duration:
        try:
            duration = parse_duration(raw_duration)
        except ValueError as exc:
            errors.append(("for", str(exc)))
    if not errors:
        try:
            frozen = lock_service().freeze(
                prefix, actor=current_user.username, reason=reason, duration=duration
            )
        except InvalidInput as exc:
            errors = exc.errors
        else:
            until = (
                f"until {frozen.ends_at:%Y-%m-%d %H:%M:%S} UTC"
                if frozen.ends_at
                else "until unfrozen"
            )
            return finished(f"Froze {frozen.prefix}: no new grants {until}.")
    return action_response(
        "dashboard/_freeze_form.html",
        400,
        errors=errors,
        prefix=prefix,
        reason=reason or "",
        duration=raw_duration,
        **context,
    )


@bp.route("/freezes/<prefix>/unfreeze", methods=["GET", "POST"])
@operator_required
def unfreeze(prefix: str):
    current = next(
        (f for f in lock_service().list_freezes() if f.prefix == prefix), None
    )
    context = {
        "next_url": return_to(),
        "resource": None,
        "title": "Unfreeze",
        "freeze": current,
        "prefix": prefix,
        "now": lock_service().now(),
    }
    if request.method == "GET":
        if current is None:  # ended meanwhile: say so, as a page like any other
            return action_response(
                "dashboard/_result.html",
                message=f"{prefix} is not frozen.",
                ok=False,
                **context,
            )
        return action_response("dashboard/_unfreeze_form.html", reason="", **context)
    reason = reason_field()
    try:
        lock_service().unfreeze(prefix, actor=current_user.username, reason=reason)
    except NotFrozen:
        return finished(f"{prefix} was not frozen any more.")
    except InvalidInput as exc:
        return action_response(
            "dashboard/_unfreeze_form.html",
            400,
            errors=exc.errors,
            reason=reason or "",
            **context,
        )
    return finished(f"Unfroze {prefix}: new grants are allowed again.")


@bp.route("/stale/release", methods=["GET", "POST"])
@operator_required
def release_stale():
    """Force-release every stale lock matching the overview's search: its
    owner field is the search's "owner contains", matched as the rows are."""
    prefix = stripped(request.values, "prefix")
    owner = stripped(request.values, "owner")
    service = lock_service()
    context = {
        "next_url": return_to(),
        "resource": None,
        "title": "Release stale locks",
        "prefix": prefix or "",
        "owner": owner or "",
    }
    count, reason = 0, None
    try:
        count = service.count_stale(prefix=prefix, owner_contains=owner)
        if request.method == "GET":
            return action_response(
                "dashboard/_release_stale_form.html", count=count, reason="", **context
            )
        reason = reason_field()
        released = service.release_stale(
            actor=current_user.username,
            reason=reason,
            prefix=prefix,
            owner_contains=owner,
        )
    except InvalidInput as exc:
        return action_response(
            "dashboard/_release_stale_form.html",
            400,
            errors=exc.errors,
            count=count,
            reason=reason or "",
            **context,
        )
    return finished(f"Force-released {len(released)} stale lock(s).")


# -- release many: the selected rows, or every lock a view matches -------------

# What narrows "every lock the view matches" to a set chosen on purpose: a
# search (a prefix, an owner) or a group (an owner, a host). A state tab alone
# does not: one reason for every held lock is an outage, not an action.
NARROWING = ("prefix", "owner", "exact_owner", "host")
UNNARROWED = (
    "only a narrowed set is released together: search for a prefix or an owner, "
    "open a group, or select rows"
)


def _selected(values) -> list[tuple[str, int]]:
    """``lock`` fields as the rows' checkboxes send them: ``FENCE:RESOURCE``."""
    grants = []
    for raw in values.getlist("lock"):
        digits, _, resource = raw.partition(":")
        fence = client_integer(digits, minimum=0, maximum=MAX_BIGINT)
        if fence is None or not resource:
            raise InvalidInput([("locks", f"{raw!r} is not a lock from the table")])
        grants.append((resource, fence))
    return grants


def _matching(args) -> list[tuple[str, int]]:
    """Every grant the view counts (tab, search; an owner or a host of the
    grouped views), with the fence it has now: what the operator confirms.
    A resource held by holders is each of its matching grants (a semaphore's
    holders, shared grants), released by their fences, as an exclusive lock
    is by its own."""
    from app.dashboard.views import host_of

    if not any(stripped(args, key) for key in NARROWING):
        raise InvalidInput([("locks", UNNARROWED)])
    service = lock_service()
    state = args.get("state") or None
    contended = state == "contended"
    host = stripped(args, "host")
    found: list[tuple[str, int]] = []
    cursor = None
    while True:
        page = service.list_locks(
            state=None if contended else state,
            contended=contended,
            prefix=stripped(args, "prefix"),
            owner=stripped(args, "exact_owner"),
            owner_contains=stripped(args, "owner"),
            limit=500,
            cursor=cursor,
            entries=ENTRIES_GRANTS,
        )
        found.extend(
            (lock.resource, lock.fence)
            for lock in page.items
            if host is None or host_of(lock.owner or "") == host
        )
        cursor = page.next_cursor
        if cursor is None or len(found) > forms.BULK_LIMIT:
            break
    if len(found) > forms.BULK_LIMIT:
        raise InvalidInput(
            [
                (
                    "locks",
                    f"more than {forms.BULK_LIMIT:,} locks match: narrow the search (a "
                    "longer prefix, an owner, a host) to release them together",
                )
            ]
        )
    return found


def _confirmed_count(values, count: int) -> None:
    """The count typed to confirm a release of more than one grant: one
    reason for hundreds of locks is not confirmed by a click."""
    if count < 2:
        return
    typed = (values.get("confirm_count") or "").strip().replace(",", "")
    if typed != str(count):
        raise InvalidInput(
            [("confirm_count", f"type {count}, the number released, to confirm")]
        )


def grants_of_locks(released) -> str:
    """How many grants of how many locks ``released`` holds: a resource held
    by holders gives one grant per holder (or shared grant), so the two counts
    differ then ("3 grants of 2 locks"); otherwise they are locks."""
    count = len(released)
    locks = len({grant.resource for grant in released})
    lock_word = "lock" if locks == 1 else "locks"
    if locks == count:
        return f"{count} {lock_word}"
    return f"{count} grants of {locks} {lock_word}"


@bp.route("/release-many", methods=["GET", "POST"])
@operator_required
def release_many():
    """Force-release the selected rows, or every lock the view matches, with
    one reason and one confirmation naming the count. The confirmation carries
    the fences it showed; a lock that changed hands since is left alone."""
    context = {"next_url": return_to(), "resource": None, "title": "Release locks"}
    grants: list[tuple[str, int]] = []
    reason = None
    try:
        if request.method == "GET":
            matching = request.args.get("matching") == "1"
            grants = _matching(request.args) if matching else _selected(request.args)
            return action_response(
                "dashboard/_release_many_form.html", grants=grants, reason="", **context
            )
        grants = _selected(request.form)
        reason = reason_field()
        _confirmed_count(request.form, len(grants))
        done = lock_service().force_release_fenced(
            grants, actor=current_user.username, reason=reason
        )
    except InvalidInput as exc:
        return action_response(
            "dashboard/_release_many_form.html",
            400,
            errors=exc.errors,
            grants=grants,
            reason=reason or "",
            **context,
        )
    message = f"Force-released {grants_of_locks(done.released)}."
    if done.left_alone:
        names = ", ".join(
            f"{c.resource} (now held by {c.holder.owner}, fence {c.holder.fence})"
            if c.holder
            else f"{c.resource} (nobody holds it now)"
            for c in done.left_alone
        )
        message += f" Left alone {len(done.left_alone)} that changed hands: {names}."
    return finished(message)
