"""Operator login: /login, /logout, the user loader and the role decorators.

Other faces import ``login_required`` and ``operator_required`` from here.
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    abort,
    flash,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_login import current_user, login_user, logout_user
from flask_login import login_required as _flask_login_required

from app.auth import address_limit
from app.auth.login import LoginLocked, LoginRefused, authenticate
from app.auth.models import User
from app.auth.sessions import end_session, load_session, start_session
from app.extensions import login_manager

bp = Blueprint("auth", __name__)

login_manager.login_view = "auth.login"
login_manager.login_message = "Please log in to see this page."
login_manager.login_message_category = "info"
# What a page that was open (polling, or an action) says when its session is gone.
SESSION_ENDED_MESSAGE = "Your session has ended; log in again to go on."
# "strong" drops the session when the client's address or agent changes.
login_manager.session_protection = "strong"


@login_manager.user_loader
def load_user(session_token: str) -> User | None:
    """The user of the live server-side session the cookie names."""
    return load_session(session_token)


@login_manager.unauthorized_handler
def unauthorized():
    """Send the browser to /login, keeping where it wanted to go.

    During an htmx request a 302 would be followed by fetch() and the login page
    swapped into the table; 401 with ``HX-Redirect`` makes htmx load it as a page.
    """
    target = request.full_path if request.method == "GET" else None
    if target and target.endswith("?"):
        target = target[:-1]
    if request.headers.get("HX-Request") == "true":
        # A polled fragment URL is no page to come back to: use the page shown.
        current = request.headers.get("HX-Current-URL")
        next_url = safe_next(current) if current else None
        flash(SESSION_ENDED_MESSAGE, "info")
        response = make_response(SESSION_ENDED_MESSAGE, 401)
        response.headers["HX-Redirect"] = url_for("auth.login", next=next_url)
        return response
    flash(login_manager.login_message, login_manager.login_message_category)
    return redirect(url_for("auth.login", next=safe_next(target)))


#: Any logged-in user, viewer or operator.
login_required = _flask_login_required


def operator_required(view):
    """A logged-in operator; a viewer gets 403."""

    @wraps(view)
    def wrapped(*args, **kwargs):
        if not current_user.is_authenticated:
            return login_manager.unauthorized()
        if not current_user.can_act:
            abort(403, description="Only operators may do this; you are a viewer.")
        return view(*args, **kwargs)

    return wrapped


def safe_next(target: str | None) -> str | None:
    """A local path to return to after login, never another site.

    Control characters are refused outright: CR/LF would split the Location
    header, and browsers drop tabs and newlines from URLs (``/\t/evil.example``
    would become ``//evil.example``).
    """
    if not target or any(ord(c) < 32 or ord(c) == 127 for c in target):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        # An absolute URL is accepted only for this very host (HX-Current-URL).
        if parts.netloc != request.host:
            return None
        target = parts.path + (f"?{parts.query}" if parts.query else "")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    return target


@bp.route("/login", methods=["GET", "POST"])
def login():
    next_url = safe_next(request.values.get("next"))
    if current_user.is_authenticated and request.method == "GET":
        return redirect(next_url or "/")
    error = None
    status = 200
    username = ""
    if request.method == "POST":
        username = request.form.get("username", "").strip()
        password = request.form.get("password", "")
        wait = address_limit.count_attempt(request.remote_addr)
        if wait is not None:
            error, status, retry_after = (
                "Too many login attempts from your address; "
                f"try again in {wait} seconds.",
                429,
                wait,
            )
        elif not username or not password:
            error, status = "Enter your username and password.", 400
        else:
            try:
                user = authenticate(username, password)
            except LoginLocked as exc:
                error, status = str(exc).capitalize() + ".", 429
                retry_after = exc.retry_after
            except LoginRefused:
                error, status = "Wrong username or password.", 401
            else:
                # A fresh session on every login: nothing planted before survives,
                # and a session this browser had before ends on the server too.
                if current_user.is_authenticated:
                    end_session(current_user.get_id())
                session.clear()
                start_session(user)
                login_user(user)
                return redirect(next_url or "/", 303)
    response = make_response(
        render_template(
            "auth/login.html", error=error, username=username, next_url=next_url
        ),
        status,
    )
    if status == 429:
        response.headers["Retry-After"] = str(retry_after)
    return response


@bp.post("/logout")
def logout():
    if current_user.is_authenticated:
        # Ends the session on the server: a copy of the cookie opens nothing.
        end_session(current_user.get_id())
    logout_user()
    session.clear()
    flash("You have been logged out.", "info")
    return redirect(url_for("auth.login"), 303)
