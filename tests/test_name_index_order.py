"""The lock order where InnoDB keeps a deleted name (MariaDB): a first grant's
insert of a name whose row was deleted, and the stale purge's delete, set up
deterministically (each call seen waiting before the next is let go).

A deleted row's entry in the unique index of names stays, delete-marked, until
InnoDB purges it (here an older read view keeps it). An insert of that name
checks for a duplicate under next-key locks on that entry and on the next
name's. Every locking read of a lock's row finds it by name: its index entry,
then the row.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from lockkeeper_core import transactions
from lockkeeper_core.errors import LockHeld
from lockkeeper_core.models import SHARED, DistributedLock
from sqlalchemy import create_engine, delete, select

from app.extensions import db
from tests.row_waits import DEADLINE, RowHolder, lock_waits

pytestmark = [pytest.mark.backends("mariadb"), pytest.mark.usefixtures("backend")]


@pytest.fixture
def conflicts(monkeypatch) -> list:
    """Every deadlock or lock-wait timeout the service's retries met."""
    met = []
    is_conflict = transactions.is_conflict

    def counted(exc):
        found = is_conflict(exc)
        if found:
            met.append(exc)
        return found

    monkeypatch.setattr(transactions, "is_conflict", counted)
    return met


def _wait_for(count: int, futures) -> None:
    """Return once ``count`` transactions of this database wait for a row
    lock; fail if a call finished first, or at the deadline."""
    deadline = time.monotonic() + DEADLINE
    while True:
        with db.engine.connect() as conn:
            if lock_waits(conn) >= count:
                return
        if any(future.done() for future in futures):
            [future.result(timeout=0) for future in futures]
            raise AssertionError("a call did not wait for the row")
        assert time.monotonic() < deadline, "the calls never waited"
        time.sleep(0.01)


def _outcome(call):
    try:
        return call()
    except LockHeld as exc:
        return exc


def _two_first_grants_of_a_deleted_name(service, conflicts, **how):
    """``one:f3`` made and deleted (its entry kept from purge), ``one:f4``'s row
    held; two first grants of ``one:f3`` (``how``: the mode) sent, seen
    waiting, then the holder commits. Their answers."""
    for name in ("one:f3", "one:f4"):
        service.acquire(name, "w-0", ttl=30)
        service.release(name, "w-0")
    keeper = create_engine(db.engine.url, isolation_level="REPEATABLE READ")
    pool = ThreadPoolExecutor(2)
    try:
        with keeper.connect() as view:
            view.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            with db.engine.begin() as conn:
                conn.execute(
                    delete(DistributedLock).where(DistributedLock.resource == "one:f3")
                )
            with RowHolder(service, "one:f4") as held:
                grants = [
                    pool.submit(
                        _outcome,
                        lambda owner=owner: service.acquire(
                            "one:f3", owner, ttl=30, **how
                        ),
                    )
                    for owner in ("w-1", "w-2")
                ]
                _wait_for(2, grants)
                held.finish(lambda conn: None)
                answers = [future.result(timeout=DEADLINE) for future in grants]
            view.rollback()
    finally:
        pool.shutdown(wait=False)
        keeper.dispose()
    assert conflicts == [], "the first grants deadlocked"
    return answers


def test_two_first_grants_of_a_deleted_name_take_turns(service, conflicts):
    """A plain insert took those locks shared: both first grants held them
    before either inserted, then each waited for the other's to insert before
    the next entry: a deadlock (1213, which the service retried). The second
    must wait for the first, find its row and be refused."""
    answers = _two_first_grants_of_a_deleted_name(service, conflicts)
    granted = [a for a in answers if not isinstance(a, Exception) and a.acquired]
    assert len(granted) == 1, answers
    assert granted[0].lock.resource == "one:f3"


def test_two_first_shared_grants_of_a_deleted_name_take_turns(service, conflicts):
    """The holders path's first grant inserts the row free, the same way: the
    second waits for the first, finds its row and shares it."""
    answers = _two_first_grants_of_a_deleted_name(service, conflicts, mode=SHARED)
    assert all(not isinstance(a, Exception) and a.acquired for a in answers), answers
    with db.engine.connect() as conn:
        names = conn.scalars(select(DistributedLock.resource)).all()
    assert sorted(names) == ["one:f3", "one:f4"]


def test_the_stale_purge_locks_by_name(service, clock, conflicts):
    """The purge's delete and an acquire's locking read of the same row meet,
    queued in that order behind a transaction holding the row alone (by its
    primary key). Locked by primary key, the purge took the row, then waited
    for its name's entry (to mark it deleted), which the acquire had locked and
    waited for the row with: a deadlock. Locked by name, the purge takes the
    entry first; the acquire waits for it, then finds no row and makes one."""
    service.acquire("one:p", "w-0", ttl=30)
    service.release("one:p", "w-0")
    clock.advance(3600)
    core = service.core
    with db.engine.connect() as conn:
        row_id = conn.scalar(
            select(DistributedLock.id).where(DistributedLock.resource == "one:p")
        )
    cutoff = core.now() - timedelta(minutes=1)

    def purge():
        return core.run(
            lambda conn: core.transactional.purge_stale_batch(conn, cutoff, 100)
        )

    pool = ThreadPoolExecutor(2)
    try:
        with db.engine.connect() as holder, holder.begin():
            holder.execute(
                select(DistributedLock.id)
                .where(DistributedLock.id == row_id)
                .with_for_update()
            )
            purged = pool.submit(purge)
            _wait_for(1, [purged])
            granted = pool.submit(service.acquire, "one:p", "w-1", ttl=30)
            _wait_for(2, [purged, granted])
        found, rows = purged.result(timeout=DEADLINE)
        assert granted.result(timeout=DEADLINE).acquired
    finally:
        pool.shutdown(wait=False)
    assert conflicts == [], "the purge and the acquire deadlocked"
    assert (found, [row.resource for row in rows]) == (1, ["one:p"])
    with db.engine.connect() as conn:
        owners = conn.execute(
            select(DistributedLock.resource, DistributedLock.owner)
        ).all()
    assert [tuple(row) for row in owners] == [("one:p", "w-1")]
