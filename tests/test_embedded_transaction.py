"""An acquire, renew and release inside the caller's own transaction
(``Embedded.in_transaction``), on every database: the grant, its fence and its
audit event commit with the caller's writes or vanish with its rollback."""

from __future__ import annotations

import uuid

import pytest
from lockkeeper_core.embedded import AccessRefused, Embedded
from lockkeeper_core.errors import LockNotFound
from lockkeeper_core.models import DistributedLock, LockEvent
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    func,
    select,
)
from sqlalchemy.orm import Session

from app.auth.service import create_token


@pytest.fixture
def embedded(app, backend):
    with app.app_context():
        token = create_token("in-transaction")
        read_only = create_token("reader", read_only=True)
    found = Embedded(app.config["SQLALCHEMY_DATABASE_URI"])
    found.test_tokens = (token, read_only)  # type: ignore[attr-defined]
    yield found
    found.close()


@pytest.fixture
def notes(embedded):
    """The caller's own table, dropped at the end (the worker's database is
    shared by the tests that follow)."""
    metadata = MetaData()
    table = Table(
        f"notes_{uuid.uuid4().hex[:8]}",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("body", String(40)),
    )
    metadata.create_all(embedded.engine)
    yield table
    metadata.drop_all(embedded.engine)


def counts(embedded, table, resource):
    with embedded.engine.connect() as conn:
        return (
            conn.scalar(select(func.count()).select_from(table)),
            conn.scalar(
                select(func.count())
                .select_from(LockEvent)
                .where(LockEvent.resource == resource)
            ),
            conn.scalar(
                select(DistributedLock.owner).where(
                    DistributedLock.resource == resource
                )
            ),
        )


def test_a_rolled_back_transaction_leaves_no_grant_and_no_event(
    embedded, notes, backend
):
    token, _ = embedded.test_tokens
    with embedded.engine.connect() as conn:
        with conn.begin() as transaction:
            locks = embedded.in_transaction(conn, token)
            result = locks.acquire("tx:1", "w-1", 30)
            assert result.acquired
            conn.execute(notes.insert().values(body="written"))
            transaction.rollback()
    assert counts(embedded, notes, "tx:1") == (0, 0, None)
    # Free for the next taker. Its fence is above the one rolled back where
    # fences come from a sequence (a rollback skips the number); SQLite's
    # counter is a row, rolled back with the grant: the number is given again,
    # to a grant that is the first to exist with it.
    again = embedded.service.acquire("tx:1", "w-2", 30)
    assert again.acquired
    if backend == "sqlite":
        assert again.lock.fence >= result.lock.fence
    else:
        assert again.lock.fence > result.lock.fence


def test_a_committed_transaction_keeps_the_writes_and_the_grant(embedded, notes):
    token, _ = embedded.test_tokens
    with embedded.engine.connect() as conn:
        with conn.begin():
            locks = embedded.in_transaction(conn, token)
            granted = locks.acquire("tx:2", "w-1", 30)
            conn.execute(notes.insert().values(body="written"))
        # Another worker sees the grant once committed.
        refused = embedded.service.acquire("tx:2", "w-2", 30)
    assert granted.acquired
    assert not refused.acquired
    assert refused.lock.fence == granted.lock.fence
    assert counts(embedded, notes, "tx:2") == (1, 1, "w-1")


def test_release_in_a_transaction_with_an_orm_session(embedded, notes):
    token, _ = embedded.test_tokens
    held = embedded.service.acquire("tx:3", "w-1", 30, token="in-transaction")
    with Session(embedded.engine) as session, session.begin():
        locks = embedded.in_transaction(session, token)
        released = locks.release("tx:3", "w-1")
        session.execute(notes.insert().values(body="done"))
    assert released.fence == held.lock.fence
    assert counts(embedded, notes, "tx:3") == (1, 2, None)
    with pytest.raises(LockNotFound):
        embedded.service.get("tx:3")


def test_a_rolled_back_release_keeps_the_lock(embedded, notes):
    token, _ = embedded.test_tokens
    embedded.service.acquire("tx:4", "w-1", 30, token="in-transaction")
    with embedded.engine.connect() as conn, conn.begin() as transaction:
        embedded.in_transaction(conn, token).release("tx:4", "w-1")
        transaction.rollback()
    assert embedded.service.get("tx:4").owner == "w-1"


def test_a_held_resource_is_refused_at_once_and_read_only_tokens_are_refused(embedded):
    token, read_only = embedded.test_tokens
    with embedded.engine.connect() as conn, conn.begin():
        embedded.service.acquire("tx:5", "w-1", 30)
        locks = embedded.in_transaction(conn, token)
        # A held resource: refused at once, never waited for.
        refused = locks.acquire("tx:5", "w-2", 30)
        assert not refused.acquired
        assert refused.lock.owner == "w-1"
        with pytest.raises(AccessRefused, match="read-only"):
            embedded.in_transaction(conn, read_only).acquire("tx:6", "w-2")
