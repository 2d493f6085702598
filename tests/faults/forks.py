"""Worker processes forked from a server that imported their code once.

A run starts its workers as fresh interpreters ("spawn"), each importing the
worker client (httpx) or the guard (SQLAlchemy) again: about 0.35 s of CPU
each, 8 s for the 24 workers of a fault run, on a machine the suite keeps
busy. With "forkserver" and the worker's module preloaded, one process imports
it and each worker is a fork of that process: its own interpreter state as
with spawn (no threads, sockets or engines inherited from the test process
that starts it), without the imports.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

# Every worker module of the harness: a test process starts one fork server,
# for whichever run comes first, and it serves them all.
WORKER_MODULES = ["tests.faults.worker", "tests.faults.fenced"]


def worker_context() -> BaseContext:
    """A multiprocessing context whose processes fork from a server with the
    ``WORKER_MODULES`` imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_MODULES)
    return context
