"""Operator actions and grants racing on one row, with real threads against each
real database, on the real clock (the database server's where it has one)."""

from __future__ import annotations

import time

import pytest
from lockkeeper_core.errors import LockChanged
from lockkeeper_core.models import LockEvent
from lockkeeper_core.values import Ask
from sqlalchemy import select

from app.extensions import db, lock_service
from tests.faults.checker import grant_order_violations
from tests.row_waits import RowHolder, run_blocked

pytestmark = pytest.mark.usefixtures("backend")


def _events(resource: str) -> list[dict]:
    rows = db.session.scalars(
        select(LockEvent).where(LockEvent.resource == resource).order_by(LockEvent.id)
    ).all()
    columns = LockEvent.__table__.columns.keys()
    return [{name: getattr(row, name) for name in columns} for row in rows]


def _stale(service, resource: str, owner: str):
    """A lock of ``owner`` that has run out by the database's clock."""
    lock = service.acquire(resource, owner, ttl=0.05).lock
    deadline = time.monotonic() + 10
    while service.now() < lock.expires_at:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return lock


def test_force_release_refused_when_the_lock_changed_hands_while_it_waited(app):
    """The operator confirmed fence F of w-1's stale lock; w-2 takes it over while
    the force-release waits for the row: refused, and w-2's grant stays."""
    with app.app_context():
        service = lock_service()
        confirmed = _stale(service, "race:op", "w-1")
        with RowHolder(service, "race:op") as held:
            waiting = run_blocked(
                service,
                lambda: _in_context(
                    app,
                    lambda: lock_service().force_release(
                        "race:op",
                        actor="alice",
                        reason="stuck",
                        expected_fence=confirmed.fence,
                    ),
                ),
            )
            held.finish(
                lambda conn: service.core.transactional.acquire(
                    conn,
                    Ask("race:op", "w-2", None, 30, "worker"),
                    service.core.given_now(),
                )
            )
        with pytest.raises(LockChanged) as refused:
            waiting.result(timeout=30)
        assert refused.value.holder.owner == "w-2"
        assert refused.value.holder.fence > confirmed.fence
        lock = service.get("race:op")
        assert (lock.owner, lock.fence) == ("w-2", refused.value.holder.fence)
        assert [e["action"] for e in _events("race:op")] == ["acquired", "took_over"]


def test_claim_refused_when_the_lock_changed_hands_while_it_waited(app):
    with app.app_context():
        service = lock_service()
        confirmed = _stale(service, "race:claim", "w-1")
        with RowHolder(service, "race:claim") as held:
            waiting = run_blocked(
                service,
                lambda: _in_context(
                    app,
                    lambda: lock_service().claim(
                        "race:claim",
                        "operator:alice",
                        60,
                        actor="alice",
                        reason="hung",
                        force=True,
                        expected_fence=confirmed.fence,
                    ),
                ),
            )
            held.finish(
                lambda conn: service.core.transactional.acquire(
                    conn,
                    Ask("race:claim", "w-2", None, 30, "worker"),
                    service.core.given_now(),
                )
            )
        with pytest.raises(LockChanged) as refused:
            waiting.result(timeout=30)
        assert refused.value.holder.owner == "w-2"
        assert service.get("race:claim").owner == "w-2"
        assert [e["action"] for e in _events("race:claim")] == [
            "acquired",
            "took_over",
        ]


def _in_context(app, call):
    with app.app_context():
        return call()


def test_a_grant_that_waited_for_a_release_is_recorded_after_it(app, backend):
    """The holder releases while a waiter is blocked on its row: the waiter's
    grant must not record a time before that release. On PostgreSQL a refused
    acquire never waits for a row held validly by another owner, so there the
    waiter is the holder's own retried acquire, which does wait."""
    with app.app_context():
        service = lock_service()
        service.acquire("race:order", "w-1", ttl=30)
        waiter = "w-1" if backend == "postgresql" else "w-2"
        with RowHolder(service, "race:order") as held:
            waiting = run_blocked(
                service,
                lambda: _in_context(
                    app, lambda: lock_service().acquire("race:order", waiter, ttl=30)
                ),
            )
            held.finish(
                lambda conn: service.core.transactional.release(
                    conn, "race:order", "w-1", None, "worker", service.core.given_now()
                )
            )
        assert waiting.result(timeout=30).acquired
        events = _events("race:order")
        assert [e["action"] for e in events] == ["acquired", "released", "acquired"]
        assert grant_order_violations(events) == []
        assert events[2]["acquired_at"] >= events[1]["occurred_at"]


def test_a_take_over_that_waited_for_a_force_release_is_recorded_after_it(app):
    """A stale lock: an operator's force-release holds the row while a worker's
    take-over waits for it (on every database, PostgreSQL included)."""
    with app.app_context():
        service = lock_service()
        _stale(service, "race:forced", "w-1")
        with RowHolder(service, "race:forced") as held:
            waiting = run_blocked(
                service,
                lambda: _in_context(
                    app, lambda: lock_service().acquire("race:forced", "w-2", ttl=30)
                ),
            )
            held.finish(
                lambda conn: service.core.transactional.force_remove(
                    conn,
                    *service.core.transactional.locked(
                        conn, "race:forced", service.core.given_now()
                    ),
                    actor="alice",
                    reason="stuck",
                )
            )
        assert waiting.result(timeout=30).acquired
        events = _events("race:forced")
        assert [e["action"] for e in events] == [
            "acquired",
            "force_released",
            "acquired",
        ]
        assert grant_order_violations(events) == []
