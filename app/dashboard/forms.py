"""What every dashboard page and action reads from a request, and how an action answers.

Actions are plain POST forms with a CSRF token: a GET shows the confirmation form,
the POST acts through the service. htmx gets the form or its result alone
(swapped into ``#action-panel``); a browser without JavaScript gets a page, and
after a success a 303 back to where it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from flask import flash, make_response, redirect, render_template, request

from app.auth.views import safe_next
from app.dashboard.htmx import is_htmx

# Sent with every successful action, so the live table and the lock row refresh.
LOCKS_CHANGED = "locks-changed"

# The usual reasons a confirmation offers beside its free text, per kind of
# action: picked with one key (a <select> selects by first letter, so each list
# starts its entries with different letters), they keep a reasoned action a few
# keystrokes long. The audit keeps the words, and the details typed after them.
USUAL_REASONS = {
    "release": (
        "Dead holder: its host or process is gone",
        "Stuck holder: no progress",
        "Maintenance",
        "Incident response",
    ),
    "freeze": (
        "Maintenance",
        "Incident response",
        "Deploy in progress",
        "Backfill or migration",
    ),
    "unfreeze": (
        "Work finished",
        "Incident resolved",
        "Frozen by mistake",
    ),
}

# The most locks one bulk release names (``operator.release_many``); a bigger
# set is narrowed first, and the overview says so instead of offering it.
BULK_LIMIT = 1000


def stripped(values: Mapping[str, str], name: str) -> str | None:
    """``values[name]`` without surrounding spaces; None when absent or blank."""
    return values.get(name, "").strip() or None


def text_arg(name: str) -> str | None:
    """A query argument, stripped; None when absent or blank."""
    return stripped(request.args, name)


def text_field(name: str) -> str | None:
    """A field of the posted form, stripped; None when absent or blank."""
    return stripped(request.form, name)


def reason_field() -> str | None:
    """The reason a confirmation was given: the usual reason picked
    (``reason_choice``), the text typed (``reason``), or both as
    "picked: typed"; None when neither (the service then asks for one)."""
    picked, typed = text_field("reason_choice"), text_field("reason")
    if picked and typed:
        return f"{picked}: {typed}"
    return picked or typed


def url_with(path: str, **params: Any) -> str:
    """``path`` with the given query; empty values are left out of the URL."""
    query = {key: value for key, value in params.items() if value not in (None, "")}
    return path + (f"?{urlencode(query)}" if query else "")


def return_to(fallback: str = "/") -> str:
    """Where an action goes back to: the form's ``next`` if it is ours, or
    ``fallback``."""
    return safe_next(request.values.get("next")) or fallback


def action_response(template: str, status: int = 200, **context):
    """The confirmation form (or its result) alone for htmx, in a page otherwise."""
    fragment = is_htmx()
    response = make_response(
        render_template(
            "dashboard/action.html",
            form_template=template,
            fragment=fragment,
            **context,
        ),
        status,
    )
    response.vary.add("HX-Request")
    return response


def finished(message: str, fallback: str = "/"):
    """After a successful action: the result in place, or 303 back to the page."""
    if is_htmx():
        response = make_response(
            render_template("dashboard/_result.html", message=message, ok=True)
        )
        response.headers["HX-Trigger"] = LOCKS_CHANGED
        return response
    flash(message, "success")
    return redirect(return_to(fallback), 303)
