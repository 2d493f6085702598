"""MariaDB: how long the service waits for a statement's answer.

A server that stops answering without closing its connections (a SIGSTOPped
process, a frozen VM, a partition that drops packets) kept a request waiting
until it came back: PyMySQL waits forever by default. The service's connections
have a read timeout (``LOCKKEEPER_DATABASE_READ_TIMEOUT``): the request is
answered 503 instead. Migrations run longer than any request may (a table
rebuilt, a lock waited for), and ``db upgrade`` runs through the same engine
options: its connection has no read timeout while the migrations run.

The server that stops answering is a relay in front of the shared MariaDB that
stops passing bytes on; a paused Galera node is in the fault runs
(``tests/faults``, ``--galera-faults kill,pause``).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.auth.service import create_token
from app.config import normalize_database_url
from app.extensions import db
from app.ops.upgrade import upgrade
from bench.ports import free_port

pytestmark = pytest.mark.backends("mariadb")


class Relay:
    """A TCP relay to ``upstream`` on a free loopback port that, once
    ``stop_answering()`` is called, reads what either side sends and passes
    nothing on, as a paused server does (its kernel keeps the connections)."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.listener.getsockname()[1]
        self.answering = threading.Event()
        self.answering.set()
        self.closing = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(source, target), daemon=True
                ).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.answering.wait()
                if self.closing.is_set():
                    return
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                end.close()

    def stop_answering(self) -> None:
        self.answering.clear()

    def close(self) -> None:
        self.closing.set()
        self.answering.set()
        self.listener.close()
        for end in self.sockets:
            end.close()


@pytest.fixture
def relay(database_url):
    url = make_url(database_url)
    relay = Relay(url.host or "127.0.0.1", url.port or 3306)
    try:
        yield relay
    finally:
        relay.close()


def _through(database_url: str, relay: Relay) -> str:
    url = make_url(database_url).set(host="127.0.0.1", port=relay.port)
    # A new connection to a server that does not answer waits out the
    # connect timeout (PyMySQL's default is 10 s).
    url = url.update_query_dict({"connect_timeout": "2"})
    return url.render_as_string(hide_password=False)


def test_a_request_to_a_server_that_stopped_answering_is_a_503_after_the_timeout(
    backend, make_app, database_url, relay
):
    app = make_app(
        LOCKKEEPER_DATABASE_URL=_through(database_url, relay),
        LOCKKEEPER_DATABASE_READ_TIMEOUT=1.5,
    )
    with app.app_context():
        token = create_token("worker")
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    taken = client.post("/api/v1/locks/job:1", json={"owner": "w1"}, headers=headers)
    assert taken.status_code == 200, taken.get_data(as_text=True)

    relay.stop_answering()
    answered = {}

    def renew() -> None:
        started = time.monotonic()
        answered["response"] = client.patch(
            "/api/v1/locks/job:1", json={"owner": "w1", "ttl": 30}, headers=headers
        )
        answered["after"] = time.monotonic() - started

    request = threading.Thread(target=renew, daemon=True)
    request.start()
    # The read timeout on the pooled connection (1.5 s), then the service's
    # one retry on a new connection, which waits out the connect timeout
    # (2 s): without a read timeout the first read never ends.
    request.join(timeout=30)
    assert not request.is_alive(), "the request still waits on the server"
    response = answered["response"]
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    assert 1.5 <= answered["after"] < 20, answered["after"]


def test_db_upgrade_is_not_cut_by_the_read_timeout(backend, make_app, empty_url):
    """Migration 0037 alters ``lock_events``. A transaction that read that
    table holds its metadata lock, and the ALTER waits for it (within the
    migrations' own lock timeout, 2 s): the transaction ends a second after
    the ALTER is seen waiting, twice the read timeout."""
    app = make_app(
        LOCKKEEPER_DATABASE_URL=empty_url, LOCKKEEPER_DATABASE_READ_TIMEOUT=0.5
    )
    upgrade(app, "0036")
    reader = create_engine(normalize_database_url(empty_url))
    database = make_url(empty_url).database
    read, seen_waiting = threading.Event(), threading.Event()

    def hold_the_table() -> None:
        with reader.connect() as conn, reader.connect() as watch:
            conn.execute(text("SELECT COUNT(*) FROM lock_events"))
            read.set()
            deadline = time.monotonic() + 30
            while not seen_waiting.is_set() and time.monotonic() < deadline:
                waiting = watch.execute(
                    text(
                        "SELECT COUNT(*) FROM information_schema.processlist"
                        " WHERE db = :db AND state LIKE 'Waiting for table metadata%'"
                        " AND info LIKE 'ALTER TABLE lock_events%'"
                    ),
                    {"db": database},
                ).scalar()
                if waiting:
                    seen_waiting.set()
                time.sleep(0.05)
            # Not a wait for something: the ALTER's answer is to take this long.
            time.sleep(1.0)
            conn.rollback()

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert read.wait(timeout=30), "the table was never read"
        upgraded = upgrade(app)
    finally:
        holder.join(timeout=60)
        reader.dispose()
    assert seen_waiting.is_set(), "the ALTER of 0037 never waited for the lock"
    assert upgraded.before == {"0036"}
    assert upgraded.after != upgraded.before
    with app.app_context(), db.engine.connect() as conn:
        # The pool's connection has its read timeout again.
        assert conn.connection.dbapi_connection._read_timeout == 0.5
