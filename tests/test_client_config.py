"""A client set up wrong says so at once, with what to fix: never a retry, never
``ServiceUnavailable``, never an empty lock."""

from __future__ import annotations

import time

import httpx
import pytest
from lockkeeper_client import (
    AsyncLockClient,
    ConfigurationError,
    LockClient,
    SessionBoundLock,
    UnexpectedResponse,
)

CLIENTS = [LockClient, AsyncLockClient]


@pytest.mark.parametrize("make", CLIENTS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("url", "token", "says"),
    [
        ("http://127.0.0.1:9", "", "token is empty"),
        ("http://127.0.0.1:9", "   ", "token is empty"),
        ("http://127.0.0.1:9", "lk_abc\n", "line breaks"),
        ("http://127.0.0.1:9", "lk_é", "non-ASCII"),
        ("locks.internal:8000", "lk_abc", "http://locks.internal:8000"),
        ("127.0.0.1:8000", "lk_abc", "http:// or https://"),
        ("ftp://locks.internal", "lk_abc", "http:// or https://"),
        ("", "lk_abc", "base_url is empty"),
    ],
)
def test_a_configuration_mistake_raises_at_construction_saying_what_to_fix(
    make, url, token, says
):
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=says):
        make(url, token)
    assert time.monotonic() - started < 1  # no request, no retry


def test_a_configuration_error_is_a_value_error_too():
    with pytest.raises(ValueError, match="token"):
        LockClient("http://127.0.0.1:9", "")


@pytest.mark.parametrize("path", ["/not-the-api", "/api/v2", "/dashboard"])
def test_a_base_path_that_is_not_the_api_raises_unexpected_response(live_server, path):
    """Before: get() said "no lock", leader() that nobody leads, release() that the
    lock was lost."""
    with LockClient(live_server.url + path, live_server.token, retries=0) as client:
        for call in (
            lambda: client.get("job:42"),
            lambda: client.leader("job:42"),
            lambda: client.release("job:42", "w-1"),
            lambda: client.renew("job:42", "w-1", 30),
        ):
            with pytest.raises(UnexpectedResponse, match="base_url"):
                call()


def test_the_api_behind_its_root_still_answers_missing_locks(live_server):
    with LockClient(live_server.url + "/api/v1/", live_server.token) as client:
        assert client.leader("job:42") is None


def test_renewing_a_session_bound_lock_is_its_own_error(live_server):
    with (
        LockClient(live_server.url, live_server.token) as client,
        client.session(ttl=10) as session,
        session.lock("job:bound"),
    ):
        with pytest.raises(SessionBoundLock, match="renew the session"):
            client.renew("job:bound", session.owner, 30)
        assert client.leader("job:bound") == session.owner  # still held


def test_an_html_404_from_something_else_is_not_a_missing_lock():
    def not_lockkeeper(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, html="<h1>Not Found</h1>")

    with LockClient(
        "http://127.0.0.1:9", "lk_abc", transport=httpx.MockTransport(not_lockkeeper)
    ) as client:
        with pytest.raises(UnexpectedResponse, match="not the Lockkeeper API"):
            client.get("job:42")
