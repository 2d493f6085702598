"""Password login with per-account throttling.

After ``LOCKKEEPER_LOGIN_MAX_FAILURES`` wrong passwords in a row an account is
locked for ``LOCKKEEPER_LOGIN_LOCKOUT_SECONDS``; while locked, even the right
password is refused, so guessing cannot continue at full speed. A success resets
the count.

Every attempt is counted as a failure *before* its password is hashed, by one
conditional UPDATE that only matches an account that is not locked: parallel
guesses queue on that row, so at most ``max_failures`` of them ever reach the hash
in one lockout period, and any attempt that arrives once the account is locked is
refused without hashing, whatever its password. A right password then takes its
attempt back (resets the count and any lock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache

from flask import current_app
from lockkeeper_core import validation
from sqlalchemy import case, literal, null, or_, select, update
from werkzeug.security import check_password_hash, generate_password_hash

from app.auth import address_limit
from app.auth.models import User
from app.database import UTCDateTime, begin_write
from app.extensions import db

# As ``app.auth.service`` creates them.
MAX_USERNAME = 80


@cache
def dummy_hash() -> str:
    """Compared against when the username is unknown, so a miss costs as much
    time as a wrong password and timing does not tell which usernames exist.
    Made once per process (a scrypt hash, about 0.15 s of CPU), when a server
    starts (``app.factory.start_serving``), not when the module is imported: a
    command of the CLI or a test process that never logs in does not pay it."""
    return generate_password_hash("lockkeeper-no-such-user")


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


@dataclass(frozen=True, slots=True)
class _Attempt:
    user_id: int
    password_hash: str
    #: This attempt's failure was the one that locked the account.
    locks_account: bool


def _now() -> datetime:
    return datetime.now(UTC)


def _count_attempt(username: str, now: datetime) -> _Attempt | None:
    """Count one failure for ``username`` unless it is locked; None if unknown or
    disabled.

    :raise LoginLocked: the account is locked; nothing was counted.
    """
    max_failures = int(current_app.config["LOCKKEEPER_LOGIN_MAX_FAILURES"])
    lockout = timedelta(
        seconds=int(current_app.config["LOCKKEEPER_LOGIN_LOCKOUT_SECONDS"])
    )
    reaches_limit = User.failed_logins + 1 >= max_failures
    db.session.commit()  # end the request's read transaction, if any
    begin_write(db.session)
    counted = db.session.execute(
        update(User)
        .where(
            User.username == username,
            User.disabled_at.is_(None),
            or_(User.locked_until.is_(None), User.locked_until <= now),
        )
        # MariaDB assigns left to right, each seeing the columns set before it:
        # locked_until must be computed from the old failed_logins.
        .ordered_values(
            (
                User.locked_until,
                case(
                    (reaches_limit, literal(now + lockout, UTCDateTime())),
                    else_=null(),
                ),
            ),
            (
                User.failed_logins,
                case((reaches_limit, 0), else_=User.failed_logins + 1),
            ),
        )
        .execution_options(synchronize_session=False)
    ).rowcount
    # Our UPDATE holds the row until commit: this reads what it wrote.
    row = db.session.execute(
        select(User.id, User.password_hash, User.locked_until, User.disabled_at).where(
            User.username == username
        )
    ).one_or_none()
    db.session.commit()
    if row is None or row.disabled_at is not None:
        return None
    if not counted:
        left = (row.locked_until - now).total_seconds() if row.locked_until else 0
        raise LoginLocked(max(1, math.ceil(left)))
    return _Attempt(
        user_id=row.id,
        password_hash=row.password_hash,
        locks_account=row.locked_until is not None and row.locked_until > now,
    )


def _refuse_unknown(username: str, password: str):
    """A name with no account (or a disabled one) is refused as an account is:
    its failures are counted too, and the one that reaches the limit "locks"
    it for as long, so the lockout message tells nobody which names exist.

    :raise LoginLocked: past the limit (no hash), or at it.
    :raise LoginRefused: otherwise, after the hash a wrong password costs.
    """
    max_failures = int(current_app.config["LOCKKEEPER_LOGIN_MAX_FAILURES"])
    lockout = int(current_app.config["LOCKKEEPER_LOGIN_LOCKOUT_SECONDS"])
    failures, wait = address_limit.count_in_window(
        address_limit.name_key(username), timedelta(seconds=lockout)
    )
    if failures > max_failures:
        raise LoginLocked(wait)
    check_password_hash(dummy_hash(), password)
    if failures == max_failures:
        raise LoginLocked(lockout)
    raise LoginRefused("wrong username or password")


def authenticate(username: str, password: str) -> User:
    """The user named ``username`` if ``password`` is right and it is not locked.

    :raise LoginLocked: the account is locked (also raised by the failure that
        locks it). :raise LoginRefused: unknown or disabled user, or wrong
        password.
    """
    now = _now()
    if validation.name_error(username) or len(username) > MAX_USERNAME:
        # No account has such a name (NUL, control characters, too long): it
        # never reaches the database, and costs the hash a miss costs.
        check_password_hash(dummy_hash(), password)
        raise LoginRefused("wrong username or password")
    attempt = _count_attempt(username, now)
    # The hash runs with no transaction open: scrypt takes tens of milliseconds
    # and must not hold SQLite's write lock or a row lock.
    if attempt is None:
        _refuse_unknown(username, password)
    if not check_password_hash(attempt.password_hash, password):
        if attempt.locks_account:
            raise LoginLocked(
                int(current_app.config["LOCKKEEPER_LOGIN_LOCKOUT_SECONDS"])
            )
        raise LoginRefused("wrong username or password")
    begin_write(db.session)
    db.session.execute(
        update(User)
        .where(User.id == attempt.user_id)
        .values(failed_logins=0, locked_until=None)
        .execution_options(synchronize_session=False)
    )
    db.session.commit()
    return db.session.get(User, attempt.user_id)
