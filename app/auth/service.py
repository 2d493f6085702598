"""Users and API tokens: creation, verification, revocation."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from werkzeug.security import check_password_hash, generate_password_hash

from app.auth.models import ROLES, ApiToken, User
from app.database import autocommit, begin_write
from app.extensions import db
from app.locks import validation

TOKEN_PREFIX = "lk_"
MIN_PASSWORD = 8


class AuthError(ValueError):
    """A user or token request that cannot be carried out; the message says why."""


def _now() -> datetime:
    return datetime.now(UTC)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _check_name(name: str, what: str) -> None:
    error = validation.name_error(name, what)
    if error or len(name) > 80:
        raise AuthError(f"{what} {error or 'must be at most 80 characters'}")


def create_token(name: str) -> str:
    """Create the API token ``name``; returns the token, which is never shown again."""
    _check_name(name, "token name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    begin_write(db.session)
    db.session.add(ApiToken(name=name, token_hash=hash_token(token), created_at=_now()))
    try:
        db.session.commit()
    except IntegrityError as exc:
        db.session.rollback()
        raise AuthError(f"a token named {name!r} exists already") from exc
    return token


_LIVE_TOKEN = select(ApiToken.name, ApiToken.token_hash).where(
    ApiToken.token_hash == bindparam("digest"), ApiToken.revoked_at.is_(None)
)


def verify_token(token: str) -> str | None:
    """The name of the live token ``token``, or None.

    Lookup is by SHA-256 digest (an index probe, not a scan) and the digest is
    compared again in constant time, so timing says nothing about near misses.
    """
    if not token or len(token) > 512:
        return None
    digest = hash_token(token)
    # One autocommit statement, outside the ORM session: it runs before every API
    # call, and a session would add BEGIN/ROLLBACK and hold a reader open.
    with autocommit(db.engine).connect() as conn:
        row = conn.execute(_LIVE_TOKEN, {"digest": digest}).one_or_none()
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    return row.name


def list_tokens() -> list[ApiToken]:
    return list(db.session.scalars(select(ApiToken).order_by(ApiToken.name)))


def revoke_token(name: str) -> None:
    begin_write(db.session)
    token = db.session.scalar(select(ApiToken).where(ApiToken.name == name))
    if token is None or token.revoked_at is not None:
        db.session.rollback()
        raise AuthError(f"no live token named {name!r}")
    token.revoked_at = _now()
    db.session.commit()


def create_user(username: str, password: str, role: str) -> User:
    _check_name(username, "username")
    if role not in ROLES:
        raise AuthError(f"role must be one of {', '.join(ROLES)}")
    if len(password) < MIN_PASSWORD:
        raise AuthError(f"password must be at least {MIN_PASSWORD} characters")
    begin_write(db.session)
    user = User(
        username=username,
        password_hash=generate_password_hash(password),
        role=role,
        created_at=_now(),
        failed_logins=0,
    )
    db.session.add(user)
    try:
        db.session.commit()
    except IntegrityError as exc:
        db.session.rollback()
        raise AuthError(f"a user named {username!r} exists already") from exc
    return user


def check_password(user: User, password: str) -> bool:
    return check_password_hash(user.password_hash, password)


def bootstrap() -> tuple[str, str] | None:
    """On a database with no users, create ``admin`` and, if there is no token yet,
    one API token, in one transaction. Returns (password, token) to the one caller
    that created them; concurrent first starts lose on the unique username."""
    password = secrets.token_urlsafe(12)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    begin_write(db.session)
    if db.session.scalar(select(User.id).limit(1)) is not None:
        db.session.rollback()
        return None
    db.session.add(
        User(
            username="admin",
            password_hash=generate_password_hash(password),
            role="operator",
            created_at=_now(),
            failed_logins=0,
        )
    )
    has_token = db.session.scalar(select(ApiToken.id).limit(1)) is not None
    if not has_token:
        db.session.add(
            ApiToken(name="bootstrap", token_hash=hash_token(token), created_at=_now())
        )
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        return None
    return password, (None if has_token else token)
