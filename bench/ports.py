"""A free TCP port on loopback, for a server a test or a benchmark starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
# Not the ``random`` module's generator: a test runner may seed it alike in
# every parallel worker, and they would pick the same ports in turn.
_pick = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to, below the kernel's
    ephemeral range.

    A port the kernel picks (a bind to port 0) comes from the range it also
    gives every outgoing connection, and the test suite's database clients
    open thousands: one of them can take the port between this pick and the
    server's bind, which then fails ("address already in use"). Below the
    range only another pick like this one can take it, at random among some
    20,000 ports.
    """
    top = _ephemeral_start()
    if top - LOWEST_PORT < 1000:  # an unusual range: let the kernel pick
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    for _ in range(100):
        port = _pick.randrange(LOWEST_PORT, top)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or bound on every address)
        return port
    raise RuntimeError(f"no free port found in {LOWEST_PORT}-{top - 1}")
