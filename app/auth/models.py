"""Dashboard users and API tokens."""

from __future__ import annotations

from datetime import datetime

from flask_login import UserMixin
from sqlalchemy import Boolean, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.database import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column
from app.extensions import db

ROLES = ("viewer", "operator")


class User(UserMixin, db.Model):
    __tablename__ = "users"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(name_column(80), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    failed_logins: Mapped[int] = mapped_column(Integer, default=0)
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: Set by ``lockkeeper users disable``: no login, every session ended.
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    #: The token of the dashboard session this object was loaded for (not a
    #: column). Flask-Login keeps ``get_id()`` in the cookie, so the cookie names a
    #: server-side session that logout, a new password or ``disable`` can end,
    #: rather than the user, which a copied cookie would name for ever.
    session_token = None

    def get_id(self) -> str:
        if not self.session_token:
            raise RuntimeError("log in through app.auth.sessions.start_session")
        return self.session_token

    @property
    def is_active(self) -> bool:
        return self.disabled_at is None

    @property
    def can_act(self) -> bool:
        return self.role == "operator"


class UserSession(db.Model):
    """A logged-in dashboard session; only the SHA-256 of its token is stored.

    Deleting the row ends the session wherever its cookie has been copied.
    """

    __tablename__ = "user_sessions"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LoginAddressWindow(db.Model):
    """Login attempts from one client address in the current fixed window.

    Kept in the database so every worker process and every instance counts
    against the same limit.
    """

    __tablename__ = "login_address_windows"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    address: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    attempts: Mapped[int] = mapped_column(Integer)


class ApiToken(db.Model):
    """A worker credential; only the SHA-256 of the token is stored."""

    __tablename__ = "api_tokens"
    __table_args__ = (MYSQL_TABLE_ARGS,)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(name_column(80), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Scope: newline-separated resource prefixes (NULL: every resource).
    prefixes: Mapped[str | None] = mapped_column(Text)
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Most live (held or expiring) locks the token may hold at once; NULL: no limit.
    max_locks: Mapped[int | None] = mapped_column(Integer)
