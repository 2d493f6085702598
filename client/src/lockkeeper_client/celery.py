"""Celery tasks that run only while they hold a lock (``lockkeeper-client[celery]``).

::

    from lockkeeper_client.celery import locked

    @app.task
    @locked("report:{month}", ttl=60, on_busy="skip")
    def build_report(month, *, fence):
        store.write(month, fence=fence)

The worker takes the lock named from the task's arguments before the body runs,
renews it while the body runs (``LockClient.lock``: a renewal thread, every
``ttl / 3``), hands the grant's fence to the body as the keyword ``fence`` and
releases the lock when the body ends, however it ends. A worker that dies holding
the lock holds it only until its ttl runs out.

When another holder has the lock (``on_busy``):

- ``"skip"``: the body does not run; the task returns ``{"skipped": true,
  "resource": ..., "holder": ...}`` (``Skipped``) and logs it;
- ``"retry"``: Celery's own ``task.retry(countdown=...)``, the countdown being the
  holder's ``Retry-After`` (at most ``retry_countdown``);
- ``"wait"``: waits in the server's line up to ``wait`` seconds, then skips.

The server and token come from ``client=`` (a ``LockClient``, or a callable making
one), else from ``LOCKKEEPER_URL`` and ``LOCKKEEPER_TOKEN`` in the worker's
environment; the client is made on first use in each worker process (after the
fork). The adapter holds no rule of its own: who gets the lock is the server's.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Literal, TypedDict, TypeVar

from celery import current_task  # type: ignore[import-untyped]

from lockkeeper_client import LockClient, LockNotAcquired

log = logging.getLogger("lockkeeper_client.celery")

Busy = Literal["skip", "retry", "wait"]
F = TypeVar("F", bound=Callable[..., Any])


class Skipped(TypedDict):
    """What a task returns instead of running while another holder has its lock."""

    skipped: bool
    resource: str
    holder: str | None


class _Clients:
    """One client per worker process, made on first use (never across a fork)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._made: dict[int, LockClient] = {}

    def get(self, make: Callable[[], LockClient]) -> LockClient:
        pid = os.getpid()
        with self._guard:
            if pid not in self._made:
                self._made = {pid: make()}
            return self._made[pid]


_clients = _Clients()


def _from_environment() -> LockClient:
    try:
        return LockClient(os.environ["LOCKKEEPER_URL"], os.environ["LOCKKEEPER_TOKEN"])
    except KeyError as exc:
        raise RuntimeError(
            f"lockkeeper_client.celery: set {exc.args[0]} in the worker's "
            "environment, or pass client= to @locked"
        ) from None


def locked(
    name: str,
    *,
    ttl: float = 60.0,
    on_busy: Busy = "skip",
    wait: float = 30.0,
    retry_countdown: float = 60.0,
    max_retries: int | None = None,
    fence_arg: str | None = "fence",
    client: LockClient | Callable[[], LockClient] | None = None,
) -> Callable[[F], F]:
    """Run the decorated task body only while holding the lock ``name``, formatted
    with the task's arguments by name (``"report:{month}"``).

    :param ttl: the lock's ttl; it is renewed every ``ttl / 3`` while the body runs.
    :param on_busy: ``"skip"``, ``"retry"`` or ``"wait"`` (see the module).
    :param wait: seconds ``"wait"`` waits in line before it skips.
    :param retry_countdown: the longest countdown ``"retry"`` asks Celery for.
    :param max_retries: passed to ``task.retry`` (None: the task's own).
    :param fence_arg: the keyword the fence is passed as; None: not passed.
    """
    if on_busy not in ("skip", "retry", "wait"):
        raise ValueError(f"on_busy must be skip, retry or wait, not {on_busy!r}")

    def make_client() -> LockClient:
        if client is None:
            return _from_environment()
        if isinstance(client, LockClient):
            return client
        return client()

    def decorate(body: F) -> F:
        signature = inspect.signature(body)

        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            resource = name.format(**bound.arguments)
            lock = _clients.get(make_client).lock(
                resource, ttl=ttl, wait=wait if on_busy == "wait" else 0.0
            )
            try:
                lock.acquire()
            except LockNotAcquired as exc:
                return _busy(exc, resource)
            try:
                if fence_arg is not None:
                    kwargs[fence_arg] = lock.fence
                return body(*args, **kwargs)
            finally:
                lock.release()

        def _busy(exc: LockNotAcquired, resource: str) -> Skipped:
            holder = exc.holder.owner if exc.holder else None
            if on_busy == "retry":
                countdown = retry_countdown
                if exc.holder is not None:
                    countdown = min(max(exc.holder.ttl_remaining, 0.1), countdown)
                task = current_task
                if task is None:
                    raise RuntimeError("on_busy='retry' outside a Celery task") from exc
                options: dict[str, Any] = {"countdown": countdown, "exc": exc}
                if max_retries is not None:
                    options["max_retries"] = max_retries
                raise task.retry(**options)
            log.info("skipped: %s is held by %s", resource, holder)
            return Skipped(skipped=True, resource=resource, holder=holder)

        # Celery checks a call's arguments against this: the fence is ours to give.
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[
                parameter
                for parameter in signature.parameters.values()
                if parameter.name != fence_arg
            ]
        )
        return run  # type: ignore[return-value]

    return decorate
