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

A set keeps its places as a single waiter keeps its place
(``lockkeeper_core.queue``): a request that asked for them (``kept``: {}
asks, {resource: place} presents those kept before) and is turned away by a
full room keeps a place in every member's line for ``PLACE_KEPT_FOR``, looks
once from them, and the refusal names them (``WaitersFull.places``); a
request whose wait runs out while its client's goes on (``rejoin``) keeps
them the same way, named by its answer (``SetResult.places``). The next
request presents them and takes them back, in the same transaction and lock
order as a first join: it waits from where the set stood, on every member,
not behind those who came after it. The free rows made for a set stay while
its places are kept (a place in the line of a resource with no row would
not hold up a first acquire there), the stale purge's too (it keeps a row
with a live place in its line); places whose client never came back lapse,
and the purge deletes them and then the rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import delete, insert, select, update

from lockkeeper_core.core import LockCore
from lockkeeper_core.errors import InvalidInput, TokenEnded, WaitersFull
from lockkeeper_core.queue import (
    CLIENT_CHECK_INTERVAL,
    DEADLINE_SLACK,
    PLACE_KEPT_FOR,
    WaitQueue,
)
from lockkeeper_core.results import SetResult
from lockkeeper_core.statements.common import lock_rows_in_order, locks, waiters
from lockkeeper_core.values import Ask


class SetRows(Protocol):
    """What a set's wait needs of ``lockkeeper_core.sets.Sets`` (which calls
    it): a port, so that neither module imports the other."""

    core: LockCore
    queue: WaitQueue

    def create_rows(self, asks: list[Ask]) -> list[str]: ...

    def forget_rows(self, names: list[str]) -> None: ...


def check_kept(kept: Any, ordered: list[Ask]) -> None:
    """``kept``: None, or {member's resource: a place in line, 1 or more}.

    :raise InvalidInput: anything else (naming ``places``)."""
    if kept is None:
        return
    members = {ask.resource for ask in ordered}
    if not isinstance(kept, dict) or not all(
        resource in members and type(place) is int and 0 < place <= 9223372036854775807
        for resource, place in kept.items()
    ):
        raise InvalidInput(
            [("places", "must map members' resources to places in line (1 or more)")]
        )


def join_lines(
    core: LockCore,
    ordered: list[Ask],
    wait: float,
    kept: dict[str, int] | None = None,
    slack: timedelta = DEADLINE_SLACK,
    own: bool = False,
) -> tuple[dict[str, int], list[str]]:
    """A place for the set in each member's line, in one transaction, the
    members' rows locked first in the lock order (on a server database the
    caller made those that had none: a row missing here would leave two
    sets' places on it in either order); {resource: place}, and the names
    of the rows made here (SQLite). ``kept``: places kept for this set
    (``WaitQueue.join``'s ``place``), each taken back with the new deadline
    if it is still live and of this (resource, owner, token); else the
    member joins at the end of its line. ``own``: ``kept`` are the calling
    request's own places, which it never left (a rejoin): taken back even if
    the request ran past their deadline."""
    now = core.now()
    deadline = now + timedelta(seconds=wait) + slack

    def work(conn):
        made.clear()
        if core.dialect == "postgresql":  # its functions' order, at once
            lock_rows_in_order(conn, [ask.resource for ask in ordered])
        else:
            for ask in ordered:  # sorted: the lock order
                found = conn.execute(
                    select(locks.c.id).where(locks.c.resource == ask.resource)
                    .with_for_update()
                ).all()  # fmt: skip
                if not found and core.dialect == "sqlite":
                    made.append(ask.resource)
                    # One writer at a time: made here. A place in the line of
                    # a resource with no row would not hold up an acquire there.
                    tx = core.transactional
                    tx._insert_free_row(conn, ask.resource, now, ask.limit)
        places = {}
        for ask in ordered:
            place = _taken_back(
                conn, ask, (kept or {}).get(ask.resource), None if own else now,
                deadline,
            )  # fmt: skip
            if place is not None:
                places[ask.resource] = place
                continue
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


def _taken_back(conn, ask: Ask, place: int | None, live_at, deadline) -> int | None:
    """``place`` with its deadline moved to ``deadline``, if it is a place of
    ``ask``'s (resource, owner, token), live at ``live_at`` (None: lapsed or
    not); else None."""
    if not place:
        return None
    token = waiters.c.token
    mine = [
        waiters.c.id == place,
        waiters.c.resource == ask.resource,
        waiters.c.owner == ask.owner,
        token == ask.token if ask.token is not None else token.is_(None),
    ]
    if live_at is not None:
        mine.append(waiters.c.deadline > live_at)
    taken = conn.execute(
        update(waiters)
        .where(*mine)
        .values(deadline=deadline, mode=ask.mode, holder_limit=ask.limit)
    )
    return place if taken.rowcount == 1 else None


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
    kept: dict[str, int] | None = None,
    rejoin: bool = False,
) -> SetResult:
    """The set's wait, in one seat of the waiting room (``WaitersFull``
    before anything is written, unless ``kept`` asks for places: then
    ``_turned_away``): the free rows of the members that have none
    (``Sets.create_rows``), places in every member's line (``join_lines``,
    ``kept`` taken back), then ``asked(places)`` each time a release wakes
    the set, or after the line's pause (as a single waiter's: the holder's
    expiry, else the poll interval), until the set is granted, its wait runs
    out or its client has gone. However it ends, its places left are
    deleted (with ``rejoin``, a wait that ran out keeps them: the result's
    ``places``); unless granted or its places kept, the rows made for it
    too."""
    core, queue = sets.core, sets.queue
    made: list[str] = []
    result = None
    with ExitStack() as stack:
        try:
            seat = stack.enter_context(queue.seat(wanted.token))
        except WaitersFull as refusal:
            if kept is None:
                raise
            return _turned_away(sets, ordered, asked, kept, refusal)
        try:
            if core.dialect != "sqlite":
                made += sets.create_rows(ordered)
            result = _in_line(
                core, queue, ordered, wait, asked, wanted, made, kept, rejoin
            )
            return result
        finally:
            if result is not None and result.acquired:
                seat["outcome"] = "granted"
            else:
                if result is not None and not wanted.client_seen():
                    seat["outcome"] = "gone"
                if result is None or result.places is None:
                    sets.forget_rows(made)  # nothing left behind, as without a wait


def _turned_away(
    sets: SetRows,
    ordered: list[Ask],
    asked: Callable[[dict[str, int] | None], SetResult],
    kept: dict[str, int],
    refusal: WaitersFull,
) -> SetResult:
    """A set the room turned away that asked for its places to be kept: a
    place in every member's line (``kept`` taken back) for
    ``PLACE_KEPT_FOR``, one look from them, and ``refusal`` naming them
    (``WaitQueue._turned_away``, for a set)."""
    core, notify = sets.core, sets.queue.notify_released
    made = sets.create_rows(ordered) if core.dialect != "sqlite" else []
    places, also = join_lines(core, ordered, PLACE_KEPT_FOR, kept, timedelta(0))
    try:
        result = asked(places)
    except BaseException:
        leave_lines(core, notify, places, wake=True)
        sets.forget_rows(made + also)
        raise
    if result.acquired:
        leave_lines(core, notify, places, wake=False)
        return result
    refusal.places = places
    raise refusal


def _in_line(
    core, queue, ordered, wait, asked, wanted, made, kept, rejoin
) -> SetResult:
    listener = queue.start_wakers()
    # Subscribed before the places are taken: a release between the two
    # still rings.
    with queue.wakeups.subscribe_all([ask.resource for ask in ordered]) as woken:
        places, also = join_lines(core, ordered, wait, kept)
        made += also
        for resource, place in places.items():
            woken[resource].waiter_id = place  # the head named by a release
        doorbell = woken[ordered[0].resource].event
        try:
            result = _looked_until_done(
                queue, listener, doorbell, wait, asked, places, wanted
            )
        except BaseException:
            leave_lines(core, queue.notify_released, places, wake=True)
            raise
        if result.acquired:
            leave_lines(core, queue.notify_released, places, wake=False)
        elif rejoin and wanted.client_seen():
            # Ran out, and its client asks again at once: it waits on from
            # here, not behind those who came after it.
            places, _ = join_lines(
                core, ordered, PLACE_KEPT_FOR, places, timedelta(0), own=True
            )
            return replace(result, places=places)
        else:
            leave_lines(core, queue.notify_released, places, wake=True)
        return result


def _looked_until_done(queue, listener, doorbell, wait, asked, places, wanted):
    """``asked(places)`` until granted, the wait runs out or the client has
    gone; the last answer."""
    until = time.monotonic() + wait
    while True:
        wanted.check_token()
        result = asked(places)
        left = until - time.monotonic()
        # The client looked at after every refused look too, as a single
        # waiter's is: a set rung again and again (the head of a busy line)
        # would otherwise never pause long enough.
        if result.acquired or left <= 0 or not wanted.client_there():
            return result
        pause = min(left, queue.pause(result, listener))
        if not _woken_or_paused(doorbell, pause, wanted.client_there):
            return result  # its client has gone
        doorbell.clear()  # before the next look: a later ring is kept


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
