"""A free TCP port on loopback, for a server a test or a benchmark starts."""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
# A share of the range narrower than this is no share: pick from all of it.
NARROWEST_SHARE = 500
# Not the ``random`` module's generator: a test runner may seed it alike in
# every parallel worker, and they would pick the same ports in turn.
_pick = random.SystemRandom()
# Every port this process handed out: a port is bound only some time after it
# is picked (a cluster picks a dozen before its servers start, and a Galera
# node binds its IST port only when it rejoins), and until then the check
# below finds it free, and would hand it out again.
_handed_out: set[int] = set()
_handing_out = threading.Lock()


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _share(low: int, top: int) -> tuple[int, int]:
    """The part of ``low``..``top`` this process picks from: under pytest-xdist
    each worker (``gw0``, ``gw1``, ...) has its own, so that two of them never
    pick the same port for servers they both start later."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw"))
    except ValueError:
        return low, top
    width = (top - low) // max(count, 1)
    if count <= 1 or width < NARROWEST_SHARE:
        return low, top
    start = low + (index % count) * width
    return start, start + width


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to, below the kernel's
    ephemeral range, and that this process has not handed out before.

    A port the kernel picks (a bind to port 0) comes from the range it also
    gives every outgoing connection, and the test suite's database clients
    open thousands: one of them can take the port between this pick and the
    server's bind, which then fails ("address already in use"). Below the
    range only another pick like this one can take it: never one of this
    process, nor (``_share``) one of another test worker.
    """
    top = _ephemeral_start()
    if top - LOWEST_PORT < 1000:  # an unusual range: let the kernel pick
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    low, high = _share(LOWEST_PORT, top)
    with _handing_out:
        for _ in range(100):
            port = _pick.randrange(low, high)
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use (or bound on every address)
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port found in {low}-{high - 1}")
