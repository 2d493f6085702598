"""Password login with per-account throttling.

After ``LOCKKEEPER_LOGIN_MAX_FAILURES`` wrong passwords in a row an account is
locked for ``LOCKKEEPER_LOGIN_LOCKOUT_SECONDS``; while locked, even the right
password is refused, so guessing cannot continue at full speed. A success resets
the count.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from flask import current_app
from sqlalchemy import select, update
from werkzeug.security import check_password_hash, generate_password_hash

from app.auth.models import User
from app.database import begin_write
from app.extensions import db

# Compared against when the username is unknown, so a miss costs as much time as
# a wrong password and timing does not tell which usernames exist.
_DUMMY_HASH = generate_password_hash("lockkeeper-no-such-user")


class LoginRefused(Exception):
    """Wrong username or password; deliberately does not say which."""


class LoginLocked(LoginRefused):
    """Too many failures: the account is locked for ``retry_after`` seconds."""

    def __init__(self, retry_after: int):
        self.retry_after = retry_after
        minutes = max(1, math.ceil(retry_after / 60))
        super().__init__(
            "too many failed logins for this account; "
            f"try again in {minutes} minute{'s' if minutes != 1 else ''}"
        )


def _now() -> datetime:
    return datetime.now(UTC)


def authenticate(username: str, password: str) -> User:
    """The user named ``username`` if ``password`` is right and it is not locked.

    :raise LoginLocked: the account is locked (also raised by the failure that
        locks it). :raise LoginRefused: unknown user or wrong password.
    """
    max_failures = int(current_app.config["LOCKKEEPER_LOGIN_MAX_FAILURES"])
    lockout = timedelta(
        seconds=int(current_app.config["LOCKKEEPER_LOGIN_LOCKOUT_SECONDS"])
    )
    # Read, then hash with no transaction open: scrypt takes tens of milliseconds
    # and must not hold SQLite's write lock.
    found = db.session.execute(
        select(User.id, User.password_hash, User.locked_until).where(
            User.username == username
        )
    ).one_or_none()
    db.session.rollback()
    if found is None:
        check_password_hash(_DUMMY_HASH, password)
        raise LoginRefused("wrong username or password")
    now = _now()
    if found.locked_until is not None and found.locked_until > now:
        raise LoginLocked(math.ceil((found.locked_until - now).total_seconds()))
    if check_password_hash(found.password_hash, password):
        begin_write(db.session)
        db.session.execute(
            update(User)
            .where(User.id == found.id)
            .values(failed_logins=0, locked_until=None)
        )
        db.session.commit()
        return db.session.get(User, found.id)
    # Counted in SQL, so concurrent guesses cannot lose increments.
    begin_write(db.session)
    db.session.execute(
        update(User)
        .where(User.id == found.id)
        .values(failed_logins=User.failed_logins + 1)
    )
    failures = db.session.scalar(select(User.failed_logins).where(User.id == found.id))
    locked = failures >= max_failures
    if locked:
        db.session.execute(
            update(User)
            .where(User.id == found.id)
            .values(failed_logins=0, locked_until=now + lockout)
        )
    db.session.commit()
    if locked:
        raise LoginLocked(int(lockout.total_seconds()))
    raise LoginRefused("wrong username or password")
