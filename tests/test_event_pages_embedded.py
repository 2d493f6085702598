"""The audit log's pages (``GET /events``, ``GET /locks/<resource>/events``) and
a followed stream started from a page's cursor, asked through the client's
HTTP surface of both transports: the server, and the embedded mode reading the
same tables in the worker's own process. The same cases run on each, on every
database, and the two answer every query (good or bad) with the same body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from lockkeeper_core.embedded import AsyncEmbeddedTransport, EmbeddedTransport

pytestmark = pytest.mark.usefixtures("backend")

TRANSPORTS = ("server", "embedded")


def database_of(live_server) -> str:
    return live_server.app.config["SQLALCHEMY_DATABASE_URI"]


def client_of(live_server, transport: str, token: str | None = None) -> httpx.Client:
    """An HTTP client of the lock API: to the server, or answered in process."""
    headers = {"Authorization": f"Bearer {token or live_server.token}"}
    if transport == "server":
        return httpx.Client(base_url=live_server.url, headers=headers, timeout=10)
    return httpx.Client(
        base_url="http://embedded",
        headers=headers,
        transport=EmbeddedTransport(database_of(live_server)),
        timeout=10,
    )


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


@pytest.fixture
def web(live_server, transport) -> Iterator[httpx.Client]:
    with client_of(live_server, transport) as client:
        yield client


@pytest.fixture
def history(live_server) -> list[tuple[str, str]]:
    """Acquire and release of ``job:0`` .. ``job:2`` and ``other:0``, through
    the server's service: (resource, action), oldest first."""
    done = []
    with live_server.service() as locks:
        for resource in ("job:0", "job:1", "other:0", "job:2"):
            assert locks.acquire(resource, "w-1", 30).acquired
            locks.release(resource, "w-1")
            done += [(resource, "acquired"), (resource, "released")]
    return done


def every_page(web: httpx.Client, path: str, **query) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        asked = {**query, **({"cursor": cursor} if cursor else {})}
        answer = web.get(path, params=asked)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append(body["events"])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_pages_of_events_newest_first_through_each_transport(web, history):
    pages = every_page(web, "/api/v1/events", limit=3)
    assert [len(page) for page in pages] == [3, 3, 2]
    seen = [(e["resource"], e["action"]) for page in pages for e in page]
    assert seen == history[::-1]
    ids = [e["id"] for page in pages for e in page]
    assert ids == sorted(ids, reverse=True)
    assert every_page(web, "/api/v1/events", follow="false") == [
        [e for page in pages for e in page]
    ]


def test_filters_and_one_resources_pages_through_each_transport(web, history):
    job = every_page(web, "/api/v1/events", prefix="job:", action="released")
    assert [e["resource"] for e in job[0]] == ["job:2", "job:1", "job:0"]
    assert every_page(web, "/api/v1/events", owner="nobody") == [[]]
    one = every_page(web, "/api/v1/locks/job:1/events", limit=1)
    assert [[e["action"] for e in page] for page in one] == [["released"], ["acquired"]]
    newest = web.get("/api/v1/events", params={"limit": 1}).json()["events"][0]
    since = web.get("/api/v1/events", params={"since": newest["occurred_at"]})
    assert newest["id"] in [e["id"] for e in since.json()["events"]]


def test_pages_are_narrowed_to_the_tokens_scope(live_server, transport, history):
    with live_server.app.app_context():
        from app.auth.service import create_token

        scoped = create_token("scoped-pages", prefixes=["other:"])
    with client_of(live_server, transport, scoped) as web:
        pages = every_page(web, "/api/v1/events", prefix="")
        assert {e["resource"] for e in pages[0]} == {"other:0"}
        for path, query in (
            ("/api/v1/events", {"resource": "job:1"}),
            ("/api/v1/locks/job:1/events", {}),
        ):
            answer = web.get(path, params=query)
            assert answer.status_code == 403
            assert "scope" in answer.json()["detail"]


def test_a_followed_stream_starts_after_a_pages_cursor(web, history):
    """A page's ``next_cursor`` names where the stream starts, as an event id
    does: the first event sent is the newest one not on that page."""
    first = web.get("/api/v1/events", params={"limit": 2}).json()
    with web.stream(
        "GET",
        "/api/v1/events",
        params={"follow": "true", "cursor": first["next_cursor"]},
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert next(lines) == ": open"
        opened = int(next(lines).removeprefix("id: "))
        assert opened == first["events"][-1]["id"]


# The same answers: every query, good or bad, asked of both.
QUERIES = [
    ("/api/v1/events", {}),
    ("/api/v1/events", {"limit": "2"}),
    ("/api/v1/events", {"prefix": "job:", "limit": "500"}),
    ("/api/v1/events", {"resource": "job:1", "action": "acquired"}),
    ("/api/v1/events", {"since": "2000-01-01T00:00:00Z", "until": "2999-01-01T00:00Z"}),
    ("/api/v1/events", {"actor": "live-server", "owner": "w-1"}),
    ("/api/v1/events", {"follow": "false"}),
    ("/api/v1/locks/job:2/events", {}),
    ("/api/v1/locks/job:2/events", {"limit": "1"}),
    ("/api/v1/locks/nothing/events", {}),
    # Refused, each field by name.
    ("/api/v1/events", {"limit": "0"}),
    ("/api/v1/events", {"limit": "501"}),
    ("/api/v1/events", {"limit": "ten"}),
    ("/api/v1/events", {"cursor": "not-a-cursor"}),
    ("/api/v1/events", {"cursor": "x" * 1025}),
    ("/api/v1/events", {"action": "stolen"}),
    ("/api/v1/events", {"since": "2026-11-30T09:00:00"}),
    ("/api/v1/events", {"until": "yesterday"}),
    ("/api/v1/events", {"since": "2026-12-01T00:00Z", "until": "2026-11-01T00:00Z"}),
    ("/api/v1/events", {"resource": "a b"}),
    ("/api/v1/events", {"resource": ""}),
    ("/api/v1/events", {"owner": "bell\x07"}),
    ("/api/v1/events", {"prefix": "p" * 256}),
    ("/api/v1/events", {"actor": "tab\there"}),
    ("/api/v1/events", {"follow": "yes"}),
    ("/api/v1/events", {"colour": "red"}),
    ("/api/v1/locks/job:1/events", {"prefix": "job:"}),
    ("/api/v1/locks/job:1/events", {"limit": "-1"}),
]


def test_the_embedded_transport_answers_every_query_as_the_server_does(
    live_server, history
):
    with (
        client_of(live_server, "server") as server,
        client_of(live_server, "embedded") as embedded,
    ):
        for path, query in QUERIES:
            expected = server.get(path, params=query)
            got = embedded.get(path, params=query)
            where = f"{path} {query}"
            assert got.status_code == expected.status_code, where
            assert got.json() == expected.json(), where


def test_the_asyncio_transport_serves_pages_off_the_event_loop(live_server, history):
    async def main() -> list[dict]:
        transport = AsyncEmbeddedTransport(database_of(live_server))
        async with httpx.AsyncClient(
            base_url="http://embedded",
            headers={"Authorization": f"Bearer {live_server.token}"},
            transport=transport,
        ) as web:
            answer = await web.get("/api/v1/locks/other:0/events")
            assert answer.status_code == 200
            return answer.json()["events"]

    found = asyncio.run(main())
    assert [e["action"] for e in found] == ["released", "acquired"]
