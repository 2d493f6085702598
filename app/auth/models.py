"""Dashboard users and API tokens."""

from __future__ import annotations

from datetime import datetime

from flask_login import UserMixin
from sqlalchemy import Boolean, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.types import MYSQL_TABLE_ARGS, UTCDateTime, name_column

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

    @property
    def can_act(self) -> bool:
        return self.role == "operator"


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
