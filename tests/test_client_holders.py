"""Semaphores and shared locks from the worker's side: both clients' ``limit=`` and
``shared=True``, and ``lockkeeper exec --limit/--shared``, against a live server on
each database."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from lockkeeper_client import LimitMismatch, LockClient, LockNotAcquired

from tests.client_flavours import FLAVOURS, connect
from tests.test_exec import LOCKKEEPER, child, exec_environment


@pytest.fixture(params=FLAVOURS)
def worker(request, live_server, backend):
    with connect(
        request.param, live_server.url, live_server.token, timeout=5
    ) as lock_client:
        yield lock_client


def test_a_semaphore_grants_its_holders_each_with_a_fence_then_refuses(worker):
    grants = [worker.acquire("report-builds", f"w-{n}", 30, limit=3) for n in range(3)]
    assert all(grant.acquired for grant in grants), grants
    fences = [grant.lock.fence for grant in grants]
    assert fences == sorted(set(fences))  # each its own, in grant order
    assert {grant.lock.limit for grant in grants} == {3}
    assert grants[-1].lock.holders == 3
    assert grants[-1].lock.mode == "exclusive"

    refused = worker.acquire("report-builds", "w-3", 30, limit=3)
    assert not refused.acquired
    assert refused.lock is not None  # the holder that ends first
    assert refused.lock.owner == "w-0"
    assert refused.retry_after is not None

    worker.release("report-builds", "w-1")
    again = worker.acquire("report-builds", "w-3", 30, limit=3)
    assert again.acquired
    assert again.lock.fence > max(fences)


def test_shared_grants_coexist_and_an_exclusive_one_waits_for_them(worker):
    first = worker.acquire("cache:prices", "reader-1", 30, shared=True)
    second = worker.acquire("cache:prices", "reader-2", 30, shared=True)
    assert first.acquired
    assert second.acquired
    assert second.lock.mode == "shared"
    assert second.lock.holders == 2

    writer = worker.acquire("cache:prices", "writer", 30)
    assert not writer.acquired
    worker.release("cache:prices", "reader-1")
    worker.release("cache:prices", "reader-2")
    assert worker.acquire("cache:prices", "writer", 30).acquired


def test_another_limit_on_a_resource_in_use_raises_limit_mismatch(worker):
    assert worker.acquire("licences", "w-1", 30, limit=4).acquired
    with pytest.raises(LimitMismatch) as refused:
        worker.acquire("licences", "w-2", 30, limit=2)
    assert refused.value.limit == 4
    assert refused.value.status == 409
    with pytest.raises(LimitMismatch):
        worker.acquire("licences", "w-2", 30, shared=True)


def test_the_lock_block_with_a_limit_never_lets_more_inside(live_server, backend):
    inside = 0
    most_inside = 0
    guard = threading.Lock()
    fences: list[int] = []
    # The first holder stays inside until a second one is there with it, so the
    # two holders are seen taken at once however the threads are scheduled.
    two_inside = threading.Event()

    def run(client: LockClient) -> None:
        nonlocal inside, most_inside
        with client.lock("heavy-query", ttl=10, wait=30, limit=2) as holder:
            with guard:
                inside += 1
                most_inside = max(most_inside, inside)
                fences.append(holder.fence)
                if inside == 2:
                    two_inside.set()
            two_inside.wait(timeout=30)
            time.sleep(0.05)  # the work while a holder: others must wait
            with guard:
                inside -= 1

    with LockClient(live_server.url, live_server.token) as client:
        threads = [threading.Thread(target=run, args=(client,)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert most_inside == 2
    assert len(set(fences)) == 6


def test_the_client_refuses_a_shared_lock_with_a_limit_before_sending(live_server):
    with LockClient(live_server.url, live_server.token) as client:
        with pytest.raises(ValueError, match="shared"):
            client.lock("cache:prices", shared=True, limit=3)
        with pytest.raises(ValueError, match="limit"):
            client.lock("cache:prices", limit=0)


def test_a_held_semaphore_refuses_in_lock_block_after_the_wait(live_server):
    with LockClient(live_server.url, live_server.token) as client:
        with client.lock("pair", ttl=10, wait=1, limit=2):
            with client.lock("pair", ttl=10, wait=1, limit=2):
                with pytest.raises(LockNotAcquired):
                    client.lock("pair", ttl=10, wait=0.2, limit=2).acquire()


def _exec(env, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LOCKKEEPER, "exec", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_exec_with_a_limit_runs_beside_others_up_to_it(live_server, tmp_path):
    env = exec_environment(live_server, tmp_path / "untouched")
    with LockClient(live_server.url, live_server.token) as client:
        assert client.acquire("nightly", "elsewhere", 30, limit=2).acquired
        beside = _exec(
            env,
            "--limit",
            "2",
            "--wait",
            "0",
            "nightly",
            "--",
            *child("import os; print(os.environ['LOCKKEEPER_FENCE'])"),
        )
        assert beside.returncode == 0, beside.stderr
        assert int(beside.stdout.strip()) > 0

        assert client.acquire("nightly", "elsewhere-2", 30, limit=2).acquired
        full = _exec(env, "--limit", "2", "--wait", "0", "nightly", "--", "true")
        assert full.returncode == 75, full.stderr

        mismatch = _exec(env, "--limit", "3", "--wait", "0", "nightly", "--", "true")
        assert mismatch.returncode == 75
        assert "limit" in mismatch.stderr


def test_exec_shared_runs_beside_a_reader_not_beside_a_writer(live_server, tmp_path):
    env = exec_environment(live_server, tmp_path / "untouched")
    with LockClient(live_server.url, live_server.token) as client:
        assert client.acquire("cache:rebuild", "reader", 30, shared=True).acquired
        reading = _exec(env, "--shared", "--wait", "0", "cache:rebuild", "--", "true")
        assert reading.returncode == 0, reading.stderr
        writing = _exec(env, "--wait", "0", "cache:rebuild", "--", "true")
        assert writing.returncode == 75, writing.stderr


def test_exec_refuses_shared_with_a_limit(live_server, tmp_path):
    env = exec_environment(live_server, tmp_path / "untouched")
    refused = _exec(env, "--shared", "--limit", "2", "r", "--", "true")
    assert refused.returncode == 2
    assert "--shared takes no --limit" in refused.stderr
