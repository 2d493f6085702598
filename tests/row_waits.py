"""Holding a lock row in one transaction while another request waits for it.

``RowHolder`` takes the row lock of a resource in a transaction of its own (the
first half of an operation), so a test can start a competing request, see it
blocked on that row, and then let the first operation finish and commit.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from lockkeeper_core.service import LockService
from sqlalchemy import Connection, bindparam, event, text

from app.database import autocommit

DEADLINE = 15.0

_PG_BLOCKED = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


def lock_waits(conn: Connection) -> int | None:
    """How many transactions of ``conn``'s database wait for a row lock now
    (None: SQLite, which shows no such thing).

    MariaDB: from ``SHOW ENGINE INNODB STATUS``, not information_schema.innodb_trx.
    InnoDB refreshes the cache behind innodb_trx only when nobody read it for
    100 ms, and a read restarts that clock: a poll every 10 ms (or parallel
    tests' polls together) kept reading the cache from before the wait began,
    and a wait went unseen until the deadline.
    """
    if conn.dialect.name == "postgresql":
        return conn.scalar(text(_PG_BLOCKED))
    if conn.dialect.name != "mariadb":
        return None
    status = conn.execute(text("SHOW ENGINE INNODB STATUS")).one()[2]
    waiting = set()
    for block in status.split("---TRANSACTION")[1:]:
        thread = re.search(r"thread id (\d+)", block)
        if "LOCK WAIT" in block and thread:
            waiting.add(int(thread[1]))
    if not waiting:
        return 0
    return conn.scalar(
        text(
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE db = DATABASE() AND id IN :ids"
        ).bindparams(bindparam("ids", expanding=True)),
        {"ids": sorted(waiting)},
    )


class RowHolder:
    """``with RowHolder(service, resource) as held:`` the row is locked (and on
    SQLite the database is, by ``BEGIN IMMEDIATE``) until ``held.finish(work)``
    runs ``work(conn)`` in that transaction and commits."""

    def __init__(self, service: LockService, resource: str):
        self.service = service
        self.resource = resource

    def __enter__(self) -> RowHolder:
        self.conn = self.service.core.write_engine.connect()
        self.transaction = self.conn.begin()
        self.row = self.service.core.transactional.lock_row(
            self.conn, self.resource, self.service.core.given_now()
        )
        return self

    def finish(self, work):
        result = work(self.conn)
        self.transaction.commit()
        return result

    def __exit__(self, *exc_info) -> None:
        if self.transaction.is_active:
            self.transaction.rollback()
        self.conn.close()


def run_blocked(service: LockService, call) -> Future:
    """Run ``call()`` in a thread and return once it waits for a row lock.

    PostgreSQL and MariaDB show the wait in their catalogs; SQLite does not, so
    there the return means the call has sent its first statement, the
    ``BEGIN IMMEDIATE`` that waits for the holder's transaction.
    """
    engine = service.engine
    sent = threading.Event()
    pool = ThreadPoolExecutor(1)

    def note(*_args):
        if worker and threading.current_thread() is worker[0]:
            sent.set()

    worker: list[threading.Thread] = []

    def run():
        worker.append(threading.current_thread())
        return call()

    # The hot path may run on the engine's autocommit twin (app.database).
    engines = {engine, autocommit(engine)}
    for each in engines:
        event.listen(each, "before_cursor_execute", note)
    try:
        future = pool.submit(run)
        deadline = time.monotonic() + DEADLINE
        while not sent.wait(0.01):
            if future.done() or time.monotonic() > deadline:
                future.result(timeout=0)
                raise AssertionError("the call never reached the database")
        while engine.dialect.name != "sqlite":
            with engine.connect() as conn:
                if lock_waits(conn):
                    break
            if future.done():
                future.result(timeout=0)
                raise AssertionError("the call finished without waiting for the row")
            if time.monotonic() > deadline:
                raise AssertionError("the call never waited for the row lock")
            time.sleep(0.01)
    finally:
        for each in engines:
            event.remove(each, "before_cursor_execute", note)
    pool.shutdown(wait=False)
    return future
