"""Lockkeeper backends for celery-once and celery-singleton
(``lockkeeper-client[celery]``): drop-in replacements for their Redis backends.

celery-once::

    app.conf.ONCE = {
        "backend": "lockkeeper_client.celery_backends.CeleryOnce",
        "settings": {"url": "https://locks.example", "token": "...",
                     "default_timeout": 3600},
    }

celery-singleton::

    app.conf.singleton_backend_class = (
        "lockkeeper_client.celery_backends.CelerySingleton")
    app.conf.singleton_backend_url = "https://locks.example"
    app.conf.singleton_backend_kwargs = {"token": "..."}

Without ``url`` (or with a ``redis://`` one, celery-singleton's fallback to the
broker) and ``token`` they come from ``LOCKKEEPER_URL`` and ``LOCKKEEPER_TOKEN``.
A worker whose app module imports this module (celery-once and celery-singleton
import a backend by name only when a task runs) refuses to start without them,
naming what to set: otherwise it would run the tasks and fail to clear their
locks, leaving them held for their whole ttl (24 h by default).

Both take the lock in the producer (``apply_async``) and clear it in the worker,
by key alone: the worker never learns who took it. So every take is a holder of
its own under the one token: owner ``celery-once:<uuid>``, or
``celery-singleton:<task id>`` (which is how ``get`` answers the task id). A
clear reads the key's holder and releases it as that owner. A lock that expired
and was taken again between the two has another owner, so the release is
refused and the new lock stays: no read-then-delete race, and nothing the API
lacks. What a clear removes is whatever take holds the key at that moment, as
the Redis backends' ``DELETE`` does.

Keys become resource names: a key that is one already (celery-singleton's
``SINGLETONLOCK_<md5>``, most of celery-once's ``qo_<task>_<arg>-<value>``) is
used as it is, after ``prefix`` (for a token scoped to a prefix); any other is
its allowed characters and a hash of the whole key.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import threading
import uuid
from typing import Any

from lockkeeper_client import LockClient
from lockkeeper_client import celery as _checks_settings_at_start  # noqa: F401
from lockkeeper_client.errors import ConfigurationError, LockLost, LockMissing

ONCE_OWNER = "celery-once:"
SINGLETON_OWNER = "celery-singleton:"
# The server's resource names (core/src/lockkeeper_core/validation.py RESOURCE_PATTERN).
_RESOURCE = re.compile(r"[A-Za-z0-9._:@=+\-]{1,255}")
_NOT_RESOURCE = re.compile(r"[^A-Za-z0-9._:@=+\-]")
# The server's longest ttl by default (LOCKKEEPER_MAX_TTL): celery-singleton's
# "never expires".
DEFAULT_MAX_TTL = 86400.0


def resource_for(key: str, prefix: str = "") -> str:
    """The resource name of a backend's ``key`` (``prefix`` first)."""
    name = prefix + key
    if _RESOURCE.fullmatch(name):
        return name
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    readable = _NOT_RESOURCE.sub("-", key)[: 255 - len(prefix) - 34]
    return f"{prefix}{readable}:{digest}"


class _Clients:
    """One client per (url, token) and worker process, made on first use (never
    across a fork): celery-once makes a backend for every call."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pid = os.getpid()
        self._made: dict[tuple[str, str], LockClient] = {}

    def get(self, url: str | None, token: str | None) -> LockClient:
        url = url if url and url.startswith(("http://", "https://")) else None
        url = url or os.environ.get("LOCKKEEPER_URL")
        token = token or os.environ.get("LOCKKEEPER_TOKEN")
        if not url or not token:
            missing = "LOCKKEEPER_URL" if not url else "LOCKKEEPER_TOKEN"
            raise RuntimeError(
                f"lockkeeper_client.celery_backends: set {missing} or pass the "
                "backend's url and token"
            )
        with self._guard:
            if os.getpid() != self._pid:
                self._pid, self._made = os.getpid(), {}
            client = self._made.get((url, token))
            if client is None:
                client = self._made[url, token] = LockClient(url, token)
            return client


_clients = _Clients()


def settings_problems(conf: Any) -> list[str]:
    """What is missing or wrong in the settings of the Lockkeeper backends that
    ``conf`` (a Celery app's) names; empty when none is named or all is set."""
    problems = []
    once = conf.get("ONCE") or {}
    if isinstance(once, dict) and once.get("backend") == f"{__name__}.CeleryOnce":
        settings = once.get("settings") or {}
        try:
            _clients.get(settings.get("url"), settings.get("token"))
        except (RuntimeError, ConfigurationError) as exc:
            problems.append(f"celery-once: {exc}")
    if conf.get("singleton_backend_class") == f"{__name__}.CelerySingleton":
        kwargs = conf.get("singleton_backend_kwargs") or {}
        try:
            _clients.get(conf.get("singleton_backend_url"), kwargs.get("token"))
        except (RuntimeError, ConfigurationError) as exc:
            problems.append(f"celery-singleton: {exc}")
    return problems


def _clear(client: LockClient, resource: str, owner_prefix: str) -> bool:
    """Release the take that holds ``resource`` now, as its own owner; False
    when none does (or another took it meanwhile: that one stays)."""
    try:
        holder = client.get(resource)
    except LockMissing:
        return False
    if not holder.owner.startswith(owner_prefix):
        return False  # not a take of this backend: never ours to clear
    try:
        client.release(resource, holder.owner)
    except LockLost:
        return False  # expired, or taken again under another owner: it stays
    return True


class CeleryOnce:
    """celery-once's backend (``raise_or_lock``, ``clear_lock``).

    ``settings``: ``url`` and ``token`` of the Lockkeeper server (else the
    environment), ``prefix`` before every resource name, ``blocking`` and
    ``blocking_timeout`` (wait that many seconds in the server's line for a
    queued key, as the Redis backend's blocking option does).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        self.client = _clients.get(settings.get("url"), settings.get("token"))
        self.prefix = str(settings.get("prefix", ""))
        self.blocking = bool(settings.get("blocking", False))
        self.blocking_timeout = float(settings.get("blocking_timeout", 1))

    def raise_or_lock(self, key: str, timeout: float) -> None:
        """Take ``key`` for ``timeout`` seconds, or raise celery-once's
        ``AlreadyQueued`` with the seconds until the holder's lock expires."""
        attempt = self.client.acquire(
            resource_for(key, self.prefix),
            ONCE_OWNER + uuid.uuid4().hex,
            ttl=timeout,
            wait=self.blocking_timeout if self.blocking else None,
        )
        if not attempt.acquired:
            tasks: Any = importlib.import_module("celery_once.tasks")
            remaining = attempt.lock.ttl_remaining if attempt.lock else 0.0
            raise tasks.AlreadyQueued(remaining)

    def clear_lock(self, key: str) -> bool:
        """Clear ``key``'s lock, whichever take holds it now."""
        return _clear(self.client, resource_for(key, self.prefix), ONCE_OWNER)


class CelerySingleton:
    """celery-singleton's backend (``lock``, ``unlock``, ``get``, ``clear``).

    ``url`` and ``token`` of the Lockkeeper server (else the environment);
    ``prefix`` before every resource name; ``max_ttl``: the ttl of a lock
    taken without an expiry (celery-singleton's "never expires"; the server's
    ``LOCKKEEPER_MAX_TTL``, 24 h by default).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        prefix: str = "",
        max_ttl: float = DEFAULT_MAX_TTL,
    ) -> None:
        self.client = _clients.get(url, token)
        self.prefix = prefix
        self.max_ttl = max_ttl

    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        """Take ``lock`` for the task ``task_id``; False when another task holds
        it. The task's own id again (a Celery retry re-applies it with its id)
        is the same holder: it keeps the lock."""
        attempt = self.client.acquire(
            resource_for(lock, self.prefix),
            SINGLETON_OWNER + task_id,
            ttl=expiry if expiry else self.max_ttl,
        )
        return attempt.acquired

    def unlock(self, lock: str) -> None:
        _clear(self.client, resource_for(lock, self.prefix), SINGLETON_OWNER)

    def get(self, lock: str) -> str | None:
        """The id of the task that holds ``lock``, or None."""
        try:
            holder = self.client.get(resource_for(lock, self.prefix))
        except LockMissing:
            return None
        if not holder.owner.startswith(SINGLETON_OWNER):
            return None
        return holder.owner[len(SINGLETON_OWNER) :]

    def clear(self, key_prefix: str) -> None:
        """celery-singleton's ``clear_locks(app)``: not offered (the worker
        client lists no locks); an operator releases them on the dashboard
        (search the prefix, "release the N matching")."""
        raise NotImplementedError(
            "clear: release the locks under "
            f"{resource_for(key_prefix, self.prefix)!r} from the dashboard"
        )
