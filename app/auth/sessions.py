"""Dashboard sessions kept on the server, so that they can end.

Flask's session is a signed cookie: on its own, logout could not revoke a copy of
it. The cookie therefore carries only a random session token (Flask-Login's
alternative id, ``User.get_id``); the session lives in ``user_sessions`` under the
token's SHA-256. Logout deletes the row, ``users set-password`` and ``users
disable`` delete all of the user's rows, and a row is refused after
``LOCKKEEPER_SESSION_HOURS``. The CSRF token lives in the same cookie and the
session is cleared at login and logout, so it dies with the session.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from flask import current_app, has_request_context, request
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from sqlalchemy import delete, select

from app.auth.models import User, UserSession
from app.auth.service import hash_token
from app.database import begin_write
from app.extensions import db

API_PATH = "/api/"


class _NoCookieSession(SecureCookieSession):
    """An API request's session: empty, and never saved."""


class CookieSessions(SecureCookieSessionInterface):
    """Flask's signed cookie for the dashboard; nothing at all for the API.

    The API takes bearer tokens only, so its requests get an empty session that
    is never written back: no Set-Cookie, no ``Vary: Cookie``, whatever a hook
    does with it. A cookie the request carries is not even verified (unsigning
    it and building a serializer was a tenth of an API request's CPU).
    """

    def open_session(self, app, request) -> SecureCookieSession | None:
        if request.path.startswith(API_PATH):
            return _NoCookieSession()
        return super().open_session(app, request)

    def is_null_session(self, obj: object) -> bool:
        return isinstance(obj, _NoCookieSession) or super().is_null_session(obj)

    def get_cookie_secure(self, app) -> bool:
        """``Secure`` when ``SESSION_COOKIE_SECURE`` says so (instance config), or
        ``LOCKKEEPER_SESSION_COOKIE_SECURE`` does (``true``/``false`` from the
        environment); by default (``auto``) when the request came over https,
        as the proxy's ``X-Forwarded-Proto`` says (``LOCKKEEPER_PROXY_COUNT``)."""
        if app.config.get("SESSION_COOKIE_SECURE"):
            return True
        setting = app.config["LOCKKEEPER_SESSION_COOKIE_SECURE"]
        if setting == "auto":
            return has_request_context() and request.is_secure
        return bool(setting)


def _now() -> datetime:
    return datetime.now(UTC)


def start_session(user: User) -> str:
    """A new session for ``user``; returns its token (for the cookie only)."""
    token = secrets.token_urlsafe(32)
    now = _now()
    hours = float(current_app.config["LOCKKEEPER_SESSION_HOURS"])
    db.session.commit()  # end the request's read transaction, if any
    begin_write(db.session)
    # Sessions that ran out are not needed to refuse anything: drop them here, so
    # the table holds about one row per live browser.
    db.session.execute(
        delete(UserSession).where(
            UserSession.user_id == user.id, UserSession.expires_at <= now
        )
    )
    db.session.add(
        UserSession(
            user_id=user.id,
            token_hash=hash_token(token),
            created_at=now,
            expires_at=now + timedelta(hours=hours),
        )
    )
    db.session.commit()
    user.session_token = token
    return token


def load_session(token: str) -> User | None:
    """The enabled user whose live session ``token`` names, or None."""
    if not token or len(token) > 128:
        return None
    user = db.session.scalar(
        select(User)
        .join(UserSession, UserSession.user_id == User.id)
        .where(
            UserSession.token_hash == hash_token(token),
            UserSession.expires_at > _now(),
            User.disabled_at.is_(None),
        )
    )
    if user is not None:
        user.session_token = token
    return user


def end_session(token: str) -> None:
    db.session.commit()  # end the request's read transaction, if any
    begin_write(db.session)
    db.session.execute(
        delete(UserSession).where(UserSession.token_hash == hash_token(token))
    )
    db.session.commit()
