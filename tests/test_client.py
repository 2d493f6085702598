"""The worker client against a real server (threaded Werkzeug on a file SQLite DB)."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from lockkeeper_client import (
    AccessDenied,
    AlreadyHeld,
    AuthenticationFailed,
    InvalidRequest,
    LockClient,
    LockLost,
    LockMissing,
    LockNotAcquired,
    LockQuotaReached,
    ServiceUnavailable,
)

from tests.client_flavours import FLAVOURS, connect
from tests.live_server import serve


class CeilingJitter(random.Random):
    """Jitter that always picks the top of the window: makes backoff deterministic."""

    def uniform(self, a, b):
        return b


class FailingFront:
    """WSGI middleware: answers ``status`` to the first ``count`` matching requests.

    ``apply_first`` passes the request to the app before failing, like a gateway
    that timed out after the app did the work (the reply is lost, not the request).
    """

    def __init__(self, app, status, count, method=None, apply_first=False):
        self.app = app
        self.status = status
        self.remaining = count
        self.method = method
        self.apply_first = apply_first
        self.seen = 0

    def __call__(self, environ, start_response):
        if self.method in (None, environ["REQUEST_METHOD"]):
            self.seen += 1
            if self.remaining > 0:
                self.remaining -= 1
                if self.apply_first:
                    body = self.app(environ, lambda *args: None)
                    b"".join(body)
                    getattr(body, "close", lambda: None)()
                start_response(
                    f"{self.status} Failing",
                    [("Content-Type", "text/plain"), ("Retry-After", "0")],
                )
                return [b"try again"]
        return self.app(environ, start_response)


@pytest.fixture(params=FLAVOURS)
def make_client(request):
    """``make_client(url, token, **options)``: a ``LockClient``, or an
    ``AsyncLockClient`` behind the same blocking surface: every test that takes
    this fixture runs against both clients."""
    made = []

    def make(url, token, **options):
        made.append(connect(request.param, url, token, **options))
        return made[-1]

    yield make
    for lock_client in made:
        lock_client.close()


@pytest.fixture
def worker(live_server, make_client, backend):
    """A worker on this test's database (each of the three) and client flavour."""
    with make_client(live_server.url, live_server.token, timeout=5) as lock_client:
        yield lock_client


@pytest.fixture
def other_worker(live_server, make_client):
    """A second worker with its own token."""
    token = live_server.create_token("other-worker")
    with make_client(live_server.url, token, timeout=5) as lock_client:
        yield lock_client


# -- single calls ----------------------------------------------------------------


def test_acquire_returns_a_typed_lock_with_aware_utc_timestamps(worker):
    result = worker.acquire("job:42", "w-1", ttl=30)
    assert result.acquired
    lock = result.lock
    assert (lock.resource, lock.owner, lock.state) == ("job:42", "w-1", "held")
    assert lock.fence >= 1
    assert lock.acquired_at.tzinfo is UTC
    assert 29 < (lock.expires_at - lock.acquired_at).total_seconds() <= 30.001
    assert 29 < lock.ttl_remaining <= 30


def test_acquire_of_held_lock_is_refused_with_holder_and_retry_after(
    worker, other_worker
):
    held = worker.acquire("job:42", "w-1", ttl=20).lock
    refused = other_worker.acquire("job:42", "w-2", ttl=5)
    assert not refused.acquired
    assert refused.lock.owner == "w-1"
    assert refused.lock.fence == held.fence
    assert 19 <= refused.retry_after <= 20


def test_get_returns_the_current_holder(worker):
    held = worker.acquire("job:7", "w-1", ttl=30).lock
    assert worker.get("job:7").fence == held.fence
    assert worker.get("job:7").owner == "w-1"


def test_renew_extends_expiry_and_keeps_fence_and_acquired_at(worker):
    first = worker.acquire("job:42", "w-1", ttl=2).lock
    renewed = worker.renew("job:42", "w-1", ttl=60)
    assert renewed.fence == first.fence
    assert renewed.acquired_at == first.acquired_at
    assert renewed.expires_at > first.expires_at
    assert renewed.ttl_remaining > 59


def test_renew_of_expired_lock_raises_lock_lost_naming_the_resource(
    make_client, make_app, clock
):
    with (
        serve(make_app(LOCKKEEPER_CLOCK=clock)) as server,
        make_client(server.url, server.token, timeout=5) as worker,
    ):
        worker.acquire("job:42", "w-1", ttl=1)
        clock.advance(2)
        with pytest.raises(LockLost, match="job:42") as caught:
            worker.renew("job:42", "w-1", ttl=5)
    assert caught.value.resource == "job:42"
    assert caught.value.status == 409


def test_renew_by_another_owner_raises_lock_lost(worker):
    worker.acquire("job:42", "w-1", ttl=30)
    with pytest.raises(LockLost, match="job:42"):
        worker.renew("job:42", "w-2", ttl=5)
    assert worker.get("job:42").owner == "w-1"


def test_release_frees_the_lock(worker):
    worker.acquire("job:42", "w-1", ttl=30)
    worker.release("job:42", "w-1")
    with pytest.raises(LockMissing, match="job:42"):
        worker.get("job:42")


def test_release_by_another_owner_raises_lock_lost_and_keeps_the_lock(worker):
    worker.acquire("job:42", "w-1", ttl=30)
    with pytest.raises(LockLost, match="job:42") as caught:
        worker.release("job:42", "w-2")
    assert caught.value.status == 403
    assert worker.get("job:42").owner == "w-1"


def test_release_of_a_lock_never_held_raises_lock_lost(worker):
    with pytest.raises(LockLost, match="job:none"):
        worker.release("job:none", "w-1")


def test_wrong_token_raises_authentication_failed(make_client, live_server):
    with make_client(live_server.url, "lk_not-a-token") as bad:
        with pytest.raises(AuthenticationFailed, match="job:42"):
            bad.acquire("job:42", "w-1")


def test_quota_answer_raises_lock_quota_reached_with_retry_after(
    make_client, live_server
):
    from app.auth.service import create_token

    with live_server.app.app_context():
        token = create_token("one-lock", max_locks=1)
    with make_client(live_server.url, token, timeout=5) as quota_worker:
        assert quota_worker.acquire("job:1", "w-1", ttl=30).acquired
        with pytest.raises(LockQuotaReached, match="job:2") as caught:
            quota_worker.acquire("job:2", "w-1", ttl=30)
        assert caught.value.status == 429
        assert 0 < caught.value.retry_after <= 30
        with pytest.raises(LockQuotaReached), quota_worker.lock("job:2", wait=5):
            pytest.fail("the block must not run past the quota")


def test_a_token_outside_its_scope_raises_access_denied_not_lock_lost(
    make_client, live_server, worker
):
    from app.auth.service import create_token

    with live_server.app.app_context():
        read_only = create_token("watcher", read_only=True)
        jobs_only = create_token("jobs-only", prefixes=["job:"])
    assert worker.acquire("job:42", "w-1", ttl=30).acquired
    with make_client(live_server.url, read_only, timeout=5) as watcher:
        assert watcher.get("job:42").owner == "w-1"
        with pytest.raises(AccessDenied, match="read-only") as caught:
            watcher.release("job:42", "w-1")
        assert caught.value.status == 403
        with pytest.raises(AccessDenied):
            watcher.acquire("job:43", "w-2")
    with make_client(live_server.url, jobs_only, timeout=5) as scoped:
        with pytest.raises(AccessDenied, match="scope"):
            scoped.acquire("report:1", "w-3")
        # Held by another holder: still the lock's own 403, a lost lock.
        with pytest.raises(LockLost):
            scoped.release("job:42", "w-3")
    assert worker.get("job:42").owner == "w-1"


def test_the_client_imports_neither_flask_nor_sqlalchemy():
    code = (
        "import sys, lockkeeper_client; "
        "assert 'flask' not in sys.modules, 'flask'; "
        "assert 'sqlalchemy' not in sys.modules, 'sqlalchemy'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_invalid_resource_raises_invalid_request_with_field_errors(worker):
    with pytest.raises(InvalidRequest, match="bad name") as caught:
        worker.acquire("bad name", "w-1")
    assert caught.value.status == 400
    assert any(field == "resource" for field, _ in caught.value.errors)


def test_base_url_with_api_prefix_is_accepted(make_client, live_server):
    with make_client(live_server.url + "/api/v1/", live_server.token) as lock_client:
        assert lock_client.acquire("job:1", "w-1").acquired


# -- transient failures ------------------------------------------------------------


def test_unreachable_server_raises_service_unavailable_after_retries(
    make_client, live_server
):
    with serve(live_server.app, token=live_server.token) as doomed:
        url = doomed.url
    start = time.monotonic()
    with make_client(url, live_server.token, retries=2, backoff=0.05) as lock_client:
        with pytest.raises(ServiceUnavailable, match="job:42"):
            lock_client.acquire("job:42", "w-1")
    assert time.monotonic() - start < 5  # two short backoffs, not a hang


def test_503_answers_are_retried_until_the_service_answers(make_client, live_server):
    front = FailingFront(live_server.app.wsgi_app, 503, count=2)
    live_server.app.wsgi_app = front
    with make_client(live_server.url, live_server.token, backoff=0.01) as lock_client:
        assert lock_client.acquire("job:42", "w-1").acquired
    assert front.seen == 3


def test_persistent_503_raises_service_unavailable(make_client, live_server):
    live_server.app.wsgi_app = FailingFront(live_server.app.wsgi_app, 503, count=99)
    with make_client(
        live_server.url, live_server.token, retries=2, backoff=0.01
    ) as lock_client:
        with pytest.raises(ServiceUnavailable, match="job:42.*503"):
            lock_client.get("job:42")


def test_renew_whose_reply_was_lost_is_retried_and_keeps_the_fence(
    make_client, live_server
):
    with make_client(live_server.url, live_server.token, backoff=0.01) as lock_client:
        fence = lock_client.acquire("job:42", "w-1", ttl=5).lock.fence
        front = FailingFront(
            live_server.app.wsgi_app, 502, count=1, method="PATCH", apply_first=True
        )
        live_server.app.wsgi_app = front
        renewed = lock_client.renew("job:42", "w-1", ttl=60)
    assert front.seen == 2
    assert renewed.fence == fence
    assert renewed.ttl_remaining > 59


def test_release_whose_reply_was_lost_is_not_reported_as_a_loss(
    make_client, live_server
):
    with make_client(live_server.url, live_server.token, backoff=0.01) as lock_client:
        lock_client.acquire("job:42", "w-1", ttl=30)
        front = FailingFront(
            live_server.app.wsgi_app, 502, count=1, method="DELETE", apply_first=True
        )
        live_server.app.wsgi_app = front
        lock_client.release("job:42", "w-1")
        assert front.seen == 2
        with pytest.raises(LockMissing):
            lock_client.get("job:42")


# -- with worker.lock(...) -----------------------------------------------------------


def test_lock_block_holds_the_lock_and_releases_it_on_exit(worker):
    with worker.lock("job:42", ttl=10, wait=1) as lock:
        current = worker.get("job:42")
        assert current.owner == lock.owner
        assert current.fence == lock.fence
        assert lock.expires_at == current.expires_at
    assert not lock.lost.is_set()
    with pytest.raises(LockMissing):
        worker.get("job:42")


def test_default_owner_is_random_per_lock(worker):
    with worker.lock("job:1", ttl=5) as first, worker.lock("job:2", ttl=5) as second:
        assert first.owner != second.owner
        assert len(first.owner.rsplit(":", 1)[-1]) == 16


def wait_until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.01)


def test_auto_renew_keeps_a_short_lock_alive_well_past_its_ttl(
    make_client, make_app, clock
):
    """The server's clock moves only once the renewer has caught up with it, so a
    busy machine delays the test but cannot expire the lock under it."""
    with (
        serve(make_app(LOCKKEEPER_CLOCK=clock)) as server,
        make_client(server.url, server.token, timeout=5) as worker,
        worker.lock("job:42", ttl=1, wait=1, renew_every=0.05) as lock,
    ):
        fence = lock.fence
        for _ in range(6):  # three ttls of server time, half a ttl at a time
            renewed_to = clock.advance(0.5) + timedelta(seconds=1)
            wait_until(
                lambda renewed_to=renewed_to: lock.expires_at == renewed_to,
                f"a renewal to {renewed_to}",
            )
        assert not lock.lost.is_set()
        current = worker.get("job:42")
        assert (current.owner, current.fence) == (lock.owner, fence)
        assert not worker.acquire("job:42", "intruder", ttl=1).acquired
    assert not lock.lost.is_set()


def test_two_clients_contend_and_the_waiter_gets_the_lock_after_release(
    make_client, live_server, worker
):
    """Ordered by events, not durations: the waiter asks while the lock is held
    and is granted only after the holder lets go."""
    held = worker.lock("job:42", ttl=30, wait=1)
    held.acquire()
    released = threading.Event()
    acquire_sent = threading.Event()
    outcome = {}

    def wait_for_it():
        with (
            make_client(
                live_server.url, live_server.token, acquire_sent=acquire_sent
            ) as waiter,
            waiter.lock("job:42", ttl=5, wait=30) as lock,
        ):
            outcome["released_first"] = released.is_set()
            outcome["fence"] = lock.fence
            outcome["owner_seen"] = worker.get("job:42").owner == lock.owner

    waiter_thread = threading.Thread(target=wait_for_it)
    waiter_thread.start()
    assert acquire_sent.wait(10)
    assert worker.get("job:42").owner == held.owner
    released.set()
    held.release()
    waiter_thread.join(30)
    assert not waiter_thread.is_alive()
    assert outcome == {
        "released_first": True,
        "fence": outcome["fence"],
        "owner_seen": True,
    }
    assert outcome["fence"] > held.fence


def test_wait_timeout_raises_lock_not_acquired_naming_resource_and_holder(
    worker, other_worker
):
    worker.acquire("job:42", "holder-1", ttl=30)
    start = time.monotonic()
    with pytest.raises(LockNotAcquired, match="job:42.*holder-1") as caught:
        with other_worker.lock("job:42", ttl=5, wait=0.6):
            pytest.fail("the block must not run without the lock")
    assert 0.6 <= time.monotonic() - start < 4  # the wait, not the holder's 30 s
    assert caught.value.holder.owner == "holder-1"
    assert worker.get("job:42").owner == "holder-1"


def test_retry_after_bounds_the_backoff_so_the_waiter_is_back_at_expiry(
    make_client, live_server, worker
):
    worker.acquire("job:42", "crashed-worker", ttl=1)
    # Backoff windows of 6 s, 12 s... with jitter pinned to the top: without the
    # Retry-After bound the first retry would come after 6 s.
    with make_client(
        live_server.url,
        live_server.token,
        backoff=6,
        max_backoff=30,
        rng=CeilingJitter(),
    ) as waiter:
        start = time.monotonic()
        with waiter.lock("job:42", ttl=5, wait=8) as lock:
            waited = time.monotonic() - start
            assert lock.owner != "crashed-worker"
    assert waited < 5  # at the expiry (1 s), not after the first backoff window (6 s)


def test_force_release_mid_block_sets_lost_and_calls_on_lost_once(live_server, worker):
    calls = []
    lock = worker.lock("job:42", ttl=1, wait=1, on_lost=calls.append)

    def block():
        with lock:
            live_server.force_release("job:42", reason="stuck job")
            assert lock.lost.wait(30)  # a deadline: set within a renewal or the ttl

    with pytest.raises(LockLost, match="job:42"):
        block()
    # Leaving the block joined the renewal thread: no later call can come.
    assert calls == [lock]
    assert "job:42" in lock.lost_reason
    with pytest.raises(LockMissing):
        worker.get("job:42")


def test_takeover_after_loss_is_not_released_by_the_old_holder(live_server, worker):
    lock = worker.lock("job:42", ttl=1, wait=1)

    def block():
        with lock:
            live_server.force_release("job:42")
            assert worker.acquire("job:42", "new-owner", ttl=30).acquired
            assert lock.lost.wait(30)  # a deadline: set within a renewal or the ttl

    with pytest.raises(LockLost):
        block()
    assert worker.get("job:42").owner == "new-owner"


def test_leaving_a_lost_lock_raises_lock_lost_even_if_no_renew_noticed_it(
    live_server, worker
):
    """python-redis-lock raises NotAcquired, pottery ReleaseUnlockedLock: the block
    ran unprotected, so its end must not look like success. Here the renewer had
    no turn yet (renew every 20 s): the release finds the lock gone."""
    lock = worker.lock("job:42", ttl=30, wait=1, renew_every=20)

    def block():
        with lock:
            live_server.force_release("job:42", reason="stuck")
            assert worker.acquire("job:42", "new-owner", ttl=30).acquired

    with pytest.raises(LockLost, match="job:42") as caught:
        block()
    assert lock.lost.is_set()
    assert caught.value.resource == "job:42"
    assert worker.get("job:42").owner == "new-owner"


def test_raise_on_lost_false_keeps_the_loss_in_lost_and_the_log(live_server, worker):
    with worker.lock("job:42", ttl=30, wait=1, raise_on_lost=False) as lock:
        live_server.force_release("job:42")
    assert lock.lost.is_set()
    assert "job:42" in lock.lost_reason


def test_check_raises_lock_lost_once_the_lock_is_lost(live_server, worker):
    # A ttl no loaded machine lets run out before the check (1 s did, starved
    # renewals on a CI-like load), renewed often so the loss is seen soon.
    lock = worker.lock("job:42", ttl=30, renew_every=0.2, wait=10, raise_on_lost=False)
    with lock:
        lock.check()  # held: nothing to say
        live_server.force_release("job:42")
        assert lock.lost.wait(30)
        with pytest.raises(LockLost, match="job:42"):
            lock.check()


def test_extend_and_locked_on_a_held_lock_by_the_servers_clock(live_server, worker):
    """python-redis-lock's extend() and pottery's locked() (time left)."""
    with worker.lock("job:42", ttl=5, wait=1, raise_on_lost=False) as lock:
        assert 0 < lock.locked() <= 5
        lock.extend(120)
        assert 60 < lock.locked() <= 120
        assert worker.get("job:42").ttl_remaining > 60
        assert lock.fence == worker.get("job:42").fence
        live_server.force_release("job:42")
        assert lock.locked() == 0.0
        with pytest.raises(LockLost):
            lock.extend()
        assert lock.lost.is_set()


def test_wait_none_waits_until_granted(make_client, live_server, worker):
    """As leadership(wait=None) does; it was a TypeError."""
    worker.acquire("job:42", "holder", ttl=30)
    granted = threading.Event()

    def take() -> None:
        with (
            make_client(live_server.url, live_server.token) as waiter,
            waiter.lock("job:42", ttl=5, wait=None),
        ):
            granted.set()

    taker = threading.Thread(target=take)
    taker.start()
    wait_until(lambda: worker.get("job:42").waiters == 1, "the waiter in line")
    assert not granted.is_set()
    worker.release("job:42", "holder")
    taker.join(30)
    assert granted.is_set()


def test_synchronized_runs_each_call_holding_the_lock(live_server):
    with LockClient(live_server.url, live_server.token) as client:
        seen = []

        @client.synchronized("job:sync", ttl=5, wait=1)
        def job(n: int) -> int:
            """A job."""
            seen.append(client.get("job:sync").owner)
            return n * 2

        assert job(21) == 42
        assert job.__doc__ == "A job."
        assert len(seen) == 1
        with pytest.raises(LockMissing):
            client.get("job:sync")  # released after the call
        client.acquire("job:sync", "someone", ttl=30)
        with pytest.raises(LockNotAcquired):
            job(1)


def test_a_nested_lock_of_the_same_owner_is_refused_not_dropped_on_exit(worker):
    """Before: the inner block re-acquired the same grant and its exit released
    it, leaving the outer block unprotected without a word."""
    with worker.lock("job:42", ttl=30, wait=1, owner="w-1") as outer:
        with (
            pytest.raises(AlreadyHeld, match="not re-entrant"),
            worker.lock("job:42", ttl=30, wait=1, owner="w-1"),
        ):
            pass
        assert worker.get("job:42").fence == outer.fence  # still held
        # Another owner (the default) is another holder: it waits its turn.
        with pytest.raises(LockNotAcquired):
            worker.lock("job:42", ttl=30, wait=0).acquire()
    # Once released, the same owner takes it again.
    with worker.lock("job:42", ttl=30, wait=1, owner="w-1"):
        pass


@pytest.mark.parametrize("renew_every", [0, 5, 7.5])
def test_renew_every_must_leave_room_to_renew(worker, renew_every):
    with pytest.raises(ValueError, match="renew_every.*below the ttl"):
        worker.lock("job:42", ttl=5, renew_every=renew_every)


def test_lost_is_set_by_the_local_clock_when_the_lock_expires_unrenewed(
    make_client, live_server
):
    """Every renew hangs (a wedged proxy): no answer ever comes, yet ``lost`` is
    set at the lock's expiry by the local clock, not when a request gives up."""
    with make_client(live_server.url, live_server.token, timeout=30) as client:
        held = client.lock("job:42", ttl=1, wait=1, renew_every=0.5)
        held.acquire()
        hang = threading.Event()
        front = live_server.app.wsgi_app

        def wedged(environ, start_response):
            if environ["REQUEST_METHOD"] == "PATCH":
                hang.wait(10)
            return front(environ, start_response)

        live_server.app.wsgi_app = wedged
        try:
            started = time.monotonic()
            assert held.lost.wait(3)
            assert time.monotonic() - started < 1.5
            assert "expired" in held.lost_reason
        finally:
            hang.set()
            live_server.app.wsgi_app = front
        with pytest.raises(LockLost):
            held.check()
        held.release()


def test_service_gone_mid_block_sets_lost_by_the_time_the_lock_expires(
    make_client, make_app
):
    from tests.live_server import serve as serve_app

    app = make_app()
    with serve_app(app) as server:
        lock_client = make_client(server.url, server.token, timeout=1, backoff=0.05)
        held = lock_client.lock("job:42", ttl=1, wait=1)
        held.acquire()
    start = time.monotonic()
    assert held.lost.wait(3)
    assert time.monotonic() - start < 2.5  # ttl 1 s, plus a retry or two
    assert "expired before it could be renewed" in held.lost_reason
    held.release()  # nothing to release, nothing raised
    lock_client.close()


def test_exception_inside_block_propagates_and_the_lock_is_released(worker):
    with pytest.raises(RuntimeError, match="job failed"), worker.lock("job:42", ttl=5):
        raise RuntimeError("job failed")
    with pytest.raises(LockMissing):
        worker.get("job:42")


def doc_block(document: str, section: str, language: str) -> str:
    """The first ``language`` code block under the ``## section`` heading of
    ``document`` (a path from the repository's root)."""
    text = (Path(__file__).parents[1] / document).read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return body.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def run_doc_example(live_server, document: str, section: str) -> str:
    """Run the Python example under ``section`` of ``document`` as a worker
    would, against ``live_server``; what it printed."""
    env = {
        **os.environ,
        "LOCKKEEPER_URL": live_server.url,
        "LOCKKEEPER_TOKEN": live_server.token,
    }
    code = doc_block(document, section, "python")
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_client_docs_worker_example_runs_as_written(live_server):
    printed = run_doc_example(
        live_server, "docs/client.md", "Using Lockkeeper from a worker"
    )
    assert "writing summary with fence" in printed
    with (
        LockClient(live_server.url, live_server.token) as worker,
        pytest.raises(LockMissing),
    ):
        worker.get("report:nightly")


def test_the_readme_first_minutes_python_example_runs_as_written(live_server):
    printed = run_doc_example(live_server, "README.md", "A worker's first five minutes")
    assert re.fullmatch(r"job:42 is mine, fence [1-9][0-9]*\n", printed)
    with (
        LockClient(live_server.url, live_server.token) as worker,
        pytest.raises(LockMissing),
    ):
        worker.get("job:42")
