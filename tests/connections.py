"""The suite's share of a database server's connections, bounded and known.

PostgreSQL refuses a connection past ``max_connections`` ("too many clients
already"), MariaDB past its own. Every pytest process on this machine (each
pytest-xdist worker, and any other test session meanwhile) draws the connections
its tests may hold at once from one budget per server, kept as slot files under
the system's temporary folder: a slot is taken by holding an advisory file lock
on it, so a process that dies gives its slots back with it.

The budget leaves ``ROOM_FOR_OTHER_CLIENTS`` of the server's connections to
clients that are not this suite (another developer's psql, a monitoring agent).
A test on a server database takes ``ORDINARY_SHARE`` slots for its whole run (its
app's pool, its waiting line's listener, its worker's own engines); a test that
opens more at once says how many with ``@pytest.mark.connections(N)``. A test
that cannot get its share waits for it, in arrival order, rather than failing.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from filelock import FileLock, Timeout
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from app.config import normalize_database_url

# Connections of the server left to clients other than this suite.
ROOM_FOR_OTHER_CLIENTS = 25
# What an ordinary test may hold at once: its app's connections, the waiting
# line's LISTEN connection, and its worker's engines on its private database.
ORDINARY_SHARE = 8
# How long a test waits for its share before it fails, naming what it waited for:
# a race holds its share for well under a minute.
WAIT_SECONDS = 600.0
POLL_SECONDS = 0.05


def server_limit(url: str) -> int:
    """The connections this server grants to ordinary (non-superuser) clients."""
    engine = create_engine(normalize_database_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                total = int(conn.scalar(text("SHOW max_connections")))
                reserved = int(conn.scalar(text("SHOW superuser_reserved_connections")))
                return total - reserved
            return int(conn.scalar(text("SELECT @@max_connections")))
    finally:
        engine.dispose()


class ConnectionBudget:
    """``size`` slots in ``folder``, shared by every test process here."""

    def __init__(self, folder: Path, size: int):
        self.folder = folder
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.size = size
        # Whoever holds the turnstile is the only one taking slots, so a large
        # share is not starved by a stream of small ones, and no two takers can
        # each hold half of what the other needs.
        self.turnstile = FileLock(str(self.folder / "turnstile.lock"))

    @classmethod
    def of_server(cls, url: str) -> ConnectionBudget:
        """The budget of the server at ``url``: what it grants ordinary clients,
        less the room left to others."""
        server = make_url(normalize_database_url(url))
        key = f"{server.get_backend_name()}-{server.host}-{server.port}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        size = server_limit(url) - ROOM_FOR_OTHER_CLIENTS
        if size < 4 * ORDINARY_SHARE:
            raise RuntimeError(
                f"{key} allows {size + ROOM_FOR_OTHER_CLIENTS} connections:"
                f" the suite needs {4 * ORDINARY_SHARE + ROOM_FOR_OTHER_CLIENTS}"
            )
        folder = Path(tempfile.gettempdir()) / f"lockkeeper-connections-{digest}"
        return cls(folder, size)

    @contextmanager
    def share(
        self, count: int, what: str, wait_seconds: float = WAIT_SECONDS
    ) -> Iterator[None]:
        """Hold ``count`` slots while the block runs; wait for them if taken."""
        if count > self.size:
            raise RuntimeError(
                f"{what} asks for {count} connections; the budget is {self.size}"
            )
        with ExitStack() as held:
            deadline = time.monotonic() + wait_seconds
            with self.turnstile.acquire(timeout=wait_seconds):
                taken = 0
                while taken < count:
                    for slot in range(self.size):
                        if taken == count:
                            break
                        lock = FileLock(str(self.folder / f"slot-{slot}.lock"))
                        try:
                            lock.acquire(timeout=0)
                        except Timeout:
                            continue
                        held.callback(lock.release)
                        taken += 1
                    if taken < count:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"{what}: {taken} of {count} connections free"
                                f" after {wait_seconds:.0f} s"
                            )
                        time.sleep(POLL_SECONDS)
            yield


_budgets: dict[str, ConnectionBudget | None] = {}


def budget_for(url: str) -> ConnectionBudget | None:
    """The server's budget, or None when the server does not answer (the test's
    own database fixture then skips it, or fails it under CI)."""
    if url not in _budgets:
        try:
            _budgets[url] = ConnectionBudget.of_server(url)
        except OperationalError:
            _budgets[url] = None
    return _budgets[url]
