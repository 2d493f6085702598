"""Waiting in line: a fair, blocking acquire (``"wait": seconds``).

A waiting acquire is a row of ``lock_waiters`` (resource, owner, token, arrival
order ``id``, ``deadline``, and the ``mode`` and ``holder_limit`` it asked for, which
the dashboard shows), so every app instance and every worker sees one queue per
resource. The grant itself stays the lock statement's decision: the acquire
statement refuses anyone with live waiters ahead of it (a non-waiting acquire has
everyone ahead of it), and a waiter's grant deletes its own row in the same
statement or transaction. Mutual exclusion is untouched: the queue only decides
*who* may take a free row, never whether two may hold it.

Hand-over:

* PostgreSQL: a release or force-release that leaves waiters behind sends
  ``NOTIFY lockkeeper_waiters, '<resource>'``. One listening connection per
  app (``NotificationListener``, a thread its queue starts at the first waiter;
  a gunicorn worker has one app) wakes that process's waiting requests for the
  resource.
* SQLite, MariaDB: each waiting request looks every ``poll_interval`` (50 ms) with
  a plain read, and attempts the grant only when it is first in line and the lock
  is free or expired. A release inside the same process wakes its waiters at once.
* Expiry: a waiter sleeps until the holder's ``expires_at`` (the distance is read
  on the deciding clock) and attempts then.

A waiting request leaves the queue when it is granted (same statement), when its
wait runs out, or when its client has gone; a request lost with its app instance
stops counting at ``deadline`` (judged by the deciding clock in every statement).

A kept place: a request turned away by a full waiting room (``WaitersFull``) that
asked for it (``place`` given) keeps a row in line for ``PLACE_KEPT_FOR``
seconds, named by the refusal. Its client's retry presents it and takes it back
(``join`` with ``place``): into the room if there is one, else attempting once
from it and kept again. A turned-away request so never rejoins at the back,
and nobody who came after it is granted first; a kept place that is not taken
back holds the line up for at most ``PLACE_KEPT_FOR`` once it is first. A
request whose wait runs out while its client's goes on (``rejoin``: a wait
longer than the server's largest is a run of requests) keeps its place the
same way, named by the refusal, so the client's next request is not put
behind the waiters who came after it.

Background threads (the listener, the SQLite doorbell) belong to the app's
``WaitQueue``: ``WaitQueue.stop()`` closes the listener's connection and joins
them, and runs when the app's engine is disposed, when the queue is garbage
collected, and at interpreter exit; the next waiter starts them again. A database
about to be dropped is first freed with ``stop_background(url)``.
"""

from __future__ import annotations

import logging
import os
import select as select_module
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.errors import TokenEnded, WaitersFull
from lockkeeper_core.models import DistributedLock, LockWaiter
from lockkeeper_core.results import AcquireResult, SetResult
from lockkeeper_core.wakeups import (
    CHANNEL,
    PROCESS_WAKEUPS,
    HostDoorbell,
    NotificationListener,
    ring_host,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from lockkeeper_core.instrumentation import NoMetrics

log = logging.getLogger(__name__)

waiters = LockWaiter.__table__
locks = DistributedLock.__table__

# A row outlives its request by this much, so it never lapses while the request
# still waits (the two clocks are read at slightly different moments).
DEADLINE_SLACK = timedelta(seconds=1)
# How often a waiting request looks at its client's socket at the least.
CLIENT_CHECK_INTERVAL = 0.25
# PostgreSQL: a waiter whose holder is valid re-checks this often even without a
# notification (a notification lost while the listener reconnects).
NOTIFY_SAFETY_INTERVAL = 1.0
# Past the holder's expires_at by this much, so the attempt finds it expired.
EXPIRY_MARGIN = 0.002
# How long a turned-away request's place is kept for its retry (see above).
PLACE_KEPT_FOR = 2.0

# ``WaitQueue.join``'s sweep of a line's lapsed rows on MariaDB, through the
# line's own index (the multi-table form takes an index hint). Left to choose,
# MariaDB reads the deadline index (EXPLAIN: range on ix_lock_waiters_deadline),
# every line's lapsed rows, and a DELETE waits for each row it reads that
# another transaction changed: a set's places in other lines, a deadlock.
_SWEEP_LINE_BY_ITS_INDEX = text(
    "DELETE lock_waiters FROM lock_waiters"
    " FORCE INDEX (ix_lock_waiters_resource_id)"
    " WHERE resource = :resource AND deadline <= :now AND id <> :spared"
).bindparams(bindparam("now", type_=UTCDateTime()))


@dataclass(frozen=True, slots=True)
class Waiter:
    """One request in line, as the dashboard shows it: ``mode`` (EXCLUSIVE or
    SHARED) and ``limit`` (above 1: a semaphore's place) are what it asked for,
    both None for a place joined by code older than migration 0036."""

    id: int
    resource: str
    owner: str
    token: str | None
    enqueued_at: datetime
    deadline: datetime
    mode: str | None = None
    limit: int | None = None


# -- the client's socket ----------------------------------------------------------


def client_still_there(environ: dict[str, Any]) -> Callable[[], bool]:
    """A check that the HTTP client of this request has not hung up.

    A client waiting for its answer sends nothing; a readable socket that reads as
    end-of-file means it closed the connection. Servers that do not expose the
    socket (or TLS sockets) are taken as "still there": the wait then ends at its
    deadline.
    """
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if not isinstance(sock, socket.socket) or hasattr(sock, "getpeercert"):
        return lambda: True

    def still_there() -> bool:
        try:
            readable, _, _ = select_module.select([sock], [], [], 0)
            if not readable:
                return True
            return sock.recv(1, socket.MSG_PEEK) != b""
        except (OSError, ValueError):
            return False

    return still_there


# -- the queue --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineClock:
    """The lock service's clock, as the line reads it."""

    # A reading: the database's clock where it has one, else the host's.
    now: Callable[[], datetime]
    # The caller-side reading, or None for "the server's, in SQL".
    given: Callable[[], datetime | None]
    # The server's clock as a SQL expression; None where there is none (SQLite).
    server_now: Any = None


class WaitQueue:
    """The rows of ``lock_waiters`` and the waiting loop.

    It is handed what it uses, by name, and never sees the lock service: ``reads``
    (an autocommit engine for its reads), ``run`` (runs a function in a retried
    write transaction), ``clock`` and ``metrics``. What a place in line tries is
    the ``attempt`` given to ``wait``.
    """

    def __init__(
        self,
        *,
        reads: Engine,
        run: Callable[[Callable[[Any], Any]], Any],
        clock: LineClock,
        metrics: NoMetrics,
        max_waiters: int,
        max_waiters_per_token: int = 0,
        poll_interval: float,
        listen_url: str | None,
        listen: bool = True,
    ):
        self._reads = reads
        self._run = run
        self._clock = clock
        self.metrics = metrics
        engine = reads
        self.dialect = engine.dialect.name
        self.max_waiters = max_waiters
        self.poll_interval = poll_interval
        self.wakeups = PROCESS_WAKEUPS
        self._doorbell = None
        database = engine.url.database
        if self.dialect == "sqlite" and database and database != ":memory:":
            db_file = Path(database)
            self._doorbell = db_file.with_name(f".{db_file.name}.waiters")
        self._slots = threading.BoundedSemaphore(max_waiters) if max_waiters else None
        # Places in line per token in this worker (``max_waiters_per_token``).
        self.max_waiters_per_token = max_waiters_per_token
        self._per_token: dict[str | None, int] = {}
        self._per_token_lock = threading.Lock()
        self._url = engine.url
        # This queue's background threads (see ``stop``), started by the first
        # waiter of this process (a forked child starts its own).
        self._background_lock = threading.Lock()
        self._background_pid = os.getpid()
        self._listener: NotificationListener | None = None
        self._bell: HostDoorbell | None = None
        self._bell_failed = False
        self._finalizers: list[weakref.finalize] = []
        self._notifies = self.dialect == "postgresql"
        self._listens = self._notifies and listen
        url = make_url(listen_url) if listen_url else engine.url
        self._listen_url = url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        waiter = bindparam("waiter", type_=BigInteger())
        self._leave = delete(waiters).where(waiters.c.id == waiter)
        # The payload names the head of the line, so only its process wakes it.
        self._notify = text(
            "SELECT pg_notify(:channel, :resource || coalesce(chr(10) || ("
            "SELECT min(id) FROM lock_waiters WHERE resource = :resource"
            " AND deadline > clock_timestamp())::text, ''))"
        )
        self._peek = {
            given: self._peek_statement(
                bindparam("now", type_=UTCDateTime()) if given else clock.server_now
            )
            for given in ((True, False) if clock.server_now is not None else (True,))
        }

    def _peek_statement(self, now):
        waiter = bindparam("waiter", type_=BigInteger())
        resource = bindparam("resource")
        holder = select(locks.c.owner, locks.c.expires_at).where(
            locks.c.resource == resource
        )
        return select(
            now.label("now"),
            holder.with_only_columns(locks.c.owner).scalar_subquery().label("owner"),
            holder.with_only_columns(locks.c.expires_at)
            .scalar_subquery()
            .label("expires_at"),
            select(func.count())
            .select_from(waiters)
            .where(
                waiters.c.resource == resource,
                waiters.c.deadline > now,
                waiters.c.id < waiter,
            )
            .scalar_subquery()
            .label("ahead"),
        )

    # -- background threads ----------------------------------------------

    def _forget_if_forked(self) -> None:
        """In a forked child the parent's threads do not exist and its listener
        connection is not ours to close: drop them unseen. Holds the lock."""
        if self._background_pid == os.getpid():
            return
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers = []
        self._listener, self._bell, self._bell_failed = None, None, False
        self._background_pid = os.getpid()

    def _own(self, worker: NotificationListener | HostDoorbell) -> None:
        """Stop ``worker`` with this queue: when it is stopped, collected, or the
        interpreter exits. Holds the lock."""
        self._finalizers.append(weakref.finalize(self, worker.stop))
        _running.add(self)

    def _listener_for_waiting(self) -> NotificationListener | None:
        if not self._listens:
            return None
        with self._background_lock:
            self._forget_if_forked()
            if self._listener is None:
                self._listener = NotificationListener(self._listen_url, self.wakeups)
                self._own(self._listener)
            return self._listener

    def _ring_for_waiting(self) -> None:
        if self._doorbell is None:
            return
        with self._background_lock:
            self._forget_if_forked()
            if self._bell is None and not self._bell_failed:
                try:
                    self._bell = HostDoorbell(self._doorbell, self.wakeups)
                except OSError as exc:
                    log.warning("no doorbell for waiters (polling instead): %s", exc)
                    self._bell_failed = True
                    return
                self._own(self._bell)

    def start_wakers(self) -> NotificationListener | None:
        """Start what wakes this process's waiters, if need be: PostgreSQL's
        listener (returned; None elsewhere), SQLite's doorbell."""
        listener = self._listener_for_waiting()
        self._ring_for_waiting()
        return listener

    def listener(self) -> NotificationListener | None:
        """This process's listener, started if need be (None off PostgreSQL)."""
        return self._listener_for_waiting()

    def threads(self) -> list[threading.Thread]:
        """This queue's background threads that are running."""
        with self._background_lock:
            found = [w.thread for w in (self._listener, self._bell) if w is not None]
        return [thread for thread in found if thread.is_alive()]

    def stop(self) -> None:
        """Stop the listener (closing its connection) and the doorbell, and wait
        for their threads. Waiting requests carry on by polling; the next waiter
        starts them again."""
        with self._background_lock:
            self._forget_if_forked()
            finalizers, self._finalizers = self._finalizers, []
            self._listener, self._bell = None, None
            _running.discard(self)
        for finalizer in finalizers:
            finalizer()

    def serves(self, url: str) -> bool:
        """Whether this queue works on the database of ``url``."""
        other = make_url(url)
        return (self._url.host, self._url.port, self._url.database) == (
            other.host,
            other.port,
            other.database,
        )

    # -- rows --------------------------------------------------------------

    def join(
        self,
        resource: str,
        owner: str,
        token: str | None,
        wait: float,
        place: int | None = None,
        *,
        mode: str,
        limit: int,
        slack: timedelta = DEADLINE_SLACK,
        own: bool = False,
    ) -> int:
        """Add a waiter at the end of ``resource``'s line; returns its place (id).
        ``place``: a place kept for this (resource, owner, token), taken back
        with the new deadline if it is still live; else (lapsed, another's, 0)
        the waiter joins at the end. ``own``: ``place`` is the request's own,
        never left (a rejoin): taken back even if the request ran late.
        ``mode`` and ``limit``: what the acquire asks for, written by the
        statement that enqueues (the line shows them and the grant order reads
        them). Required: a default would record an exclusive single wait for
        a caller that forgot to say.

        The same transaction drops the resource's rows whose deadline has passed
        (left by requests of app instances that died)."""
        now = self._clock.now()
        deadline = now + timedelta(seconds=wait) + slack

        spared = place if own and place else 0  # ids start at 1: 0 spares none

        def work(conn):
            if conn.dialect.name in ("mariadb", "mysql"):
                conn.execute(
                    _SWEEP_LINE_BY_ITS_INDEX,
                    {"resource": resource, "now": now, "spared": spared},
                )
            else:
                conn.execute(
                    delete(waiters).where(
                        waiters.c.resource == resource,
                        waiters.c.deadline <= now,
                        waiters.c.id != spared,
                    )
                )
            if place:
                kept = conn.execute(
                    update(waiters)
                    .where(
                        waiters.c.id == place,
                        waiters.c.resource == resource,
                        waiters.c.owner == owner,
                        waiters.c.token == token
                        if token is not None
                        else waiters.c.token.is_(None),
                    )
                    .values(deadline=deadline, mode=mode, holder_limit=limit)
                )
                if kept.rowcount == 1:
                    return place
            result = conn.execute(
                insert(waiters).values(
                    resource=resource,
                    owner=owner,
                    token=token,
                    enqueued_at=now,
                    deadline=deadline,
                    mode=mode,
                    holder_limit=limit,
                )
            )
            return result.inserted_primary_key[0]

        return self._run(work)

    def leave(self, waiter_id: int, resource: str) -> None:
        """Take a waiter out of line; the next in line may be free to go now."""

        def work(conn):
            conn.execute(self._leave, {"waiter": waiter_id})
            if self._notifies:
                conn.execute(self._notify, {"channel": CHANNEL, "resource": resource})

        self._run(work)
        if not self._notifies:
            self._ring(resource)

    def remove_token(self, token: str) -> list[str]:
        """Take every place in line of ``token`` (revoked) out; returns the
        resources whose lines changed, whose next waiters are woken. The
        requests themselves find the token ended at their next look."""

        def work(conn):
            found = conn.scalars(
                select(waiters.c.resource).where(waiters.c.token == token).distinct()
            ).all()
            if found:
                conn.execute(delete(waiters).where(waiters.c.token == token))
                if self._notifies:
                    for resource in found:
                        conn.execute(
                            self._notify, {"channel": CHANNEL, "resource": resource}
                        )
            return found

        resources = self._run(work)
        if not self._notifies:
            for resource in resources:
                self._ring(resource)
        return resources

    def line(self, resource: str) -> list[Waiter]:
        """Who waits for ``resource``, first in line first."""
        now = self._clock.now()
        query = (
            select(waiters)
            .where(waiters.c.resource == resource, waiters.c.deadline > now)
            .order_by(waiters.c.id)
        )
        with self._reads.connect() as conn:
            rows = conn.execute(query).all()
        return [
            Waiter(
                r.id,
                r.resource,
                r.owner,
                r.token,
                r.enqueued_at,
                r.deadline,
                r.mode,
                r.holder_limit,
            )
            for r in rows
        ]

    def version(self, at: datetime | None = None) -> tuple[int, int | None]:
        """(live waiters, newest place in line): changes whenever the lines do;
        ``at``: the instant the page asking judges everything at."""
        now = at if at is not None else self._clock.now()
        query = select(func.count(), func.max(waiters.c.id)).where(
            waiters.c.deadline > now
        )
        with self._reads.connect() as conn:
            count, newest = conn.execute(query).one()
        return count, newest

    def queued(self) -> int:
        """Live waiters of every resource."""
        now = self._clock.now()
        query = select(func.count()).where(waiters.c.deadline > now)
        with self._reads.connect() as conn:
            return conn.scalar(query)

    def notify_released(self, resource: str, waiting: int) -> None:
        """A release or force-release left ``waiting`` waiters: wake the head."""
        if waiting <= 0:
            return
        if not self._notifies:
            self._ring(resource)
            return
        try:
            with self._reads.connect() as conn:
                conn.execute(self._notify, {"channel": CHANNEL, "resource": resource})
        except DBAPIError as exc:
            # The release itself committed; the waiters find it by their timers.
            log.warning("could not NOTIFY the waiters of %r: %s", resource, exc)

    def _ring(self, resource: str) -> None:
        self.wakeups.wake(resource)
        if self._doorbell is not None:
            ring_host(self._doorbell, resource)

    # -- waiting -----------------------------------------------------------

    def wait(
        self,
        attempt: Callable[[int | None], AcquireResult],
        *,
        resource: str,
        owner: str,
        token: str | None,
        seconds: float,
        still_wanted: Callable[[], bool],
        token_live: Callable[[], bool],
        place: int | None = None,
        rejoin: bool = False,
        mode: str,
        limit: int,
    ) -> AcquireResult:
        """Wait in line up to ``seconds``; ``attempt(waiter_id)`` is the service's
        acquire for one place in line, of ``mode`` and ``limit`` (recorded with
        the place). ``token_live()`` is asked before every
        attempt and at every look at the client (``CLIENT_CHECK_INTERVAL``): a
        token that ended leaves the line at once. ``place``: the request asks
        for a kept place if it is turned away (0), or presents one (see the
        module's doc): it waits from that place. ``rejoin``: the client's wait
        goes on past this request's, so a wait that runs out keeps its place
        (the result's ``place``) for the next request rather than leaving.

        :raise WaitersFull: this worker already has ``max_waiters`` requests
            waiting (with ``place`` given: from the place it kept, unless that
            was granted at once).
        :raise TokenEnded: the token was revoked or expired while in line.
        """
        wait = seconds
        refusal = self._take_seat(token)
        if refusal is not None:
            return self._turned_away(
                refusal, attempt, resource, owner, token, place, (mode, limit)
            )
        started = time.monotonic()
        metrics = self.metrics
        metrics.wait_started()
        outcome = "timeout"
        try:
            listener = self.start_wakers()
            with self.wakeups.subscribe(resource) as woken:
                waiter_id = woken.waiter_id = self.join(
                    resource, owner, token, wait, place, mode=mode, limit=limit
                )
                result = None
                kept = None
                try:
                    result = self._wait_in_line(
                        _checked(attempt, token, token_live),
                        resource,
                        waiter_id,
                        woken,
                        started + wait,
                        _checked(still_wanted, token, token_live),
                        listener,
                    )
                finally:
                    if result is not None and result.acquired:
                        outcome = "granted"  # the grant took the row out of line
                    elif result is not None and rejoin and still_wanted():
                        # Ran out, and its client asks again at once: it waits
                        # on from here, not behind those who came after it.
                        kept = self.join(
                            resource,
                            owner,
                            token,
                            PLACE_KEPT_FOR,
                            waiter_id,
                            mode=mode,
                            limit=limit,
                            slack=timedelta(0),
                            own=True,
                        )
                    else:
                        if not still_wanted():
                            outcome = "gone"
                        self.leave(waiter_id, resource)
            return result if kept is None else replace(result, place=kept)
        finally:
            metrics.wait_ended(outcome, time.monotonic() - started)
            self._give_seat(token)

    @contextmanager
    def seat(self, token: str | None) -> Iterator[dict[str, str]]:
        """A seat in this worker's waiting room for a request of ``token``
        that waits in several lines (a set: one request, one seat, whatever
        its members), against the caps a single waiter's ``wait`` takes its
        seat under, and counted in the same metrics. Yields {"outcome": …},
        which the caller sets ("granted"; "timeout" unless set).

        :raise WaitersFull: the room, or the token's share of it, is full."""
        refusal = self._take_seat(token)
        if refusal is not None:
            raise refusal
        started = time.monotonic()
        self.metrics.wait_started()
        ended = {"outcome": "timeout"}
        try:
            yield ended
        finally:
            self.metrics.wait_ended(ended["outcome"], time.monotonic() - started)
            self._give_seat(token)

    def _take_seat(self, token: str | None) -> WaitersFull | None:
        """Take a seat in the room and one of ``token``'s share; else the
        refusal (counted), and nothing taken."""
        if self._slots is None or not self._slots.acquire(blocking=False):
            self.metrics.wait_refused("worker_full")
            return WaitersFull(self.max_waiters)
        if not self._take_token_share(token):
            self._slots.release()
            self.metrics.wait_refused("token_share")
            return WaitersFull(self.max_waiters_per_token, token=token)
        return None

    def _give_seat(self, token: str | None) -> None:
        self._give_token_share(token)
        if self._slots is not None:
            self._slots.release()

    def _turned_away(
        self,
        refusal: WaitersFull,
        attempt: Callable[[int | None], AcquireResult],
        resource: str,
        owner: str,
        token: str | None,
        place: int | None,
        asked: tuple[str, int],
    ) -> AcquireResult:
        """A request the room turned away: with ``place`` None, ``refusal``; else
        its place kept (or taken back) for ``PLACE_KEPT_FOR`` seconds, one look
        from it (granted when it is first and the lock is free), and
        ``refusal`` naming it. ``asked``: its (mode, limit)."""
        if place is None:
            raise refusal
        mode, limit = asked
        kept = self.join(
            resource,
            owner,
            token,
            PLACE_KEPT_FOR,
            place,
            mode=mode,
            limit=limit,
            slack=timedelta(0),
        )
        try:
            if self._notifies:
                result = attempt(kept)
            else:
                result = self._look_then_attempt(
                    attempt, resource, kept, AcquireResult(False, None)
                )
        except BaseException:
            self.leave(kept, resource)
            raise
        if result.acquired:
            return result  # the grant took the place out of line
        refusal.place = kept
        raise refusal

    def _take_token_share(self, token: str | None) -> bool:
        """One more place for ``token``, unless it holds its share already."""
        with self._per_token_lock:
            held = self._per_token.get(token, 0)
            if self.max_waiters_per_token and held >= self.max_waiters_per_token:
                return False
            self._per_token[token] = held + 1
            return True

    def _give_token_share(self, token: str | None) -> None:
        with self._per_token_lock:
            held = self._per_token.pop(token, 1) - 1
            if held > 0:
                self._per_token[token] = held

    def _wait_in_line(
        self, attempt, resource, waiter_id, woken, deadline, still_wanted, listener
    ) -> AcquireResult:
        result = attempt(waiter_id)
        woken_at = None
        while not result.acquired:
            now = time.monotonic()
            if now >= deadline or not still_wanted():
                return result
            pause = self.pause(result, listener)
            next_look = now + pause
            while True:
                timeout = min(next_look, deadline) - time.monotonic()
                if timeout <= 0:
                    woken_at = time.monotonic()
                    break
                if woken.event.wait(min(timeout, CLIENT_CHECK_INTERVAL)):
                    woken_at = time.monotonic()
                    break
                if not still_wanted():
                    return result
            woken.event.clear()
            if self._notifies:
                result = attempt(waiter_id)
            else:
                result = self._look_then_attempt(attempt, resource, waiter_id, result)
        if woken_at is not None:
            self.metrics.handed_over(time.monotonic() - woken_at)
        return result

    def pause(self, refusal: AcquireResult | SetResult, listener) -> float:
        """How long to sleep after ``refusal`` unless woken (``listener``:
        ``start_wakers``' answer)."""
        holder = refusal.lock
        until_expiry = (
            holder.ttl_remaining + EXPIRY_MARGIN
            if holder is not None and holder.ttl_remaining > 0
            else None
        )
        if listener is not None and listener.healthy and until_expiry is not None:
            return min(until_expiry, NOTIFY_SAFETY_INTERVAL)
        if until_expiry is not None:
            return min(until_expiry, self.poll_interval)
        return self.poll_interval

    def _look_then_attempt(self, attempt, resource, waiter_id, refusal):
        """SQLite, MariaDB: a plain read first; the (writing) attempt only when
        this waiter is first in line and the lock is free or expired."""
        now = self._clock.given()
        params = {"resource": resource, "waiter": waiter_id}
        if now is not None:
            params["now"] = now
        with self._reads.connect() as conn:
            seen = conn.execute(self._peek[now is not None], params).one()
        now = seen.now
        free = seen.owner is None or seen.expires_at is None or seen.expires_at <= now
        if seen.ahead == 0 and free:
            return attempt(waiter_id)
        if not free and refusal.lock is not None and seen.owner == refusal.lock.owner:
            return _with_remaining(refusal, (seen.expires_at - now).total_seconds())
        return AcquireResult(False, None, waiters=refusal.waiters)


# The queues of this process with background threads running: an index for
# ``stop_background`` only (each queue owns its threads; weak, so it keeps none).
_running: weakref.WeakSet[WaitQueue] = weakref.WeakSet()


def stop_background(url: str | None = None) -> None:
    """Stop the background threads of every queue of this process, or of those on
    the database of ``url`` (before that database is dropped)."""
    for queue in list(_running):
        if url is None or queue.serves(url):
            queue.stop()


def _checked(step: Callable, token: str | None, token_live: Callable[[], bool]):
    """``step`` run only while ``token_live()``; else ``TokenEnded``."""

    def run(*args):
        if not token_live():
            raise TokenEnded(token)
        return step(*args)

    return run


def _with_remaining(refusal: AcquireResult, remaining: float) -> AcquireResult:
    lock = replace(refusal.lock, ttl_remaining=max(remaining, 0.0))
    return AcquireResult(False, lock, waiters=refusal.waiters)
