"""The Celery app the worker tests start real workers of (``celery -A
tests.celery_tasks worker``). Broker and result backend: Redis on 127.0.0.1:6379;
each test gives its workers a queue of their own (``LOCKKEEPER_TEST_CELERY_QUEUE``)
so parallel runs never take each other's tasks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready
from celery_once import QueueOnce
from celery_singleton import Singleton

# celery-once and -singleton import their backend by name only when a task runs:
# imported here so that a worker checks the backends' settings when it starts.
from lockkeeper_client import celery_backends  # noqa: F401
from lockkeeper_client.celery import locked

REDIS = os.environ.get("LOCKKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("LOCKKEEPER_TEST_CELERY_QUEUE", "lockkeeper-tests")

app = Celery("lockkeeper_tests", broker=REDIS, backend=REDIS)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)


@worker_ready.connect
def _ready(**_: object) -> None:
    marker = os.environ.get("LOCKKEEPER_TEST_CELERY_READY")
    if marker:
        Path(marker).write_text(str(os.getpid()))


def _record(log: str, **entry: object) -> None:
    with open(log, "a") as out:
        out.write(json.dumps(entry) + "\n")


@app.task
@locked("report:{month}", ttl=5, on_busy="wait", wait=60)
def report_in_line(month: str, log: str, hold: float, *, fence: int) -> int:
    """Waits its turn; records when it ran and with which fence."""
    _record(log, event="start", fence=fence, at=time.time(), pid=os.getpid())
    time.sleep(hold)  # the work
    _record(log, event="end", fence=fence, at=time.time(), pid=os.getpid())
    return fence


@app.task
@locked("report:{month}", ttl=5, on_busy="skip")
def report_or_skip(month: str, *, fence: int) -> int:
    return fence


@app.task(bind=True, max_retries=50)
@locked("report:{month}", ttl=5, on_busy="retry", retry_countdown=0.2)
def report_or_retry(self, month: str, *, fence: int) -> dict[str, int]:
    return {"fence": fence, "retries": self.request.retries}


@app.task
@locked("report:{month}", ttl=2, on_busy="wait", wait=30)
def report_until_released(month: str, started: str, *, fence: int) -> int:
    """Holds the lock until its worker is killed (the test removes nothing)."""
    Path(started).write_text(str(fence))
    while True:
        time.sleep(0.05)


# celery-once and celery-singleton on Lockkeeper (lockkeeper_client.celery_backends):
# the producer (the test) and the worker both find the server and token in
# LOCKKEEPER_URL and LOCKKEEPER_TOKEN.
app.conf.ONCE = {
    "backend": "lockkeeper_client.celery_backends.CeleryOnce",
    "settings": {"default_timeout": 60},
}
app.conf.singleton_backend_class = "lockkeeper_client.celery_backends.CelerySingleton"


@app.task(base=QueueOnce, once={"graceful": True, "keys": ["month"]})
def once_report(month: str, log: str, hold: float) -> str:
    """Queued once per month at a time (celery-once); records when it ran."""
    _record(log, event="start", month=month, at=time.time(), pid=os.getpid())
    time.sleep(hold)  # the work
    _record(log, event="end", month=month, at=time.time(), pid=os.getpid())
    return month


@app.task(base=Singleton, unique_on=["month"])
def singleton_report(month: str, started: str, go: str) -> str:
    """One at a time per month (celery-singleton): marks that it started, then
    runs until the file ``go`` exists."""
    Path(started).write_text(month)
    while not Path(go).exists():
        time.sleep(0.02)
    return month


@app.task
@locked("report:{month}", ttl=2, on_busy="skip")
def report_until_lost(month: str, started: str, log: str, *, fence: int) -> int:
    """Works until its lock is lost, as a careful body does: checks before each
    step; records what it saw."""
    from lockkeeper_client.celery import current_lock

    Path(started).write_text(str(fence))
    held = current_lock()
    deadline = time.monotonic() + 30
    while not held.lost.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    _record(log, event="saw-lost", lost=held.lost.is_set(), reason=held.lost_reason)
    return fence  # returns normally: the task must still fail


@app.task
def take_without_waiting(resource: str) -> int:
    """A plain body that lets the client's exception out."""
    from lockkeeper_client import LockClient

    with LockClient(os.environ["LOCKKEEPER_URL"], os.environ["LOCKKEEPER_TOKEN"]) as c:
        with c.lock(resource, ttl=5, wait=0) as held:
            return held.fence
