"""A set's page: the grants a set acquired as one, and an operator's release of
the set as one (``LockService.set_view``, ``LockService.force_release_set``).

A set is named by the id its acquire answered, which each of its events carries;
the lock page and the history link here from a grant or an event of a set.
"""

from __future__ import annotations

from flask import abort, render_template, request, url_for
from flask_login import current_user
from lockkeeper_core.errors import InvalidInput

from app.auth.views import login_required, operator_required
from app.dashboard.blueprint import bp
from app.dashboard.forms import action_response, finished, reason_field, return_to
from app.extensions import lock_service

GONE = "No set has that id: never acquired, or its events were purged."


def _found(set_id: str):
    """The set, or a 404 (a malformed id names no set either)."""
    try:
        found = lock_service().set_view(set_id)
    except InvalidInput:
        found = None
    if found is None:
        abort(404, description=GONE)
    return found


@bp.get("/sets/<set_id>")
@login_required
def set_page(set_id: str):
    found = _found(set_id)
    return render_template("dashboard/set.html", found=found, now=lock_service().now())


@bp.route("/sets/<set_id>/release", methods=["GET", "POST"])
@operator_required
def release_set(set_id: str):
    """Force-release every grant still held as the set's, in one transaction,
    one event each naming the set and the reason."""
    page = url_for("dashboard.set_page", set_id=set_id)
    found = _found(set_id)
    context = {
        "found": found,
        "next_url": return_to(page),
        "resource": None,
        "title": "Release a set",
    }
    if request.method == "GET":
        return action_response("dashboard/_release_set_form.html", reason="", **context)
    reason = reason_field()
    try:
        done = lock_service().force_release_set(
            set_id, actor=current_user.username, reason=reason
        )
    except InvalidInput as exc:
        return action_response(
            "dashboard/_release_set_form.html",
            400,
            errors=exc.errors,
            reason=reason or "",
            **context,
        )
    if done is None:
        abort(404, description=GONE)
    count = len(done.released)
    message = f"Force-released the set: {count} lock{'' if count == 1 else 's'}"
    if done.released:
        message += " (" + ", ".join(lock.resource for lock in done.released) + ")"
    message += "."
    if done.not_held:
        message += " No longer the set's: " + ", ".join(done.not_held) + "."
    return finished(message, return_to(page))
