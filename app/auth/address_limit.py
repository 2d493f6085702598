"""Login attempts per client address, counted in the database before any hashing.

Every login form post (unknown usernames included) counts one attempt for its
client address in a fixed window of ``LOCKKEEPER_LOGIN_ADDRESS_WINDOW_SECONDS``;
past ``LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS`` the post is answered 429 with
``Retry-After`` before a password is hashed, so one client cannot spend the
server's CPU on scrypt for everyone.

The count lives in the database the service already has (one upsert per attempt),
not in process memory: every gunicorn worker and every instance sharing the
database counts against the same limit, where a per-process counter would be
multiplied by the number of processes. Flask-Limiter's storages are memory,
Redis, Memcached and MongoDB: none is shared by default, and a Redis only for
this would be a second stateful dependency. The client address is
``request.remote_addr``: behind a proxy set ``LOCKKEEPER_PROXY_COUNT`` so that it
is the client's, taken from ``X-Forwarded-For``.
"""

from __future__ import annotations

import hashlib
import math
import random
from datetime import UTC, datetime, timedelta

from flask import current_app
from sqlalchemy import case, delete, literal, select
from sqlalchemy.dialects import mysql, postgresql, sqlite

from app.auth.models import LoginAddressWindow
from app.database import UTCDateTime, begin_write
from app.extensions import db

windows = LoginAddressWindow.__table__
# One attempt in this many also deletes the windows that ran out, so the table
# holds about one row per address seen in the last window.
PRUNE_ONE_IN = 50


def _upsert(address: str, now: datetime, window: timedelta):
    """Count one attempt for ``address``: a new window if its last one ran out."""
    ran_out = windows.c.window_start <= now - window
    started = literal(now, UTCDateTime())
    kept = windows.c.window_start
    dialect = db.engine.dialect.name
    if dialect in ("mysql", "mariadb"):
        statement = mysql.insert(windows).values(
            address=address, window_start=now, attempts=1
        )
        # Assigned left to right, each seeing the ones before: attempts must be
        # decided on the old window_start.
        return statement.on_duplicate_key_update(
            [
                ("attempts", case((ran_out, 1), else_=windows.c.attempts + 1)),
                ("window_start", case((ran_out, started), else_=kept)),
            ]
        )
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(windows).values(address=address, window_start=now, attempts=1)
    return statement.on_conflict_do_update(
        index_elements=[windows.c.address],
        set_={
            "attempts": case((ran_out, 1), else_=windows.c.attempts + 1),
            "window_start": case((ran_out, started), else_=kept),
        },
    )


def count_attempt(address: str | None) -> int | None:
    """Count a login attempt from ``address``; the seconds to wait when it is over
    the limit, else None (also when the limit is off)."""
    limit = int(current_app.config["LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS"])
    if limit <= 0:
        return None
    address = (address or "unknown")[:64].lower()
    attempts, wait = count_in_window(address, _address_window())
    return wait if attempts > limit else None


# Keys of the rows that count failed logins of a name no account has (see
# ``app.auth.login``); they live as long as a lockout, not as an address window.
NAME_KEY = "name:"


def name_key(username: str) -> str:
    return NAME_KEY + hashlib.sha256(username.encode()).hexdigest()[:59]


def _address_window() -> timedelta:
    return timedelta(
        seconds=float(current_app.config["LOCKKEEPER_LOGIN_ADDRESS_WINDOW_SECONDS"])
    )


def count_in_window(key: str, window: timedelta) -> tuple[int, int]:
    """Count one attempt under ``key`` in a fixed ``window``: (attempts in it so
    far, seconds until it ends)."""
    address = key
    now = datetime.now(UTC)
    db.session.commit()  # end the request's read transaction, if any
    begin_write(db.session)
    db.session.execute(_upsert(address, now, window))
    # Our upsert holds the row until commit: this reads what it wrote.
    attempts, window_start = db.session.execute(
        select(windows.c.attempts, windows.c.window_start).where(
            windows.c.address == address
        )
    ).one()
    if random.randrange(PRUNE_ONE_IN) == 0:
        is_name = windows.c.address.startswith(NAME_KEY)
        lockout = timedelta(
            seconds=int(current_app.config["LOCKKEEPER_LOGIN_LOCKOUT_SECONDS"])
        )
        ran_out = (~is_name & (windows.c.window_start <= now - _address_window())) | (
            is_name & (windows.c.window_start <= now - lockout)
        )
        db.session.execute(delete(windows).where(ran_out))
    db.session.commit()
    return attempts, max(1, math.ceil((window_start + window - now).total_seconds()))
