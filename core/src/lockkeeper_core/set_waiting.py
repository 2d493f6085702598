"""A set waiting in line: a place in the line of every member, taken at once.

A set asked with ``wait`` that is refused joins the line of each of its
members in one transaction that first locks the members' rows in the lock
order (as the set's acquire does): two sets that share members take their
places one after the other, so on every member they share the same one is
ahead, and neither waits for the other's place on one member while holding
its own ahead on another. A single acquire's place (``WaitQueue.join``) takes
no row lock: it waits for one resource only, so it can be ahead of a set on
one member and behind it on none that it needs.

The set is then asked again with its places (each member's grant passes the
waiters ahead of it on that member only, as a single waiter's does, and
deletes that place when it is granted), until it is granted whole or its
wait runs out. It holds nothing while it waits, and single acquires that come
after it queue behind it on every member: it is not starved by them. Its
places left when it gives up are deleted, and the members' lines woken.

A set is woken as a single waiter is (``lockkeeper_core.queue``): a
release that names its place as the head of a member's line rings it
(PostgreSQL's NOTIFY; SQLite's doorbell; in this process on every
database), else it looks again after the line's pause. It takes one seat
of the worker's waiting room (``WaitQueue.seat``: one request, whatever
its members), under the caps single waiters take theirs under, and leaves
the lines as soon as its client has gone or its API token ended, as a
single waiter does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import delete, insert, select

from lockkeeper_core.core import LockCore
from lockkeeper_core.errors import TokenEnded
from lockkeeper_core.queue import CLIENT_CHECK_INTERVAL, DEADLINE_SLACK, WaitQueue
from lockkeeper_core.results import SetResult
from lockkeeper_core.statements.common import locks, waiters
from lockkeeper_core.values import Ask


class SetRows(Protocol):
    """What a set's wait needs of ``lockkeeper_core.sets.Sets`` (which calls
    it): a port, so that neither module imports the other."""

    core: LockCore
    queue: WaitQueue

    def create_rows(self, asks: list[Ask]) -> list[str]: ...

    def forget_rows(self, names: list[str]) -> None: ...


def join_lines(
    core: LockCore, ordered: list[Ask], wait: float
) -> tuple[dict[str, int], list[str]]:
    """A place for the set in each member's line, in one transaction, the
    members' rows locked first in the lock order (on a server database the
    caller made those that had none: a row missing here would leave two
    sets' places on it in either order); {resource: place}, and the names
    of the rows made here (SQLite)."""
    now = core.now()
    deadline = now + timedelta(seconds=wait) + DEADLINE_SLACK

    def work(conn):
        made.clear()
        for ask in ordered:  # sorted: the lock order
            found = conn.execute(
                select(locks.c.id).where(locks.c.resource == ask.resource)
                .with_for_update()
            ).all()  # fmt: skip
            if not found and core.dialect == "sqlite":
                made.append(ask.resource)
                # One writer at a time: made here. A place in the line of a
                # resource with no row would not hold up an acquire there.
                core.transactional._insert_free_row(conn, ask.resource, now, ask.limit)
        places = {}
        for ask in ordered:
            result = conn.execute(
                insert(waiters).values(
                    resource=ask.resource,
                    owner=ask.owner,
                    token=ask.token,
                    enqueued_at=now,
                    deadline=deadline,
                    mode=ask.mode,
                    holder_limit=ask.limit,
                )
            )
            places[ask.resource] = result.inserted_primary_key[0]
        return places

    made: list[str] = []
    return core.run(work), made


def leave_lines(
    core: LockCore,
    notify: Callable[[str, int], Any],
    places: dict[str, int],
    *,
    wake: bool,
) -> None:
    """Delete the set's places still in line (a grant deletes its own, but
    an exclusive grant made again keeps it) and, when ``wake``, wake each
    member's line: the next may go now."""
    if not places:
        return

    def work(conn):
        # One primary-key delete each (MariaDB may read a small table whole
        # for ``id IN (…)``, waiting on rows others hold).
        for place in places.values():
            conn.execute(delete(waiters).where(waiters.c.id == place))

    core.run(work)
    if wake:
        for resource in places:
            notify(resource, 1)


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a waiting set asks about its request while it waits, as a single
    waiter does (``WaitQueue.wait``): whether its client is still there
    (``still_wanted``, looked at every ``CLIENT_CHECK_INTERVAL``), and
    whether its API token is still live (before every look, and with the
    client: an ended token raises ``TokenEnded``)."""

    still_wanted: Callable[[], bool] | None
    token_live: Callable[[], bool] | None
    token: str | None

    def check_token(self) -> None:
        if self.token_live is not None and not self.token_live():
            raise TokenEnded(self.token)

    def client_there(self) -> bool:
        self.check_token()
        return self.client_seen()

    def client_seen(self) -> bool:
        """The client's socket alone (no token check, which may raise)."""
        return self.still_wanted is None or self.still_wanted()


def wait_in_line(
    sets: SetRows,
    ordered: list[Ask],
    wait: float,
    asked: Callable[[dict[str, int] | None], SetResult],
    wanted: Wanted,
) -> SetResult:
    """The set's wait, in one seat of the waiting room (``WaitersFull``
    before anything is written): the free rows of the members that have
    none (``Sets.create_rows``), places in every member's line
    (``join_lines``), then ``asked(places)`` each time a release wakes the
    set, or after the line's pause (as a single waiter's: the holder's
    expiry, else the poll interval), until the set is granted, its wait runs
    out or its client has gone. However it ends, its places left are
    deleted; unless granted, the rows made for it too."""
    core, queue = sets.core, sets.queue
    made: list[str] = []
    result = None
    with queue.seat(wanted.token) as seat:
        try:
            if core.dialect != "sqlite":
                made += sets.create_rows(ordered)
            result = _in_line(core, queue, ordered, wait, asked, wanted, made)
            return result
        finally:
            if result is not None and result.acquired:
                seat["outcome"] = "granted"
            else:
                if result is not None and not wanted.client_seen():
                    seat["outcome"] = "gone"
                sets.forget_rows(made)  # nothing left behind, as without a wait


def _in_line(core, queue, ordered, wait, asked, wanted, made) -> SetResult:
    listener = queue.start_wakers()
    # Subscribed before the places are taken: a release between the two
    # still rings.
    with queue.wakeups.subscribe_all([ask.resource for ask in ordered]) as woken:
        places, also = join_lines(core, ordered, wait)
        made += also
        for resource, place in places.items():
            woken[resource].waiter_id = place  # the head named by a release
        doorbell = woken[ordered[0].resource].event
        until = time.monotonic() + wait
        result = None
        try:
            while True:
                wanted.check_token()
                result = asked(places)
                left = until - time.monotonic()
                # The client looked at after every refused look too, as a
                # single waiter's is: a set rung again and again (the head
                # of a busy line) would otherwise never pause long enough.
                if result.acquired or left <= 0 or not wanted.client_there():
                    return result
                pause = min(left, queue.pause(result, listener))
                if not _woken_or_paused(doorbell, pause, wanted.client_there):
                    return result  # its client has gone
                doorbell.clear()  # before the next look: a later ring is kept
        finally:
            granted = result is not None and result.acquired
            leave_lines(core, queue.notify_released, places, wake=not granted)


def _woken_or_paused(
    doorbell: threading.Event, seconds: float, client_there: Callable[[], bool]
) -> bool:
    """Wait for ``doorbell`` up to ``seconds``, looking at the client every
    ``CLIENT_CHECK_INTERVAL``; False as soon as it has gone."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        if doorbell.wait(min(left, CLIENT_CHECK_INTERVAL)):
            return True
        if not client_there():
            return False
    return True
