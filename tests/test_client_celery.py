"""``lockkeeper_client.celery.locked`` under real Celery workers (Redis broker,
``celery worker`` processes) against a live Lockkeeper server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
from lockkeeper_client import LockClient, LockLost, LockNotAcquired

from app.paths import PROJECT_ROOT
from tests import celery_tasks

pytestmark = pytest.mark.slow


def _events(server, resource: str) -> list[dict]:
    """The resource's audit history, oldest first."""
    response = httpx.get(
        f"{server.url}/api/v1/locks/{resource}/events",
        params={"limit": 500},
        headers=server.auth_headers,
        timeout=10,
    )
    response.raise_for_status()
    return list(reversed(response.json()["events"]))


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue of this test's own; its keys leave Redis with the test."""
    name = f"lockkeeper-test-{uuid.uuid4().hex}"
    yield name
    with redis.Redis.from_url(celery_tasks.REDIS) as broker:
        broker.delete(
            name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}"
        )


@pytest.fixture
def start_worker(live_server, queue, tmp_path):
    """``start_worker(name)``: a ``celery worker`` process (solo pool: one task at
    a time) on this test's queue, returned once it is ready."""
    started: list[subprocess.Popen] = []

    def start(name: str) -> subprocess.Popen:
        ready = tmp_path / f"{name}.ready"
        env = {
            **os.environ,
            "LOCKKEEPER_URL": live_server.url,
            "LOCKKEEPER_TOKEN": live_server.token,
            "LOCKKEEPER_TEST_CELERY_QUEUE": queue,
            "LOCKKEEPER_TEST_CELERY_READY": str(ready),
        }
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery_tasks",
                "worker",
                "--pool=solo",
                "-Q",
                queue,
                "-n",
                f"{name}-{queue}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=warning",
            ],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"{name}.log", "w"),  # noqa: SIM115
            start_new_session=True,
        )
        started.append(worker)
        _wait_for(ready.exists, f"celery worker {name} ready")
        return worker

    yield start
    for worker in started:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)


def test_two_workers_given_the_same_key_at_once_never_run_it_concurrently(
    live_server, start_worker, queue, tmp_path
):
    start_worker("w1")
    start_worker("w2")
    log = tmp_path / "runs.jsonl"
    results = [
        celery_tasks.report_in_line.apply_async(
            args=("2026-05", str(log), 0.3), queue=queue
        )
        for _ in range(6)
    ]
    fences = [result.get(timeout=60) for result in results]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({run["pid"] for run in runs}) == 2, "both workers ran some"
    # By the lock's own history: every grant ends (released) before the next.
    events = _events(live_server, "report:2026-05")
    grants = [e for e in events if e["action"] in ("acquired", "took_over")]
    assert sorted(e["fence"] for e in grants) == sorted(fences)
    holder = None
    for event in events:
        if event["action"] in ("acquired", "took_over"):
            assert holder is None, f"granted while {holder} held it: {event}"
            holder = event["owner"]
        elif event["action"] == "released":
            assert event["owner"] == holder or event["previous_owner"] == holder
            holder = None
    # And by the bodies themselves: each starts after the one before ended.
    spans = sorted(
        (run["at"], run["event"]) for run in runs if run["event"] in ("start", "end")
    )
    assert [kind for _, kind in spans] == ["start", "end"] * 6


def test_a_busy_key_is_skipped_and_reported_as_skipped(
    live_server, start_worker, queue
):
    start_worker("w1")
    with LockClient(live_server.url, live_server.token) as holder:
        assert holder.acquire("report:2026-06", "cron-host", ttl=30).acquired
        result = celery_tasks.report_or_skip.apply_async(args=("2026-06",), queue=queue)
        assert result.get(timeout=30) == {
            "skipped": True,
            "resource": "report:2026-06",
            "holder": "cron-host",
        }
        holder.release("report:2026-06", "cron-host")
    ran = celery_tasks.report_or_skip.apply_async(args=("2026-06",), queue=queue)
    assert isinstance(ran.get(timeout=30), int)  # free: the body ran, with a fence


def test_a_busy_key_is_retried_by_celery_until_the_holder_lets_go(
    live_server, start_worker, queue
):
    start_worker("w1")
    with LockClient(live_server.url, live_server.token) as holder:
        assert holder.acquire("report:2026-07", "cron-host", ttl=30).acquired
        result = celery_tasks.report_or_retry.apply_async(
            args=("2026-07",), queue=queue
        )
        _wait_for(lambda: result.state == "RETRY", "a retry while the lock is held", 30)
        holder.release("report:2026-07", "cron-host")
    ran = result.get(timeout=30)
    assert ran["retries"] >= 1
    assert ran["fence"] > 0


def test_a_killed_workers_lock_is_taken_over_after_its_ttl(
    live_server, start_worker, queue, tmp_path
):
    doomed = start_worker("doomed")
    started = tmp_path / "started"
    celery_tasks.report_until_released.apply_async(
        args=("2026-08", str(started)), queue=queue
    )
    _wait_for(started.exists, "the task holding the lock")
    first_fence = int(started.read_text())
    os.killpg(doomed.pid, signal.SIGKILL)  # no release, no more renewals
    doomed.wait(10)
    start_worker("heir")
    log = tmp_path / "runs.jsonl"
    sent = time.monotonic()
    fence = celery_tasks.report_in_line.apply_async(
        args=("2026-08", str(log), 0), queue=queue
    ).get(timeout=60)
    assert fence > first_fence
    assert time.monotonic() - sent < 30  # the 2 s ttl, not the task's wait of 30
    events = _events(live_server, "report:2026-08")
    grants = [e for e in events if e["action"] in ("acquired", "took_over")]
    assert [e["fence"] for e in grants] == [first_fence, fence]
    assert not [
        e for e in events if e["action"] == "released" and e["fence"] == first_fence
    ]


def test_a_task_whose_lock_is_taken_over_sees_it_and_fails_with_lock_lost(
    live_server, start_worker, queue, tmp_path
):
    start_worker("w1")
    started, log = tmp_path / "started", tmp_path / "seen.jsonl"
    result = celery_tasks.report_until_lost.apply_async(
        args=("2026-09", str(started), str(log)), queue=queue
    )
    _wait_for(started.exists, "the task holding the lock")
    live_server.force_release("report:2026-09", reason="stuck")
    with LockClient(live_server.url, live_server.token) as other:
        assert other.acquire("report:2026-09", "other-worker", ttl=30).acquired
        with pytest.raises(LockLost, match="report:2026-09") as caught:
            result.get(timeout=30)
        assert caught.value.resource == "report:2026-09"
        assert result.state == "FAILURE"
        (seen,) = [json.loads(line) for line in log.read_text().splitlines()]
        assert seen["lost"] is True
        # The loss was the body's only: the new holder keeps its lock.
        assert other.get("report:2026-09").owner == "other-worker"


def test_a_task_raising_lock_not_acquired_is_caught_by_type_in_the_caller(
    live_server, start_worker, queue
):
    start_worker("w1")
    with LockClient(live_server.url, live_server.token) as holder:
        assert holder.acquire("report:2026-10", "cron-host", ttl=30).acquired
        result = celery_tasks.take_without_waiting.apply_async(
            args=("report:2026-10",), queue=queue
        )
        with pytest.raises(LockNotAcquired, match="cron-host") as caught:
            result.get(timeout=30)
    assert caught.value.resource == "report:2026-10"
    assert "report:2026-10" in str(caught.value)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"LOCKKEEPER_URL": None}, "LOCKKEEPER_URL"),
        ({"LOCKKEEPER_TOKEN": ""}, "token is empty"),
        ({"LOCKKEEPER_URL": "locks.internal:8000"}, "http://locks.internal:8000"),
    ],
)
def test_a_worker_without_its_lockkeeper_settings_refuses_to_start(
    live_server, queue, tmp_path, settings, says
):
    """It would run @locked tasks it cannot lock, and celery-once/-singleton tasks
    whose locks it cannot clear (held for their whole ttl, 24 h by default)."""
    env = {
        **os.environ,
        "LOCKKEEPER_URL": live_server.url,
        "LOCKKEEPER_TOKEN": live_server.token,
        "LOCKKEEPER_TEST_CELERY_QUEUE": queue,
        "LOCKKEEPER_TEST_CELERY_READY": str(tmp_path / "ready"),
    }
    for name, value in settings.items():
        if value is None:
            del env[name]
        else:
            env[name] = value
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.celery_tasks",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode != 0
    assert "cannot start" in worker.stderr
    assert says in worker.stderr
    assert "celery-once" in worker.stderr  # the backends' settings are named too
    assert not (tmp_path / "ready").exists()
