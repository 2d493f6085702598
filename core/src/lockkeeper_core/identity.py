"""The API token an embedded caller acts as: looked up by its digest as the
server's guard looks it up, cached a few seconds (the grant itself refuses a
revoked or expired token at once, in its own transaction)."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    Engine,
    Integer,
    String,
    Text,
    bindparam,
    column,
    select,
    table,
)

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.engine import autocommit

TOKEN_CACHE_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Identity:
    """A live API token, as the embedded caller acts."""

    name: str
    prefixes: tuple[str, ...] | None
    read_only: bool
    expires_at: datetime | None
    max_locks: int | None

    def covers(self, resource: str) -> bool:
        return self.prefixes is None or resource.startswith(self.prefixes)


# The API tokens as the guard reads them (the core does not import ``app.auth``).
api_tokens = table(
    "api_tokens",
    column("name", String()),
    column("token_hash", String()),
    column("revoked_at", UTCDateTime()),
    column("prefixes", Text()),
    column("read_only", Boolean()),
    column("expires_at", UTCDateTime()),
    column("max_locks", Integer()),
)
_LIVE_TOKEN = select(
    api_tokens.c.name,
    api_tokens.c.token_hash,
    api_tokens.c.prefixes,
    api_tokens.c.read_only,
    api_tokens.c.expires_at,
    api_tokens.c.max_locks,
).where(
    api_tokens.c.token_hash == bindparam("digest"), api_tokens.c.revoked_at.is_(None)
)


class Tokens:
    """The token check of the API's guard, on the worker's engine: by SHA-256
    digest, cached ``seconds`` (a revocation reaches this process within them;
    the grant itself refuses a revoked token at once)."""

    def __init__(self, engine: Engine, seconds: float = TOKEN_CACHE_SECONDS):
        self._reads = autocommit(engine)
        self.seconds = seconds
        # By the token as presented: a call with a cached one hashes nothing
        # (the digest was a tenth of the embedded mode's own work per call).
        # Only live tokens are kept, as the digests were.
        self._cache: dict[str, tuple[Identity, float]] = {}

    def verify(self, token: str | None) -> Identity | None:
        if not token or len(token) > 512:
            return None
        cached = self._cache.get(token)
        if cached is not None and time.monotonic() - cached[1] < self.seconds:
            identity = cached[0]
        else:
            digest = hashlib.sha256(token.encode()).hexdigest()
            with self._reads.connect() as conn:
                row = conn.execute(_LIVE_TOKEN, {"digest": digest}).one_or_none()
            if row is None or not hmac.compare_digest(row.token_hash, digest):
                self._cache.pop(token, None)
                return None
            identity = Identity(
                name=row.name,
                prefixes=tuple(row.prefixes.split("\n")) if row.prefixes else None,
                read_only=bool(row.read_only),
                expires_at=row.expires_at,
                max_locks=row.max_locks,
            )
            if self.seconds > 0:
                self._cache[token] = (identity, time.monotonic())
        if identity.expires_at is not None and identity.expires_at <= datetime.now(UTC):
            return None
        return identity
