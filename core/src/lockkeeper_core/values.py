"""Values that travel through the lock core as one piece."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ask:
    """One acquire as the service hands it to the statements: who asks
    (``token``, ``owner``; ``actor`` is who is recorded as acting) for which
    ``resource``, for how long (``ttl`` seconds), under which quota
    (``max_locks`` live grants of the token; None: none), with which ``limit``
    and ``mode``."""

    resource: str
    owner: str
    token: str | None
    ttl: float
    actor: str | None = None
    max_locks: int | None = None
    # How many holders the resource allows (1: an exclusive or read/write lock)
    # and this grant's mode ("exclusive" or "shared").
    limit: int = 1
    mode: str = "exclusive"


@dataclass(frozen=True, slots=True)
class Member:
    """One resource of a set acquired as one (``lockkeeper_core.sets``), with its
    own ``limit`` and ``mode``, as a single acquire takes them."""

    resource: str
    limit: int = 1
    mode: str = "exclusive"
