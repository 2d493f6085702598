"""A set waiting in line, on every database: woken by the release it waits
for, as a single waiter is (not by its next poll)."""

from __future__ import annotations

import threading
import time

import pytest
from lockkeeper_core import queue as line_module
from lockkeeper_core.values import Member

from app.extensions import lock_service

pytestmark = pytest.mark.usefixtures("backend")

# Far longer than any deadline below: a set that waited for its next look
# (the poll interval, or PostgreSQL's safety look) would fail the test.
LONG_PAUSE = 600.0
# How long the tests give a woken set to be granted: a loaded machine's
# seconds, far below ``LONG_PAUSE``.
GRANTED_WITHIN = 60.0


def _poll(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        threading.Event().wait(0.01)


def _owners(service, resource: str) -> list[str]:
    return [waiter.owner for waiter in service.queue.line(resource)]


def test_a_waiting_set_is_woken_by_the_release_not_by_its_poll(
    make_app, backend, monkeypatch
):
    """The line's pauses made far longer than the test: the set waits for
    its second member (the holder's ttl is longer still), and is granted
    after the release only because the release wakes it (PostgreSQL: a
    NOTIFY heard by the listener; elsewhere: in this process)."""
    monkeypatch.setattr(line_module, "NOTIFY_SAFETY_INTERVAL", LONG_PAUSE)
    app = make_app(LOCKKEEPER_MAX_WAIT=LONG_PAUSE)
    with app.app_context():
        service = lock_service()
        service.queue.poll_interval = LONG_PAUSE
        assert service.acquire("set:b", "holder", ttl=3600).acquired
        answers = []
        granted = threading.Event()

        def waiting_set():
            try:
                with app.app_context():
                    answers.append(
                        lock_service().acquire_set(
                            [Member("set:a"), Member("set:b")],
                            "w-set",
                            ttl=30,
                            wait=GRANTED_WITHIN * 2,
                        )
                    )
            except BaseException as exc:  # noqa: BLE001 - shown by the test
                answers.append(exc)
            granted.set()

        thread = threading.Thread(target=waiting_set, daemon=True)
        thread.start()
        _poll(
            lambda: (
                answers
                or _owners(service, "set:a") == _owners(service, "set:b") == ["w-set"]
            ),
            "the set took its places",
        )
        assert not answers, answers
        if backend == "postgresql":
            # Listening before the release: a listener that connects later
            # wakes every waiter once, which would prove nothing.
            listener = service.queue.listener()
            _poll(lambda: listener.healthy, "the listener LISTENs")
        service.release("set:b", "holder")
        assert granted.wait(GRANTED_WITHIN), "the release did not wake the set"
        (answer,) = answers
        assert answer.acquired
        assert [lock.owner for lock in answer.locks] == ["w-set", "w-set"]
        assert _owners(service, "set:a") == _owners(service, "set:b") == []
        thread.join(GRANTED_WITHIN)
