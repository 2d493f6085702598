"""A rolling upgrade: ``db upgrade`` runs while the previous release serves.

For each of the last releases (named by their schema heads), the database is
migrated to that release's revision, that release's own code (from this
repository's history, ``tests/old_release.py``) serves it, and threads send it
mixed traffic: exclusive locks held and renewed, semaphore holders, shared
grants, sessions with bound grants and heartbeats, acquires waiting in line.
Meanwhile this code's ``db upgrade`` runs to the head. It must complete, and
every request of the old code must get the answer it would get with no upgrade
running; a place the old code puts in line afterwards reads in this code's line.

On SQLite the old server and ``db upgrade`` share one file on one host: each
migration holds SQLite's one write lock for its transaction, and the old code's
writes wait for it within their busy timeout (10 s) rather than fail.

The other way round, the last release's code on a database a newer release
migrated with a migration that is not additive is not ready: 503 everywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from lockkeeper_core.schema import VERSION_TABLE, legacy_revisions, required_revisions
from sqlalchemy import text

from app import create_app
from app.extensions import db, lock_service
from app.ops.upgrade import upgrade
from app.paths import PROJECT_ROOT
from tests.old_release import as_a_release_left_it, release_tree, serving

pytestmark = [
    pytest.mark.usefixtures("backend"),
    pytest.mark.backends("sqlite", "postgresql", "mariadb"),
    pytest.mark.slow,
]

# The schema heads a rolling upgrade starts from: heads of main whose code may
# still be running, the newest (0035) the code before 0036 and 0037. The tree
# of release 0.2.0 (0028) is not in this history: it came in one commit with
# the migrations up to 0035, so ``release_tree`` cannot serve it.
RELEASES = ("0020", "0024", "0026", "0027", "0035")
# Each kind of traffic runs this many cycles before the upgrade starts.
WARM_CYCLES = 3


def new_app(url: str, instance) -> object:
    return create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
        }
    )


class Traffic:
    """Threads that each repeat one kind of request cycle until stopped, and
    keep every answer that was not the expected one."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.cycles: dict[str, int] = {}
        # (sent, answered) of every request, on the monotonic clock.
        self.requests: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(name, cycle), daemon=True)
            for name, cycle in (
                ("exclusive", self.exclusive),
                ("held", self.held),
                ("semaphore", self.semaphore),
                ("shared", self.shared),
                ("session", self.session),
                ("waiting", self.waiting),
            )
        ]

    def _run(self, name: str, cycle: Callable[[httpx.Client], None]) -> None:
        def sent(request: httpx.Request) -> None:
            request.extensions["sent"] = time.monotonic()

        def answered(response: httpx.Response) -> None:
            with self._lock:
                self.requests.append(
                    (response.request.extensions["sent"], time.monotonic())
                )

        with httpx.Client(
            base_url=self.base_url,
            headers=self.headers,
            timeout=30,
            event_hooks={"request": [sent], "response": [answered]},
        ) as client:
            while not self.stop.is_set():
                try:
                    cycle(client)
                except Exception as exc:  # noqa: BLE001 - every failure is kept
                    with self._lock:
                        self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
                with self._lock:
                    self.cycles[name] = self.cycles.get(name, 0) + 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.cycles)

    def in_flight(self, start: float, end: float) -> int:
        """Requests sent before ``end`` and answered after ``start``: those the
        old code was serving while something ran from ``start`` to ``end``."""
        with self._lock:
            return sum(1 for s, a in self.requests if s < end and a > start)

    @staticmethod
    def expect(response: httpx.Response, status: int) -> httpx.Response:
        if response.status_code != status:
            raise AssertionError(
                f"{response.request.method} {response.request.url.path}:"
                f" {response.status_code} {response.text[:300]}"
            )
        return response

    def exclusive(self, client: httpx.Client) -> None:
        owner = {"owner": "ex"}
        self.expect(client.post("/api/v1/locks/ex:1", json={**owner, "ttl": 30}), 200)
        self.expect(client.patch("/api/v1/locks/ex:1", json={**owner, "ttl": 30}), 200)
        self.expect(client.request("DELETE", "/api/v1/locks/ex:1", json=owner), 204)

    def held(self, client: httpx.Client) -> None:
        """One exclusive lock held all along, renewed (a worker's long job)."""
        body = {"owner": "long", "ttl": 60}
        if not self.counts().get("held"):
            self.expect(client.post("/api/v1/locks/held:1", json=body), 200)
        self.expect(client.patch("/api/v1/locks/held:1", json=body), 200)

    def semaphore(self, client: httpx.Client) -> None:
        for owner in ("a", "b"):
            body = {"owner": owner, "ttl": 30, "limit": 3}
            self.expect(client.post("/api/v1/locks/sem:1", json=body), 200)
        for owner in ("a", "b"):
            renew = {"owner": owner, "ttl": 30}
            self.expect(client.patch("/api/v1/locks/sem:1", json=renew), 200)
            release = {"owner": owner}
            self.expect(
                client.request("DELETE", "/api/v1/locks/sem:1", json=release), 204
            )

    def shared(self, client: httpx.Client) -> None:
        for owner in ("r1", "r2"):
            body = {"owner": owner, "ttl": 30, "mode": "shared"}
            self.expect(client.post("/api/v1/locks/sh:1", json=body), 200)
        for owner in ("r1", "r2"):
            release = {"owner": owner}
            self.expect(
                client.request("DELETE", "/api/v1/locks/sh:1", json=release), 204
            )

    def waiting(self, client: httpx.Client) -> None:
        """An acquire that waits in line behind a holder: the old code puts it
        in line (without what 0036 adds) and its grant takes it out."""
        with waiting_behind(client, "wq:1", "first", "second"):
            pass

    def session(self, client: httpx.Client) -> None:
        started = self.expect(
            client.post("/api/v1/sessions", json={"owner": "s", "ttl": 30}), 201
        ).json()
        bound = {"owner": "s", "session": started["id"]}
        self.expect(client.post("/api/v1/locks/ses:1", json=bound), 200)
        path = f"/api/v1/sessions/{started['id']}"
        self.expect(client.patch(path, json={"owner": "s", "ttl": 30}), 200)
        self.expect(client.delete(path), 204)


@contextmanager
def waiting_behind(
    client: httpx.Client, resource: str, holder: str, waiter: str
) -> Iterator[None]:
    """Inside the block ``waiter``'s acquire of ``resource`` waits in line
    behind ``holder``'s grant (both sent to ``client``'s server, the waiter on
    a connection of its own); leaving it, the holder releases, the waiter is
    granted and releases in turn."""
    path = f"/api/v1/locks/{resource}"
    Traffic.expect(client.post(path, json={"owner": holder, "ttl": 30}), 200)
    answers: list[httpx.Response | Exception] = []

    def wait() -> None:
        try:
            with httpx.Client(
                base_url=client.base_url, headers=client.headers, timeout=30
            ) as own:
                body = {"owner": waiter, "ttl": 30, "wait": 20}
                answers.append(own.post(path, json=body))
        except Exception as exc:  # noqa: BLE001 - raised by the caller's thread
            answers.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: not thread.is_alive() or client.get(path).json()["waiters"] == 1,
            f"{waiter} in line for {resource}",
        )
        yield
    finally:
        released = client.request("DELETE", path, json={"owner": holder})
        thread.join(30)
    Traffic.expect(released, 204)
    (answer,) = answers
    if isinstance(answer, Exception):
        raise answer
    Traffic.expect(answer, 200)
    Traffic.expect(client.request("DELETE", path, json={"owner": waiter}), 204)


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    done = threading.Event()
    deadline = threading.Timer(seconds, done.set)
    deadline.start()
    try:
        while not condition():
            if done.wait(0.02):
                raise AssertionError(f"timed out waiting for {what}")
    finally:
        deadline.cancel()


@pytest.mark.parametrize("release", RELEASES)
def test_db_upgrade_completes_while_the_previous_release_serves_traffic(
    release, empty_url, tmp_path, tmp_path_factory
):
    app = new_app(empty_url, tmp_path / "instance")
    try:
        assert upgrade(app, release).after == {release}
        with app.app_context():
            as_a_release_left_it(db.engine)
        tree = release_tree(release, tmp_path_factory.getbasetemp())
        with serving(tree, empty_url, tmp_path / "old-instance") as old:
            traffic = Traffic(old.url, old.token)
            for thread in traffic.threads:
                thread.start()
            try:
                wait_for(
                    lambda: (
                        len(traffic.counts()) == len(traffic.threads)
                        and min(traffic.counts().values()) >= WARM_CYCLES
                    ),
                    "the old release's traffic to start",
                )
                retries: list[str] = []
                started = time.monotonic()
                done = upgrade(app, report=retries.append)
                ended = time.monotonic()
                # A place the old code puts in line on the upgraded schema is
                # in this code's line, with no mode recorded.
                with (
                    httpx.Client(
                        base_url=old.url, headers=traffic.headers, timeout=30
                    ) as client,
                    waiting_behind(client, "wq:2", "first", "second"),
                    app.app_context(),
                ):
                    line = lock_service().queue.line("wq:2")
                assert [(w.owner, w.mode, w.limit) for w in line] == [
                    ("second", None, None)
                ]
                # The old code goes on serving on the upgraded schema.
                after = traffic.counts()
                wait_for(
                    lambda: all(
                        traffic.counts()[k] >= after[k] + WARM_CYCLES for k in after
                    ),
                    "traffic after the upgrade",
                )
            finally:
                traffic.stop.set()
                for thread in traffic.threads:
                    thread.join(timeout=30)
        assert done.after == required_revisions()
        with app.app_context(), db.engine.connect() as conn:
            # Where the old release reads the revision, it moved too.
            assert legacy_revisions(conn) == required_revisions()
        assert traffic.failures == [], traffic.failures[:5]
        # The traffic ran during the upgrade, not only around it (on SQLite the
        # upgrade from a recent release takes milliseconds: a request in
        # flight across it counts, not only a cycle that ended within it).
        assert traffic.in_flight(started, ended) > 0, (ended - started, retries)
    finally:
        with app.app_context():
            db.engine.dispose()


# A revision of a release newer than this code, whose migration is not
# additive: it admits only code of its own revision or newer.
NOT_ADDITIVE = "9999_not_additive"


def test_a_served_release_on_a_schema_it_is_too_old_for_answers_503(
    empty_url, tmp_path
):
    """A release's code served as one (this tree, in a process of its own: the
    first release that reads what a revision admits, 0.2.0, is not in this
    history) on a database a newer release migrated past it with a migration
    that is not additive: `/healthz` and every API call are 503 with
    `Retry-After`, naming the revision and the oldest code it admits; never a
    500, never an answer read from a schema it does not know."""
    (head,) = required_revisions()
    app = new_app(empty_url, tmp_path / "instance")
    try:
        upgrade(app)
        with app.app_context(), db.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE {VERSION_TABLE} SET version_num = :r"),
                {"r": NOT_ADDITIVE},
            )
            conn.execute(
                text("INSERT INTO schema_compatibility VALUES (:r, :r)"),
                {"r": NOT_ADDITIVE},
            )
        with serving(PROJECT_ROOT, empty_url, tmp_path / "old-instance") as old:
            headers = {"Authorization": f"Bearer {old.token}"}
            with httpx.Client(base_url=old.url, headers=headers, timeout=30) as client:
                answers = [
                    client.get("/healthz"),
                    client.get("/api/v1/locks"),
                    client.post("/api/v1/locks/ex:1", json={"owner": "a"}),
                    client.post("/api/v1/locks/sem:1", json={"owner": "a", "limit": 2}),
                    client.post("/api/v1/sessions", json={"owner": "a", "ttl": 30}),
                ]
    finally:
        with app.app_context():
            db.engine.dispose()
    for answer in answers:
        where = f"{answer.request.method} {answer.request.url.path}"
        assert answer.status_code == 503, (where, answer.text)
        assert answer.headers["Retry-After"], where
        body = answer.json()
        assert body["database_revision"] == NOT_ADDITIVE, (where, body)
        assert body["database_admits_code"] == NOT_ADDITIVE, (where, body)
        assert body["required_revision"] == head, (where, body)
        assert "command" not in body, (where, body)
