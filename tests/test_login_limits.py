"""Login throttling that holds under parallel guesses and across processes.

The account lockout is raced with real threads against a real HTTP server on every
database; the per-address limit is checked in one process and across two server
processes sharing one database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from bs4 import BeautifulSoup
from sqlalchemy import select, update

from app.auth import login
from app.auth.models import LoginAddressWindow, User
from app.extensions import db
from bench.ports import free_port
from tests.dashboard_helpers import PASSWORD, log_in, make_user
from tests.live_server import serve

pytestmark = pytest.mark.usefixtures("backend")

DEADLINE = 30


class CountedHashes:
    """Counts password checks; with ``gated`` each waits until ``open()``."""

    def __init__(self, monkeypatch, gated: bool = False):
        self.real = login.check_password_hash
        self.count = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        monkeypatch.setattr(login, "check_password_hash", self._check)

    def _check(self, pwhash: str, password: str) -> bool:
        with self.lock:
            self.count += 1
        self.gate.wait(DEADLINE)
        return self.real(pwhash, password)

    def open(self) -> None:
        self.gate.set()


def browser(url: str) -> tuple[httpx.Client, str]:
    """A client with the session cookie and CSRF token of a fresh /login page."""
    client = httpx.Client(base_url=url, timeout=DEADLINE)
    page = BeautifulSoup(client.get("/login").text, "html.parser")
    return client, page.find("meta", attrs={"name": "csrf-token"})["content"]


def post_login(client: httpx.Client, token: str, username: str, password: str):
    return client.post(
        "/login",
        data={"username": username, "password": password, "csrf_token": token},
    )


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_parallel_guesses_lock_the_account_before_their_hashes_finish(
    make_app, monkeypatch
):
    """15 wrong passwords race in; while the first five are still being hashed the
    account is already locked, and the right password that arrives then is
    refused without being hashed."""
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=0)
    make_user(app, "olga")
    hashes = CountedHashes(monkeypatch, gated=True)
    with serve(app) as server:
        clients = [browser(server.url) for _ in range(16)]
        start = threading.Barrier(15)
        statuses: list[int] = []

        def guess(client, token, n):
            start.wait(DEADLINE)
            response = post_login(client, token, "olga", f"wrong guess {n}")
            statuses.append(response.status_code)

        threads = [
            threading.Thread(target=guess, args=(*clients[n], n)) for n in range(15)
        ]
        for thread in threads:
            thread.start()
        try:
            # Ten guesses are refused at once: they never reach the hash, which
            # still holds the first five.
            wait_for(lambda: len(statuses) >= 10, "the refusals")
            assert Counter(statuses) == {429: 10}
            assert hashes.count == 5
            right = post_login(*clients[15], "olga", PASSWORD)
        finally:
            hashes.open()
            for thread in threads:
                thread.join(DEADLINE)
        assert right.status_code == 429
        assert "too many failed logins" in right.text.lower()
        assert int(right.headers["Retry-After"]) > 0
        assert hashes.count == 5, "an attempt past the lockout was hashed"
        # The fifth counted failure is the one that locked the account.
        assert Counter(statuses) == {429: 11, 401: 4}
        with app.app_context():
            row = db.session.scalar(select(User).where(User.username == "olga"))
            assert row.locked_until is not None


def test_sixteen_parallel_attempts_hash_at_most_five_passwords(make_app, monkeypatch):
    """All sixteen at once (fifteen wrong, one right): whatever the order, at most
    five passwords are checked, and the right one wins only if it was one of
    the five counted before the lock."""
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=0)
    make_user(app, "olga")
    hashes = CountedHashes(monkeypatch)
    with serve(app) as server:
        clients = [browser(server.url) for _ in range(16)]
        start = threading.Barrier(16)
        results: dict[int, int] = {}

        def attempt(n):
            client, token = clients[n]
            password = PASSWORD if n == 15 else f"wrong guess {n}"
            start.wait(DEADLINE)
            results[n] = post_login(client, token, "olga", password).status_code

        threads = [threading.Thread(target=attempt, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
        wrong = Counter(results[n] for n in range(15))
        if results[15] == 303:
            # The right password was counted among the first five and took its
            # attempt back: guesses that came after it may be checked again.
            assert wrong[401] <= 15
        else:
            assert results[15] == 429
            assert hashes.count == 5
            assert wrong == {401: 4, 429: 11}


def test_the_lockout_does_not_tell_which_usernames_exist(make_app):
    """Six wrong passwords for an account and for a name no account has get the
    same answers: the fifth "locks" both."""
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=0)
    make_user(app, "olga")
    client = app.test_client()

    def answers(username):
        found = []
        for n in range(6):
            response = log_in(client, username, f"wrong guess {n}")
            page = BeautifulSoup(response.get_data(as_text=True), "html.parser")
            error = page.find(id="login-error").get_text(" ", strip=True)
            found.append((response.status_code, error))
        return found

    known, unknown = answers("olga"), answers("nobody")
    assert [status for status, _ in known] == [401] * 4 + [429] * 2
    assert known == unknown


def test_a_disabled_account_cannot_log_in(make_app):
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=0)
    make_user(app, "olga")
    client = app.test_client()
    result = app.test_cli_runner().invoke(args=["users", "disable", "olga"])
    assert result.exit_code == 0, result.output
    response = log_in(client, "olga")
    assert response.status_code == 401
    assert "Wrong username or password." in response.get_data(as_text=True)
    assert app.test_cli_runner().invoke(args=["users", "enable", "olga"]).exit_code == 0
    assert log_in(client, "olga").status_code == 303


# -- per client address -------------------------------------------------------------


def test_address_limit_answers_429_before_hashing_unknown_users(make_app, monkeypatch):
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=3)
    hashes = CountedHashes(monkeypatch)
    client = app.test_client()
    statuses = [
        log_in(client, f"nobody-{n}", "a password").status_code for n in range(3)
    ]
    assert statuses == [401, 401, 401]
    assert hashes.count == 3
    refused = log_in(client, "nobody-4", "a password")
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert "Too many login attempts from your address" in refused.get_data(as_text=True)
    assert hashes.count == 3, "a refused attempt was hashed"
    # Another address is not affected.
    other = app.test_client()
    other.environ_base["REMOTE_ADDR"] = "10.0.0.9"
    assert log_in(other, "nobody", "a password").status_code == 401


def test_parallel_posts_from_one_address_hash_at_most_the_limit(make_app, monkeypatch):
    """Sixteen unknown-user logins at once from one address, limit five: the
    count is decided by the database, so exactly five are hashed."""
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=5)
    hashes = CountedHashes(monkeypatch)
    with serve(app) as server:
        clients = [browser(server.url) for _ in range(16)]
        start = threading.Barrier(16)
        statuses: list[int] = []

        def attempt(client, token, n):
            start.wait(DEADLINE)
            statuses.append(post_login(client, token, f"nobody-{n}", "pw").status_code)

        threads = [
            threading.Thread(target=attempt, args=(*clients[n], n)) for n in range(16)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    assert Counter(statuses) == {401: 5, 429: 11}
    assert hashes.count == 5


def test_address_limit_window_ends(make_app):
    app = make_app(LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=1)
    client = app.test_client()
    assert log_in(client, "nobody", "a password").status_code == 401
    assert log_in(client, "nobody", "a password").status_code == 429
    with app.app_context():  # the window began just over a minute ago
        db.session.execute(
            update(LoginAddressWindow).values(
                window_start=datetime.now(UTC) - timedelta(seconds=61)
            )
        )
        db.session.commit()
    assert log_in(client, "nobody", "a password").status_code == 401
    assert log_in(client, "nobody", "a password").status_code == 429


@pytest.mark.parametrize(("proxies", "separate"), [(0, False), (1, True)])
def test_forwarded_for_is_the_client_only_behind_a_configured_proxy(
    make_app, proxies, separate
):
    app = make_app(
        LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS=1, LOCKKEEPER_PROXY_COUNT=proxies
    )
    statuses = []
    for client_address in ("203.0.113.1", "203.0.113.2"):
        client = app.test_client()
        client.environ_base["HTTP_X_FORWARDED_FOR"] = client_address
        statuses.append(log_in(client, "nobody", "a password").status_code)
    assert statuses == ([401, 401] if separate else [401, 429])


@contextmanager
def gunicorn(database_url: str, instance: str, **settings):
    """One gunicorn server (its own process) on ``database_url``."""
    port = free_port()
    env = {
        **os.environ,
        "LOCKKEEPER_DATABASE_URL": database_url,
        "LOCKKEEPER_INSTANCE_PATH": instance,
        "LOCKKEEPER_SECRET_KEY": "shared-test-secret",
        "LOCKKEEPER_BOOTSTRAP": "false",
        **{key: str(value) for key, value in settings.items()},
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "app:create_app()",
            "-w",
            "1",
            "--no-control-socket",
            "-b",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/login", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "gunicorn did not come up"
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


@pytest.mark.slow
def test_address_limit_is_shared_by_two_server_processes(database_url, tmp_path):
    """A per-process counter would let each server take its own four."""
    limit = {"LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS": 4}
    with (
        gunicorn(database_url, str(tmp_path / "a"), **limit) as first,
        gunicorn(database_url, str(tmp_path / "b"), **limit) as second,
    ):
        statuses = []
        for url in (first, second) * 3:
            client, token = browser(url)
            statuses.append(post_login(client, token, "nobody", "pw").status_code)
            client.close()
    assert statuses == [401, 401, 401, 401, 429, 429]
