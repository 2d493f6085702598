"""Embedded and HTTP workers race for one resource on one database: never two
exclusive holders at once, never more than ``limit`` in a semaphore, and the
grants' fences increase in the order the audit log records them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from lockkeeper_client import LockClient
from lockkeeper_core.embedded import Embedded, EmbeddedTransport
from lockkeeper_core.models import LockEvent
from sqlalchemy import create_engine, select

from app.paths import PROJECT_ROOT

WORKERS_EACH = 3
ROUNDS = 8


def race(live_server, resource: str, limit: int | None) -> int:
    """Both kinds of worker in threads; the most found inside at once."""
    database = live_server.app.config["SQLALCHEMY_DATABASE_URI"]
    embedded = Embedded(database)
    inside = 0
    most = 0
    guard = threading.Lock()
    failures: list[BaseException] = []

    def work(client: LockClient) -> None:
        nonlocal inside, most
        try:
            with client:
                for _ in range(ROUNDS):
                    with client.lock(resource, ttl=10, wait=60, limit=limit):
                        with guard:
                            inside += 1
                            most = max(most, inside)
                        with guard:
                            inside -= 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    clients = [
        LockClient(live_server.url, live_server.token, timeout=30)
        for _ in range(WORKERS_EACH)
    ] + [
        LockClient(
            "http://embedded",
            live_server.token,
            timeout=30,
            transport=EmbeddedTransport(embedded),
        )
        for _ in range(WORKERS_EACH)
    ]
    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        embedded.close()
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads)
    return most


def grants(live_server, resource: str) -> list[tuple[str, int, str]]:
    engine = create_engine(live_server.app.config["SQLALCHEMY_DATABASE_URI"])
    try:
        with engine.connect() as conn:
            return [
                (row.action, row.fence, row.actor)
                for row in conn.execute(
                    select(LockEvent.action, LockEvent.fence, LockEvent.actor)
                    .where(LockEvent.resource == resource)
                    .order_by(LockEvent.id)
                )
            ]
    finally:
        engine.dispose()


@pytest.mark.backends("postgresql", "mariadb")
def test_embedded_and_http_workers_never_hold_one_lock_together(live_server, backend):
    most = race(live_server, "race:exclusive", None)
    assert most == 1
    events = grants(live_server, "race:exclusive")
    fences = [fence for action, fence, _ in events if action == "acquired"]
    assert len(fences) == 2 * WORKERS_EACH * ROUNDS
    assert fences == sorted(fences)
    assert len(set(fences)) == len(fences)
    # Grant, release, grant, release...: no grant while another is held.
    actions = [action for action, _, _ in events]
    assert actions == ["acquired", "released"] * (len(actions) // 2)


@pytest.mark.backends("postgresql", "mariadb")
def test_a_semaphore_never_lets_more_than_its_limit_in(live_server, backend):
    most = race(live_server, "race:places", 2)
    assert 1 <= most <= 2
    fences = [
        fence
        for action, fence, _ in grants(live_server, "race:places")
        if action == "acquired"
    ]
    assert len(fences) == 2 * WORKERS_EACH * ROUNDS
    assert len(set(fences)) == len(fences)


KILLED_WORKER = """
import sys, time
from lockkeeper_client import LockClient
from lockkeeper_core.embedded import EmbeddedTransport

transport = EmbeddedTransport(sys.argv[1])
client = LockClient("http://embedded", sys.argv[2], transport=transport)
held = client.lock("race:killed", ttl=2, wait=10)
held.__enter__()
print(held.fence, flush=True)
time.sleep(600)
"""


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_a_sigkilled_embedded_workers_lock_is_taken_over_after_its_ttl(
    live_server, backend, tmp_path
):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_WORKER)
    database = live_server.app.config["SQLALCHEMY_DATABASE_URI"]
    child = subprocess.Popen(
        [sys.executable, str(script), database, live_server.token],
        env={
            "PYTHONPATH": os.pathsep.join(
                str(path)
                for path in (
                    PROJECT_ROOT,
                    PROJECT_ROOT / "core" / "src",
                    PROJECT_ROOT / "client" / "src",
                )
            ),
            "PATH": "/usr/bin:/bin",
        },
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        killed_fence = int(child.stdout.readline())
        child.kill()
        child.wait(timeout=30)
        with LockClient(
            "http://embedded",
            live_server.token,
            transport=EmbeddedTransport(database),
        ) as client:
            began = time.monotonic()
            with client.lock("race:killed", ttl=10, wait=30) as held:
                waited = time.monotonic() - began
                assert held.fence > killed_fence
    finally:
        child.kill()
        child.wait(timeout=30)
    # Not before the dead worker's ttl (2 s, renewed every 2/3 s until killed).
    assert waited <= 2 + 5
    actions = [action for action, _, _ in grants(live_server, "race:killed")]
    # The expired row is taken over (no release was ever written).
    assert actions[:2] == ["acquired", "took_over"]


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_embedded_and_http_waiters_are_granted_in_arrival_order(live_server, backend):
    """One line per resource, in the database: waiters arriving embedded,
    over HTTP, embedded and over HTTP are granted in that order."""
    database = live_server.app.config["SQLALCHEMY_DATABASE_URI"]
    embedded = Embedded(database)
    resource = "race:line"

    def in_process() -> LockClient:
        return LockClient(
            "http://embedded",
            live_server.token,
            timeout=30,
            transport=EmbeddedTransport(embedded),
        )

    def over_http() -> LockClient:
        return LockClient(live_server.url, live_server.token, timeout=30)

    failures: list[BaseException] = []

    def wait_in_line(client: LockClient, owner: str) -> None:
        try:
            with client:
                assert client.acquire(resource, owner, ttl=30, wait=25).acquired
                client.release(resource, owner)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    def in_line() -> int:
        with live_server.service() as locks:
            return locks.holders(resource).waiters

    holder = in_process()
    threads = []
    try:
        assert holder.acquire(resource, "holder", ttl=30).acquired
        arrivals = [
            (in_process, "first-embedded"),
            (over_http, "second-http"),
            (in_process, "third-embedded"),
            (over_http, "fourth-http"),
        ]
        for count, (make, owner) in enumerate(arrivals, start=1):
            thread = threading.Thread(target=wait_in_line, args=(make(), owner))
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 30
            while in_line() < count:
                assert not failures, failures
                assert time.monotonic() < deadline, f"{owner} never joined the line"
                time.sleep(0.02)
        holder.release(resource, "holder")
        for thread in threads:
            thread.join(timeout=120)
    finally:
        holder.close()
        embedded.close()
    assert not failures, failures
    granted = [
        row.owner
        for row in _events_with_owner(live_server, resource)
        if row.action == "acquired" and row.owner != "holder"
    ]
    assert granted == [owner for _, owner in arrivals]


def _events_with_owner(live_server, resource: str):
    engine = create_engine(live_server.app.config["SQLALCHEMY_DATABASE_URI"])
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    select(LockEvent.action, LockEvent.owner)
                    .where(LockEvent.resource == resource)
                    .order_by(LockEvent.id)
                )
            )
    finally:
        engine.dispose()
