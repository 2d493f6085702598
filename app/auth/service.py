"""Users and API tokens: creation, verification, revocation."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flask import current_app
from lockkeeper_core import validation
from sqlalchemy import bindparam, delete, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from werkzeug.security import check_password_hash, generate_password_hash

from app.auth.models import ROLES, ApiToken, User, UserSession
from app.database import autocommit, begin_write, server_gone
from app.extensions import db

TOKEN_PREFIX = "lk_"
MIN_PASSWORD = 8


class AuthError(ValueError):
    """A user or token request that cannot be carried out; the message says why."""


def _now() -> datetime:
    return datetime.now(UTC)


def token_clock() -> datetime:
    """Token expiry is judged on the host's clock (or a test's fake clock): days
    and hours, where the seconds between hosts do not matter."""
    from app.extensions import lock_service

    return lock_service().clock.now() or _now()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _check_name(name: str, what: str) -> None:
    error = validation.name_error(name, what)
    if error or len(name) > 80:
        raise AuthError(f"{what} {error or 'must be at most 80 characters'}")


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """A live API token as a request sees it: its name and what it may do."""

    name: str
    prefixes: tuple[str, ...] | None = None  # None: every resource
    read_only: bool = False
    expires_at: datetime | None = None
    max_locks: int | None = None  # None: no limit

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def covers(self, resource: str) -> bool:
        """``resource`` is inside the token's scope."""
        return self.prefixes is None or resource.startswith(self.prefixes)

    def may_send(self, method: str) -> bool:
        return not self.read_only or method in READ_METHODS


def prefix_error(prefix: object) -> str | None:
    """A scope prefix is the start of a resource name: the same characters."""
    if not isinstance(prefix, str) or not prefix:
        return "must be a non-empty string"
    if not validation.RESOURCE_PATTERN.fullmatch(prefix):
        return "may contain only A-Z a-z 0-9 and . _ : @ = + - (at most 255)"
    return None


def create_token(
    name: str,
    *,
    prefixes: Iterable[str] = (),
    read_only: bool = False,
    expires_in: timedelta | None = None,
    max_locks: int | None = None,
) -> str:
    """Create the API token ``name``; returns the token, which is never shown again.

    ``prefixes``: the resources it may see and act on (none given: all of them).
    ``max_locks``: its quota of live locks; None takes
    ``LOCKKEEPER_MAX_LOCKS_PER_TOKEN``, 0 means no limit.
    """
    _check_name(name, "token name")
    prefixes = tuple(dict.fromkeys(prefixes))
    for prefix in prefixes:
        error = prefix_error(prefix)
        if error:
            raise AuthError(f"prefix {prefix!r} {error}")
    if expires_in is not None and expires_in <= timedelta(0):
        raise AuthError("the expiry must be a positive duration")
    if max_locks is None:
        max_locks = int(current_app.config["LOCKKEEPER_MAX_LOCKS_PER_TOKEN"])
    if isinstance(max_locks, bool) or not isinstance(max_locks, int) or max_locks < 0:
        raise AuthError("the lock quota must be a whole number, 0 for no limit")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = _now()
    begin_write(db.session)
    db.session.add(
        ApiToken(
            name=name,
            token_hash=hash_token(token),
            created_at=now,
            prefixes="\n".join(prefixes) if prefixes else None,
            read_only=read_only,
            expires_at=token_clock() + expires_in if expires_in is not None else None,
            max_locks=max_locks or None,
        )
    )
    try:
        db.session.commit()
    except IntegrityError as exc:
        db.session.rollback()
        raise AuthError(f"a token named {name!r} exists already") from exc
    return token


_LIVE_TOKEN = select(
    ApiToken.name,
    ApiToken.token_hash,
    ApiToken.prefixes,
    ApiToken.read_only,
    ApiToken.expires_at,
    ApiToken.max_locks,
).where(ApiToken.token_hash == bindparam("digest"), ApiToken.revoked_at.is_(None))


def identity_of(row) -> TokenIdentity:
    return TokenIdentity(
        name=row.name,
        prefixes=tuple(row.prefixes.split("\n")) if row.prefixes else None,
        read_only=bool(row.read_only),
        expires_at=row.expires_at,
        max_locks=row.max_locks,
    )


class TokenCache:
    """Live token identities this process looked up in the last ``seconds``.

    The token check runs before every API call; a lookup is a database round trip
    and a third of a cycle's CPU. A cached identity is re-judged for expiry on
    every use, so an expired token stops at once; a *revoked* one keeps working
    in a worker that cached it for at most ``seconds`` after its lookup (the
    revoking process itself forgets it at once). Unknown and revoked tokens are
    never cached: a new token works on its first request. ``seconds`` 0: off.
    """

    MAX_ENTRIES = 4096

    def __init__(self, seconds: float, monotonic=time.monotonic):
        self.seconds = seconds
        self.monotonic = monotonic
        self._entries: dict[str, tuple[TokenIdentity, float]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str) -> TokenIdentity | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        identity, fetched = entry
        if self.monotonic() - fetched >= self.seconds:
            self._entries.pop(digest, None)
            return None
        return identity

    def put(self, digest: str, identity: TokenIdentity) -> None:
        if self.seconds <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (identity, self.monotonic())

    def forget(self, name: str) -> None:
        with self._lock:
            for digest, (identity, _) in list(self._entries.items()):
                if identity.name == name:
                    self._entries.pop(digest, None)


def token_cache() -> TokenCache:
    """The current app's cache (``LOCKKEEPER_TOKEN_CACHE_SECONDS``)."""
    extensions = current_app.extensions
    cache = extensions.get("lockkeeper.token_cache")
    if cache is None:
        seconds = float(current_app.config["LOCKKEEPER_TOKEN_CACHE_SECONDS"])
        cache = extensions.setdefault("lockkeeper.token_cache", TokenCache(seconds))
    return cache


def verify_token(token: str, now: datetime | None = None) -> TokenIdentity | None:
    """The live token ``token`` (not revoked, not expired at ``now``), or None.

    Lookup is by SHA-256 digest (an index probe, not a scan) and the digest is
    compared again in constant time, so timing says nothing about near misses.
    Expiry is judged here, not in the SQL, so a cached identity is judged again
    on every use; revocation reaches other workers within the cache's seconds
    (``TokenCache``).
    """
    if not token or len(token) > 512:
        return None
    digest = hash_token(token)
    cache = token_cache()
    identity = cache.get(digest)
    if identity is None:
        row = _look_up(digest)
        if row is None or not hmac.compare_digest(row.token_hash, digest):
            return None
        identity = identity_of(row)
        cache.put(digest, identity)
    if identity.expired(now or token_clock()):
        return None
    return identity


def _look_up(digest: str):
    """The token row of ``digest`` (None: no such token), in one autocommit
    statement outside the ORM session (a session would add BEGIN/ROLLBACK and
    hold a reader open).

    A pooled connection that died in use (a failover or a restart the check-out
    could not see) is dropped with its pool and the lookup tried once more on a
    fresh connection, as the lock operations are (``lockkeeper_core.transactions``);
    a server still gone then is a 503, as before.
    """
    for tries_left in (1, 0):
        try:
            with autocommit(db.engine).connect() as conn:
                return conn.execute(_LIVE_TOKEN, {"digest": digest}).one_or_none()
        except DBAPIError as exc:
            if not tries_left or not (exc.connection_invalidated or server_gone(exc)):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


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
    token_cache().forget(name)
    # Its waiting acquires lose their places now (a grant would refuse the token
    # anyway); after the commit, so no grant waits on both rows at once.
    from app.extensions import lock_service

    lock_service().queue.remove_token(name)


def create_user(username: str, password: str, role: str) -> User:
    _check_name(username, "username")
    if role not in ROLES:
        raise AuthError(f"role must be one of {', '.join(ROLES)}")
    _check_password_length(password)
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


def _check_password_length(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise AuthError(f"password must be at least {MIN_PASSWORD} characters")


def _user_for_update(username: str) -> User:
    begin_write(db.session)
    user = db.session.scalar(
        select(User).where(User.username == username).with_for_update()
    )
    if user is None:
        db.session.rollback()
        raise AuthError(f"no user named {username!r}")
    return user


def _end_sessions(user: User) -> None:
    db.session.execute(delete(UserSession).where(UserSession.user_id == user.id))


def set_password(username: str, password: str) -> None:
    """Give ``username`` a new password, unlock it and end all of its sessions
    (a stolen session must not outlive the password change that answers it)."""
    _check_password_length(password)
    password_hash = generate_password_hash(password)
    user = _user_for_update(username)
    user.password_hash = password_hash
    user.failed_logins = 0
    user.locked_until = None
    _end_sessions(user)
    db.session.commit()


def disable_user(username: str) -> None:
    """No more logins for ``username``, and every session of it ends now."""
    user = _user_for_update(username)
    if user.disabled_at is None:
        user.disabled_at = _now()
    _end_sessions(user)
    db.session.commit()


def enable_user(username: str) -> None:
    user = _user_for_update(username)
    user.disabled_at = None
    user.failed_logins = 0
    user.locked_until = None
    db.session.commit()


def list_users() -> list[User]:
    return list(db.session.scalars(select(User).order_by(User.username)))


def delete_user(username: str) -> None:
    """Remove the account; its sessions go with it (ON DELETE CASCADE). The
    audit log keeps the username it recorded as the actor."""
    user = _user_for_update(username)
    _end_sessions(user)
    db.session.delete(user)
    db.session.commit()


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
        quota = int(current_app.config["LOCKKEEPER_MAX_LOCKS_PER_TOKEN"])
        db.session.add(
            ApiToken(
                name="bootstrap",
                token_hash=hash_token(token),
                created_at=_now(),
                read_only=False,
                max_locks=quota or None,
            )
        )
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        return None
    return password, (None if has_token else token)
