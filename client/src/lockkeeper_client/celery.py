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

A lost lock is never silent: ``current_lock()`` in the body is its ``HeldLock``
(``current_lock().lost`` is set at the loss; ``current_lock().check()`` raises
``LockLost`` then, for a body that stops at its next step), and a body that
returns after its lock was lost fails the task with ``LockLost`` (its result is
not trusted: someone else may have held the lock meanwhile). The caller's
``result.get()`` raises it by type, as it raises ``LockNotAcquired`` and the
other client exceptions a body lets out.

When another holder has the lock (``on_busy``):

- ``"skip"``: the body does not run; the task returns ``{"skipped": true,
  "resource": ..., "holder": ...}`` (``Skipped``) and logs it;
- ``"retry"``: Celery's own ``task.retry(countdown=...)``, the countdown being the
  holder's ``Retry-After`` (at most ``retry_countdown``);
- ``"wait"``: waits in the server's line up to ``wait`` seconds, then skips.

The server and token come from ``client=`` (a ``LockClient``, or a callable making
one), else from ``LOCKKEEPER_URL`` and ``LOCKKEEPER_TOKEN`` in the worker's
environment; the client is made on first use in each worker process (after the
fork). A worker whose ``@locked`` tasks (or Lockkeeper celery-once/-singleton
backends, see ``celery_backends``) lack those settings, or have an empty token
or a URL without a scheme, refuses to start (``celeryd_init``), naming what to
set: it never runs a task it cannot lock, nor leaves locks it cannot clear. The
adapter holds no rule of its own: who gets the lock is the server's.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Literal, TypedDict, TypeVar

from celery import current_task  # type: ignore[import-untyped]
from celery.signals import celeryd_init  # type: ignore[import-untyped]

from lockkeeper_client import HeldLock, LockClient, LockNotAcquired
from lockkeeper_client.errors import ConfigurationError

log = logging.getLogger("lockkeeper_client.celery")

Busy = Literal["skip", "retry", "wait"]
F = TypeVar("F", bound=Callable[..., Any])


class Skipped(TypedDict):
    """What a task returns instead of running while another holder has its lock."""

    skipped: bool
    resource: str
    holder: str | None


class _Clients:
    """One client per worker process and source (the environment, or a
    ``client=`` factory), made on first use (never across a fork)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pid = os.getpid()
        self._made: dict[object, LockClient] = {}

    def get(self, source: object, make: Callable[[], LockClient]) -> LockClient:
        with self._guard:
            if os.getpid() != self._pid:
                self._pid, self._made = os.getpid(), {}
            if source not in self._made:
                self._made[source] = make()
            return self._made[source]


_clients = _Clients()
_held: contextvars.ContextVar[HeldLock | None] = contextvars.ContextVar(
    "lockkeeper_client.celery.held", default=None
)


def current_lock() -> HeldLock:
    """The lock the running ``@locked`` body holds: ``.lost``, ``.check()``,
    ``.fence``, ``.expires_at``.

    :raise RuntimeError: called outside a ``@locked`` body.
    """
    held = _held.get()
    if held is None:
        raise RuntimeError("current_lock() outside the body of a @locked task")
    return held


# The @locked tasks that find their server in the environment: a worker checks
# it at start.
_from_the_environment: list[str] = []


def start_problems(conf: Any) -> list[str]:
    """What keeps this worker from locking: the environment of its ``@locked``
    tasks, and the settings of Lockkeeper backends in ``conf``."""
    problems = []
    if _from_the_environment:
        try:
            _from_environment().close()
        except (RuntimeError, ConfigurationError) as exc:
            tasks = ", ".join(_from_the_environment)
            problems.append(f"@locked tasks ({tasks}): {exc}")
    if conf is not None:
        from lockkeeper_client.celery_backends import settings_problems

        problems.extend(settings_problems(conf))
    return problems


def _refuse_to_start_unconfigured(conf: Any = None, **_: Any) -> None:
    problems = start_problems(conf)
    if problems:
        # SystemExit, not an Exception: Celery logs and ignores those from a
        # signal handler, and the worker would start anyway.
        raise SystemExit(
            "lockkeeper_client: this worker cannot start: " + "; ".join(problems)
        )


celeryd_init.connect(_refuse_to_start_unconfigured, weak=False)


def _from_environment() -> LockClient:
    try:
        return LockClient(os.environ["LOCKKEEPER_URL"], os.environ["LOCKKEEPER_TOKEN"])
    except KeyError as exc:
        raise RuntimeError(
            f"lockkeeper_client.celery: set {exc.args[0]} in the worker's "
            "environment, or pass client= to @locked"
        ) from None


def locked(
    name: str | None = None,
    *,
    key: Callable[..., str] | None = None,
    owner: str | Callable[..., str] | None = None,
    ttl: float = 60.0,
    on_busy: Busy = "skip",
    wait: float = 30.0,
    retry_countdown: float = 60.0,
    max_retries: int | None = None,
    fence_arg: str | None = "fence",
    client: LockClient | Callable[[], LockClient] | None = None,
) -> Callable[[F], F]:
    """Run the decorated task body only while holding the lock ``name``, formatted
    with the task's arguments by name (``"report:{month}"``), or named by
    ``key(**arguments)``. A name with characters no resource name may hold (a
    ``/``, a space) becomes its allowed characters and a hash of the whole name
    (``celery_backends.resource_for``), so any argument value works.

    :param owner: the holder's name (a string, or ``owner(**arguments)``);
        default: a fresh one per run.

    :param ttl: the lock's ttl; it is renewed every ``ttl / 3`` while the body runs.
    :param on_busy: ``"skip"``, ``"retry"`` or ``"wait"`` (see the module).
    :param wait: seconds ``"wait"`` waits in line before it skips.
    :param retry_countdown: the longest countdown ``"retry"`` asks Celery for.
    :param max_retries: passed to ``task.retry`` (None: the task's own).
    :param fence_arg: the keyword the fence is passed as; None: not passed.
    """
    if (name is None) == (key is None):
        raise ValueError("@locked takes a name or key=, one of them")
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
        if client is None:
            _from_the_environment.append(getattr(body, "__qualname__", repr(body)))

        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            from lockkeeper_client.celery_backends import resource_for

            bound = signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            if key is not None:
                resource = resource_for(key(**arguments))
            else:
                resource = resource_for(str(name).format(**arguments))
            held_by = (
                client
                if isinstance(client, LockClient)
                else _clients.get(client, make_client)
            )
            lock = held_by.lock(
                resource,
                ttl=ttl,
                wait=wait if on_busy == "wait" else 0.0,
                owner=owner(**arguments) if callable(owner) else owner,
            )
            try:
                lock.acquire()
            except LockNotAcquired as exc:
                return _busy(exc, resource)
            if fence_arg is not None:
                kwargs[fence_arg] = lock.fence
            entered = _held.set(lock)
            try:
                result = body(*args, **kwargs)
            except BaseException as exc:
                lock.__exit__(type(exc), exc, exc.__traceback__)
                raise
            finally:
                _held.reset(entered)
            lock.__exit__(None, None, None)  # LockLost if it was lost meanwhile
            return result

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
