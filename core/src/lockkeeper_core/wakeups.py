"""Waking the requests that wait in line: in this process (``Wakeups``), in the
other processes of this host (SQLite's doorbell, ``HostDoorbell``), and through
PostgreSQL's NOTIFY (``NotificationListener``). The line (``lockkeeper_core.queue``)
owns the background threads; this module only rings and listens.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import select as select_module
import socket
import threading
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CHANNEL = "lockkeeper_waiters"
# Inserts into lock_events while a stream follows the log (migration 0010); the
# listener rings ``EVENTS_WAKEUP``, a key no resource name can be.
EVENTS_CHANNEL = "lockkeeper_events"
EVENTS_WAKEUP = "\0events"
# The listener's connection shows under this name in pg_stat_activity.
LISTENER_APPLICATION_NAME = "lockkeeper-listen"
# How long stopping waits for a background thread (a listener in the middle of
# connecting ends at its connect timeout).
STOP_TIMEOUT = 10.0
# The listener only reads, so a server that vanished without closing the TCP
# connection (a failed-over host, a dropped route) is noticed only by keepalive
# probes: after about idle + interval x count seconds it reconnects.
LISTENER_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


# -- waking waiting requests in this process ------------------------------------


class Subscription:
    """One waiting request's doorbell: ``event`` is set to make it look again."""

    __slots__ = ("event", "waiter_id")

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()
        self.waiter_id: int | None = None  # its place in line, once it has one


class Wakeups:
    """The waiting requests of this process, by resource: ``wake(resource)`` rings
    each one's doorbell, ``wake(resource, head)`` only the head's (the others
    would only be refused). Fed by releases in this process, by the PostgreSQL
    listener, and on SQLite by the other processes of the host (``HostDoorbell``).
    One per process: every app of the process shares it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_resource: dict[str, set[Subscription]] = {}

    @contextmanager
    def subscribe(self, resource: str, event: threading.Event | None = None):
        subscription = Subscription(event)
        with self._lock:
            self._by_resource.setdefault(resource, set()).add(subscription)
        try:
            yield subscription
        finally:
            with self._lock:
                found = self._by_resource.get(resource)
                if found is not None:
                    found.discard(subscription)
                    if not found:
                        del self._by_resource[resource]

    @contextmanager
    def subscribe_all(self, resources: list[str]):
        """A request in several lines at once (a set): {resource: subscription},
        each with its own place (``waiter_id``), all ringing one event: a
        release of any of them that names the request's place there as the
        head (or names none) wakes it."""
        event = threading.Event()
        with contextlib.ExitStack() as stack:
            yield {
                resource: stack.enter_context(self.subscribe(resource, event))
                for resource in resources
            }

    def wake(self, resource: str, head: int | None = None) -> None:
        with self._lock:
            found = list(self._by_resource.get(resource, ()))
        for subscription in found:
            if head is None or subscription.waiter_id in (None, head):
                subscription.event.set()

    def wake_all(self) -> None:
        with self._lock:
            found = [s for subs in self._by_resource.values() for s in subs]
        for subscription in found:
            subscription.event.set()

    def waiting(self) -> int:
        with self._lock:
            return sum(len(found) for found in self._by_resource.values())


PROCESS_WAKEUPS = Wakeups()


def wake_message(payload: str, wakeups: Wakeups) -> None:
    """``resource`` or ``resource\nhead-id``, as a release announces it."""
    resource, _, head = payload.partition("\n")
    wakeups.wake(resource, int(head) if head.isdigit() else None)


class HostDoorbell:
    """SQLite: the processes of one host ring each other's waiters.

    Every app that has waited binds a Unix datagram socket (Linux abstract
    namespace, so no path length limit and nothing left on disk) and leaves a
    marker file of the same name in a folder next to the database file; a release
    that leaves waiters sends the resource to every socket marked there. The
    marker of a process that died is removed by the first sender that finds no
    one listening. Without a doorbell the waiters still find their turn by polling.
    """

    def __init__(self, folder: Path, wakeups: Wakeups):
        folder.mkdir(mode=0o700, exist_ok=True)
        self.folder = folder
        self.name = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._address = _doorbell_address(folder, self.name)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(self._address)
        (folder / self.name).touch(mode=0o600)
        self.wakeups = wakeups
        self._stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="lockkeeper-doorbell", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                payload = self._socket.recv(1024)
            except OSError:
                return
            if self._stopped.is_set():
                return
            wake_message(payload.decode("utf-8", "replace"), self.wakeups)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Take the marker down, end the thread, close the socket."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            (self.folder / self.name).unlink()
        # Closing a socket does not wake a thread blocked in recv(): a datagram does.
        with (
            contextlib.suppress(OSError),
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as poke,
        ):
            poke.settimeout(1.0)
            poke.sendto(b"", self._address)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        if not self.thread.is_alive():
            self._socket.close()


def _doorbell_address(folder: Path, name: str) -> str:
    digest = hashlib.blake2b(str(folder).encode(), digest_size=8).hexdigest()
    return f"\0lockkeeper:{digest}:{name}"


def ring_host(folder: Path, payload: str) -> None:
    """Send ``payload`` to every waiting process of the host (see HostDoorbell)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    data = payload.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for name in names:
            try:
                sender.sendto(data, _doorbell_address(folder, name))
            except ConnectionRefusedError:
                with contextlib.suppress(OSError):
                    (folder / name).unlink()  # its process is gone
            except OSError:
                pass  # a full queue: that process is awake anyway


class NotificationListener:
    """One dedicated PostgreSQL connection that LISTENs for releases.

    It is not taken from the pool (it stays in LISTEN for good) and must reach
    PostgreSQL directly or through a session-pooling entry: NOTIFY does not pass a
    transaction-pooling PgBouncer. While it is down, ``healthy`` is false and the
    waiters poll; after a reconnect every waiter looks once (a release may have
    been missed). ``stop()`` closes the connection and joins the thread: a pipe
    wakes the thread out of its wait on the socket.
    """

    def __init__(self, conninfo: str, wakeups: Wakeups):
        self.conninfo = conninfo
        self.wakeups = wakeups
        self.healthy = False
        self.backend_pid: int | None = None
        self._stopped = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self.thread = threading.Thread(
            target=self._run, name="lockkeeper-listen", daemon=True
        )
        self.thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")
        if threading.current_thread() is self.thread:
            return
        self.thread.join(timeout)
        if not self.thread.is_alive():
            for fd in (self._wake_read, self._wake_write):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopped.is_set():
            try:
                self._listen()
                backoff = 0.1
            except Exception as exc:  # noqa: BLE001 - reconnect on any failure
                if not self._stopped.is_set():
                    log.warning("waiter listener lost its connection: %s", exc)
            self.healthy = False
            self.backend_pid = None
            self.wakeups.wake_all()
            self._stopped.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _listen(self) -> None:
        import psycopg

        with psycopg.connect(
            self.conninfo,
            autocommit=True,
            application_name=LISTENER_APPLICATION_NAME,
            **LISTENER_KEEPALIVES,
        ) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            conn.execute(f"LISTEN {EVENTS_CHANNEL}")
            self.backend_pid = conn.info.backend_pid
            self.healthy = True
            self.wakeups.wake_all()
            while not self._stopped.is_set():
                readable, _, _ = select_module.select(
                    [conn.fileno(), self._wake_read], [], [], 5.0
                )
                if self._stopped.is_set():
                    return  # leaving the block closes the connection
                if conn.fileno() in readable:
                    # A closed connection reads as readable too: this raises then.
                    for notify in conn.notifies(timeout=0):
                        if notify.channel == EVENTS_CHANNEL:
                            self.wakeups.wake(EVENTS_WAKEUP)
                        else:
                            wake_message(notify.payload, self.wakeups)
