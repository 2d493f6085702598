"""Following the audit log: ``GET /api/v1/events?follow=true`` as Server-Sent Events,
against a real HTTP server on every database, with real threads."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
from lockkeeper_core import follow
from lockkeeper_core.models import LockEvent
from sqlalchemy import insert, select, text

from app.extensions import db, lock_service
from tests.live_server import serve

pytestmark = pytest.mark.usefixtures("backend")

FOLLOW = "/api/v1/events?follow=true"
events_table = LockEvent.__table__


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Stream:
    """One open stream, read by a thread of its own: its messages (id, event) and
    its comment lines, as they arrive."""

    def __init__(self, server, path: str = FOLLOW, *, token=None, last_id=None):
        headers = {"Authorization": f"Bearer {token or server.token}"}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        self.client = httpx.Client(base_url=server.url, timeout=30)
        self.response = self.client.send(
            self.client.build_request("GET", path, headers=headers), stream=True
        )
        self.messages: list[tuple[int, dict]] = []
        self.start: int | None = None
        self.comments: list[str] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        fields: dict[str, str] = {}
        try:
            for line in self.response.iter_lines():
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                elif line:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                elif "data" in fields:
                    event = json.loads(fields["data"])
                    self.messages.append((int(fields["id"]), event))
                    fields = {}
                elif fields:  # the opening message: where the stream starts
                    self.start = int(fields.pop("id"))
        except httpx.HTTPError:
            pass  # closed under it: a forced reconnect
        finally:
            self.closed.set()

    def ids(self) -> list[int]:
        return [event_id for event_id, _ in self.messages]

    def close(self) -> None:
        """Drop the connection as a network failure would: shut the socket down
        (closing it alone would not wake the reading thread, nor tell the server)."""
        sock = self.response.extensions["network_stream"].get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        self.response.close()
        self.client.close()
        self.closed.wait(10)


def grant(server, resource: str, owner: str = "w") -> None:
    with server.service() as locks:
        assert locks.acquire(resource, owner, 30).acquired


def event_ids(server, prefix: str) -> list[int]:
    with server.app.app_context(), db.engine.connect() as conn:
        return list(
            conn.scalars(
                select(events_table.c.id)
                .where(events_table.c.resource.startswith(prefix))
                .order_by(events_table.c.id)
            )
        )


@pytest.fixture
def server(make_app):
    app = make_app(
        LOCKKEEPER_STREAM_KEEPALIVE=0.3,
        LOCKKEEPER_STREAM_POLL_INTERVAL=0.05,
        LOCKKEEPER_MAX_STREAMS=4,
    )
    with serve(app) as running:
        yield running


def test_a_stream_sends_each_new_event_with_its_id_and_json(server):
    grant(server, "before:1")  # written before the stream opens: not sent
    stream = Stream(server)
    try:
        wait_until(lambda: "open" in stream.comments, what="the stream to open")
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        grant(server, "after:1", "w-1")
        wait_until(lambda: stream.messages, what="the event")
        event_id, event = stream.messages[0]
        page = httpx.get(
            server.url + "/api/v1/events",
            headers=server.auth_headers,
            params={"resource": "after:1"},
        ).json()
        assert event == page["events"][0]
        assert event_id == event["id"]
        assert [e["resource"] for _, e in stream.messages] == ["after:1"]
    finally:
        stream.close()


def test_a_burst_from_many_threads_arrives_exactly_once_across_two_reconnects(
    server,
):
    stream = Stream(server)
    wait_until(lambda: "open" in stream.comments, what="the stream to open")
    received: list[int] = []
    total = 1000

    def burst():
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: grant(server, f"burst:{n}"), range(total)))

    writer = threading.Thread(target=burst)
    writer.start()
    try:
        for cut in (300, 650):
            wait_until(
                lambda c=cut, s=stream, r=received: len(r) + len(s.messages) >= c,
                what=f"{cut} events",
            )
            stream.close()  # the connection drops mid-burst
            received.extend(stream.ids())
            stream = Stream(server, last_id=received[-1])
        writer.join(60)
        wait_until(
            lambda: len(received) + len(stream.messages) >= total, what="every event"
        )
        received += stream.ids()
    finally:
        stream.close()
        writer.join(60)
    written = event_ids(server, "burst:")
    assert len(written) == total
    assert received == written  # each once, in id order, none missing


def test_a_prefix_scoped_token_never_sees_other_events(server):
    from app.auth.service import create_token

    with server.app.app_context():
        scoped = create_token("team-a", prefixes=["team-a:"])
    stream = Stream(server, token=scoped)
    everything = Stream(server)
    try:
        wait_until(lambda: "open" in stream.comments, what="the stream to open")
        wait_until(lambda: "open" in everything.comments, what="the stream to open")
        for n in range(5):
            grant(server, f"team-b:{n}")
            grant(server, f"team-a:{n}")
        wait_until(lambda: len(everything.messages) == 10, what="all ten events")
        wait_until(lambda: len(stream.messages) == 5, what="the team's five")
        assert {e["resource"] for _, e in stream.messages} == {
            f"team-a:{n}" for n in range(5)
        }
    finally:
        stream.close()
        everything.close()


def test_filters_apply_to_a_stream(server):
    stream = Stream(server, FOLLOW + "&prefix=keep:&action=acquired")
    try:
        wait_until(lambda: "open" in stream.comments, what="the stream to open")
        grant(server, "drop:1")
        grant(server, "keep:1")
        with server.service() as locks:
            locks.release("keep:1", "w")
        grant(server, "keep:2")
        wait_until(lambda: len(stream.messages) == 2, what="two events")
        assert [(e["resource"], e["action"]) for _, e in stream.messages] == [
            ("keep:1", "acquired"),
            ("keep:2", "acquired"),
        ]
    finally:
        stream.close()


def test_a_stream_starts_after_the_cursor_event_id(server):
    for n in range(3):
        grant(server, f"c:{n}")
    first, *rest = event_ids(server, "c:")
    stream = Stream(server, FOLLOW + f"&cursor={first}")
    try:
        wait_until(lambda: len(stream.messages) == 2, what="the two after it")
        assert stream.ids() == rest
    finally:
        stream.close()


def test_keepalive_comments_arrive_while_no_event_does(server):
    stream = Stream(server)
    try:
        wait_until(
            lambda: stream.comments.count("keepalive") >= 2, what="two keepalives"
        )
        assert stream.messages == []
    finally:
        stream.close()


def test_past_the_cap_a_stream_is_answered_503_with_retry_after(make_app):
    app = make_app(LOCKKEEPER_MAX_STREAMS=1, LOCKKEEPER_STREAM_KEEPALIVE=0.2)
    with serve(app) as server:
        first = Stream(server)
        try:
            wait_until(lambda: "open" in first.comments, what="the first stream")
            refused = httpx.get(server.url + FOLLOW, headers=server.auth_headers)
            assert refused.status_code == 503
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["setting"] == "LOCKKEEPER_MAX_STREAMS"
            assert int(refused.headers["Retry-After"]) >= 1
        finally:
            first.close()
        # Its place is free again once the client is gone (noticed at the latest
        # by the next keepalive's write).
        wait_until(
            lambda: (
                httpx.head(server.url + FOLLOW, headers=server.auth_headers).status_code
                == 200
            ),
            what="the freed place",
        )


def test_one_token_holds_at_most_its_share_of_the_streams(make_app):
    """A token (even a read-only, prefix-scoped one) past its share gets a 503
    naming the setting, and another token still gets a stream."""
    app = make_app(
        LOCKKEEPER_MAX_STREAMS=4,
        LOCKKEEPER_MAX_STREAMS_PER_TOKEN=2,
        LOCKKEEPER_STREAM_KEEPALIVE=0.2,
    )
    with serve(app) as server:
        reader = create_token_in(app, "reader")
        mine = [Stream(server, token=reader) for _ in range(2)]
        try:
            for stream in mine:
                wait_until(lambda s=stream: "open" in s.comments, what="a stream")
            refused = httpx.get(
                server.url + FOLLOW, headers={"Authorization": f"Bearer {reader}"}
            )
            assert refused.status_code == 503
            assert refused.json()["setting"] == "LOCKKEEPER_MAX_STREAMS_PER_TOKEN"
            assert "LOCKKEEPER_MAX_STREAMS_PER_TOKEN" in refused.json()["detail"]
            assert int(refused.headers["Retry-After"]) >= 1
            other = Stream(server)
            try:
                wait_until(lambda: "open" in other.comments, what="another token's")
            finally:
                other.close()
        finally:
            for stream in mine:
                stream.close()


def create_token_in(app, name: str) -> str:
    from app.auth.service import create_token

    with app.app_context():
        return create_token(name, read_only=True, prefixes=["reports:"])


def test_a_bad_last_event_id_is_a_400_problem(server):
    answer = httpx.get(
        server.url + FOLLOW,
        headers={**server.auth_headers, "Last-Event-ID": "12x"},
    )
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "Last-Event-ID"


def test_a_bad_follow_value_is_a_400_problem(server):
    answer = httpx.get(
        server.url + "/api/v1/events?follow=yes", headers=server.auth_headers
    )
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "follow"


def test_the_open_streams_gauge_counts_open_streams(server):
    def gauge() -> float:
        text = httpx.get(server.url + "/metrics").text
        line = next(
            line for line in text.splitlines() if line.startswith("lockkeeper_open_")
        )
        return float(line.split()[-1])

    stream = Stream(server)
    try:
        wait_until(lambda: "open" in stream.comments, what="the stream to open")
        assert gauge() == 1
    finally:
        stream.close()
    wait_until(lambda: gauge() == 0, what="the gauge to drop")


# -- commits out of id order ------------------------------------------------------


def test_an_event_that_commits_after_a_later_id_is_sent_first_and_not_lost(
    server, backend
):
    """Id N is drawn, N+1 commits, and only then N: a follower that sent N+1 at
    once would skip N for good (and a client resuming after N+1 would too).
    (SQLite has one writer at a time: there N+1 waits for N to commit.)"""
    stream = Stream(server)
    wait_until(lambda: "open" in stream.comments, what="the stream to open")
    inserted, go_on = threading.Event(), threading.Event()
    slow_id: list[int] = []

    def slow_writer():
        with server.app.app_context(), db.engine.begin() as conn:
            slow_id.append(
                conn.execute(
                    insert(events_table).values(
                        resource="race:slow",
                        action="acquired",
                        owner="slow",
                        occurred_at=datetime.now(UTC),
                    )
                ).inserted_primary_key[0]
            )
            inserted.set()
            go_on.wait(30)

    writer = threading.Thread(target=slow_writer)
    writer.start()
    try:
        assert inserted.wait(10)
        fast = threading.Thread(target=grant, args=(server, "race:fast"))
        fast.start()  # a later id, committed first (but on SQLite)
        if backend != "sqlite":
            fast.join(10)
            assert event_ids(server, "race:fast")
        # Let the stream look several times while the slow one is open.
        seen = len(stream.comments)
        wait_until(lambda: len(stream.comments) >= seen + 2, what="two keepalives")
        held_back = list(stream.messages)
        go_on.set()
        writer.join(10)
        fast.join(20)
        fast_id = event_ids(server, "race:fast")[0]
        assert fast_id > slow_id[0]
        wait_until(lambda: len(stream.messages) == 2, what="both events")
        assert held_back == []
        assert stream.ids() == [slow_id[0], fast_id]
        # And a client resuming after the fast one has nothing missing behind it.
        resumed = Stream(server, last_id=fast_id)
        try:
            wait_until(lambda: "open" in resumed.comments, what="the resumed stream")
            grant(server, "race:after")
            wait_until(lambda: resumed.messages, what="the next event")
            assert [e["resource"] for _, e in resumed.messages] == ["race:after"]
        finally:
            resumed.close()
    finally:
        go_on.set()
        writer.join(10)
        stream.close()


# -- PostgreSQL: woken by NOTIFY --------------------------------------------------


def listener_rows(server) -> list[int]:
    with server.app.app_context(), db.engine.connect() as conn:
        return list(conn.scalars(text("SELECT pid FROM lock_event_listeners")))


@pytest.mark.backends("sqlite", "mariadb")
def test_other_databases_streams_have_no_listeners_table(app, backend):
    """Elsewhere the stream's poll is what wakes it; every test above shows it."""
    assert "lock_event_listeners" not in _tables(app)


@pytest.mark.backends("postgresql")
def test_postgresql_streams_wake_on_notify_not_on_their_poll(
    make_app, backend, monkeypatch
):
    monkeypatch.setattr(follow, "NOTIFY_SAFETY_INTERVAL", 60.0)
    app = make_app()
    # Past what the settings allow: only a NOTIFY wakes the stream before its
    # keepalive (15 s).
    app.config["LOCKKEEPER_STREAM_POLL_INTERVAL"] = 60.0
    with serve(app) as server:
        stream = Stream(server)
        try:
            wait_until(lambda: listener_rows(server), what="the listener's row")
            [pid] = listener_rows(server)
            with server.service() as locks:
                assert locks.queue.listener().backend_pid == pid
            grant(server, "woken:1")
            wait_until(lambda: stream.messages, timeout=10.0, what="the event")
            assert stream.comments == ["open"]  # before the first keepalive
        finally:
            stream.close()
        # The last stream gone, writers stop notifying.
        wait_until(lambda: not listener_rows(server), what="the row to go")


def _tables(app) -> set[str]:
    from sqlalchemy import inspect

    with app.app_context():
        return set(inspect(db.engine).get_table_names())


def _notifications_until_marker(conn) -> list[str]:
    conn.execute("SELECT pg_notify('lockkeeper_events', 'marker')")
    found = []
    for notify in conn.notifies(timeout=10):
        if notify.payload == "marker":
            return found
        found.append(notify.payload)
    raise AssertionError("the marker never came")


@pytest.mark.backends("postgresql")
def test_postgresql_writers_notify_only_while_a_listener_is_registered(
    app, backend, database_url
):
    import psycopg

    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN lockkeeper_events")
        with app.app_context():
            assert lock_service().acquire("quiet:1", "w", 30).acquired
        assert _notifications_until_marker(conn) == []
        conn.execute("INSERT INTO lock_event_listeners (pid) VALUES (pg_backend_pid())")
        with app.app_context():
            assert lock_service().acquire("loud:1", "w", 30).acquired
        assert _notifications_until_marker(conn) == [""]


def test_a_stream_opens_with_where_it_starts_so_an_early_drop_loses_nothing(
    server,
):
    grant(server, "early:0")
    stream = Stream(server)
    wait_until(lambda: stream.start is not None, what="the opening id")
    stream.close()  # dropped before any event came
    assert stream.start == event_ids(server, "early:")[-1]
    grant(server, "early:1")  # while the client reconnects
    resumed = Stream(server, last_id=stream.start)
    try:
        wait_until(lambda: resumed.messages, what="the event written meanwhile")
        assert [e["resource"] for _, e in resumed.messages] == ["early:1"]
    finally:
        resumed.close()


def test_an_id_rolled_back_holds_a_stream_back_only_briefly(server):
    """A rolled-back insert leaves its id unused (PostgreSQL, MariaDB): the later
    events still come, after MariaDB's grace for a missing id at the most."""
    stream = Stream(server)
    try:
        wait_until(lambda: "open" in stream.comments, what="the stream to open")
        with server.app.app_context(), db.engine.connect() as conn:
            conn.execute(
                insert(events_table).values(
                    resource="rolled:back",
                    action="acquired",
                    owner="gone",
                    occurred_at=datetime.now(UTC),
                )
            )
            conn.rollback()
        grant(server, "after:rollback")
        wait_until(lambda: stream.messages, timeout=follow.HOLE_GRACE + 10)
        assert [e["resource"] for _, e in stream.messages] == ["after:rollback"]
    finally:
        stream.close()


@pytest.mark.backends("mariadb")
def test_a_long_run_of_missing_ids_holds_a_stream_back_once(server):
    """Ids that will never come (an empty table whose counter stands far ahead,
    as after a prune, or after the tests before this one) are one hole, waited
    out once: the first event comes after one grace, not a grace per thousand
    missing ids."""
    with server.app.app_context(), db.engine.begin() as conn:
        newest = conn.scalar(text("SELECT COALESCE(MAX(id), 0) FROM lock_events"))
        conn.execute(
            text(f"ALTER TABLE lock_events AUTO_INCREMENT = {newest + 50_000}")
        )
    stream = Stream(server)
    try:
        wait_until(lambda: "open" in stream.comments, what="the stream to open")
        grant(server, "after:a:gap")
        wait_until(lambda: stream.messages, timeout=follow.HOLE_GRACE + 10)
        assert [e["resource"] for _, e in stream.messages] == ["after:a:gap"]
    finally:
        stream.close()


def test_a_stream_ends_after_its_lifetime_and_resumes_where_it_ended(make_app):
    app = make_app(LOCKKEEPER_STREAM_MAX_SECONDS=0.5, LOCKKEEPER_STREAM_KEEPALIVE=0.2)
    with serve(app) as server:
        stream = Stream(server)
        try:
            assert stream.closed.wait(10)  # the server ended it
            assert stream.start is not None
        finally:
            stream.close()
