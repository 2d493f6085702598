"""celery-once and celery-singleton on Lockkeeper
(``lockkeeper_client.celery_backends``): the lock is taken in the producer (this
test) and cleared in a real ``celery worker`` by key alone, against a live
server; and a clear never removes a take that replaced the one it read."""

from __future__ import annotations

import json
import uuid

import celery_singleton.backends
import pytest
from celery import states
from lockkeeper_client import LockClient, LockMissing
from lockkeeper_client.celery_backends import (
    CeleryOnce,
    CelerySingleton,
    _clear,
    resource_for,
)

from tests import celery_tasks
from tests.live_server import serve
from tests.test_client_celery import _events, _wait_for, queue, start_worker

__all__ = ["queue", "start_worker"]  # fixtures, used by name

pytestmark = pytest.mark.slow


@pytest.fixture
def producer(live_server, monkeypatch) -> None:
    """This process as the producer: the backends find the server in the
    environment, as the workers do; celery-singleton's cached backend is made
    anew for this server."""
    monkeypatch.setenv("LOCKKEEPER_URL", live_server.url)
    monkeypatch.setenv("LOCKKEEPER_TOKEN", live_server.token)
    monkeypatch.setattr(celery_singleton.backends, "_backend", None)


def test_resource_names_of_keys():
    assert resource_for("SINGLETONLOCK_0f3a") == "SINGLETONLOCK_0f3a"
    assert resource_for("qo_tasks.add_a-1", "celery:") == "celery:qo_tasks.add_a-1"
    odd = resource_for("qo_tasks.add_x-{'b': 1}")
    assert odd.startswith("qo_tasks.add_x---b-:-1-:")
    assert odd != resource_for("qo_tasks.add_x-{'b': 2}")
    assert len(resource_for("k" * 300 + " ")) <= 255


def test_celery_once_queues_a_key_once_until_the_worker_clears_it(
    live_server, producer, start_worker, queue, tmp_path
):
    start_worker("w1")
    log = tmp_path / "runs.jsonl"
    first = celery_tasks.once_report.apply_async(
        args=("2026-09", str(log), 0.5), queue=queue
    )
    # Queued (or running): the same key again is refused in the producer.
    again = celery_tasks.once_report.apply_async(
        args=("2026-09", str(log), 0.0), queue=queue
    )
    assert again.state == states.REJECTED
    other_month = celery_tasks.once_report.apply_async(
        args=("2026-10", str(log), 0.0), queue=queue
    )
    assert first.get(timeout=60) == "2026-09"
    assert other_month.get(timeout=60) == "2026-10"
    # The worker cleared the key after the run: it queues again.
    resource = "qo_tests.celery_tasks.once_report_month-2026-09"
    _wait_for(lambda: _free(live_server, resource), "the worker's clear")
    third = celery_tasks.once_report.apply_async(
        args=("2026-09", str(log), 0.0), queue=queue
    )
    assert third.get(timeout=60) == "2026-09"
    # The task's result comes before the worker clears its key (celery_once
    # releases in after_return): wait for that release before reading them.
    _wait_for(lambda: _free(live_server, resource), "the worker's second clear")
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["month"] for r in runs if r["event"] == "start"].count("2026-09") == 2
    # By the lock's history: each take had an owner of its own, released by it.
    events = _events(live_server, resource)
    takes = [e for e in events if e["action"] == "acquired"]
    releases = [e for e in events if e["action"] == "released"]
    assert len(takes) == 2
    assert len({e["owner"] for e in takes}) == 2
    assert all(e["owner"].startswith("celery-once:") for e in takes)
    assert [e["owner"] for e in releases] == [e["owner"] for e in takes]


def test_celery_singleton_runs_one_task_per_key_and_names_it(
    live_server, producer, start_worker, queue, tmp_path
):
    start_worker("w1")
    started, go = tmp_path / "started", tmp_path / "go"
    first = celery_tasks.singleton_report.apply_async(
        args=("2026-11", str(started), str(go)), queue=queue
    )
    _wait_for(started.exists, "the singleton task running")
    # The same key while it runs: celery-singleton answers the running task.
    duplicate = celery_tasks.singleton_report.apply_async(
        args=("2026-11", str(started), str(go)), queue=queue
    )
    assert duplicate.id == first.id
    key = celery_tasks.singleton_report.generate_lock(
        celery_tasks.singleton_report.name, ["2026-11", str(started), str(go)], {}
    )
    backend = CelerySingleton()
    assert backend.get(key) == first.id
    go.write_text("go")
    assert first.get(timeout=60) == "2026-11"
    # The worker unlocked the key on success: a new task of it runs.
    _wait_for(lambda: backend.get(key) is None, "the worker's unlock")
    started.unlink()
    later = celery_tasks.singleton_report.apply_async(
        args=("2026-11", str(started), str(go)), queue=queue
    )
    assert later.id != first.id
    assert later.get(timeout=60) == "2026-11"
    grants = [
        e for e in _events(live_server, resource_for(key)) if e["action"] == "acquired"
    ]
    assert [e["owner"] for e in grants] == [
        f"celery-singleton:{first.id}",
        f"celery-singleton:{later.id}",
    ]


def test_a_clear_never_removes_the_take_that_replaced_the_one_it_read(
    make_app, clock, monkeypatch
):
    """The race a read-then-delete by key would lose: the clear reads the key's
    holder, that lock expires and another producer takes the key, then the
    clear's release comes. It names the old owner, so it is refused and the new
    take stays. (The server's clock is a fake one the test moves: the expiry
    comes after the read however slowly the machine runs.)"""
    key = f"qo_race_{uuid.uuid4().hex}"
    resource = resource_for(key)
    with (
        serve(make_app(LOCKKEEPER_CLOCK=clock)) as live,
        LockClient(live.url, live.token) as client,
    ):
        monkeypatch.setenv("LOCKKEEPER_URL", live.url)
        monkeypatch.setenv("LOCKKEEPER_TOKEN", live.token)
        once = CeleryOnce({})
        once.raise_or_lock(key, timeout=30)
        read = client.get(resource)  # what the clear read
        clock.advance(31)  # the first take expires
        assert _free(live, resource)
        once.raise_or_lock(key, timeout=30)  # another producer's take
        replaced = client.get(resource)
        assert replaced.owner != read.owner

        class Stale:
            """The client as the clear saw it: the holder read before."""

            def get(self, _resource: str):
                return read

            def release(self, resource: str, owner: str) -> None:
                client.release(resource, owner)

        assert _clear(Stale(), resource, "celery-once:") is False  # type: ignore[arg-type]
        assert client.get(resource).owner == replaced.owner
        assert client.get(resource).fence == replaced.fence
        # A clear now removes the take in place.
        assert once.clear_lock(key) is True
        with pytest.raises(LockMissing):
            client.get(resource)


def _free(server, resource: str) -> bool:
    with LockClient(server.url, server.token) as client:
        try:
            client.get(resource)
        except LockMissing:
            return True
    return False
