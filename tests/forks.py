"""Child processes of the races and fault runs, forked from a server that
imported their code once.

A race or a run started its children as fresh interpreters ("spawn"), each
importing the app (Flask, SQLAlchemy, Alembic: about a second of CPU), the
worker client (httpx) or the guard again, on a machine the suite keeps busy:
the races alone started about 60 such children. With "forkserver" and these
modules preloaded, one process imports them and each child is a fork of that
process: its own interpreter state as with spawn (no threads, sockets or
engines inherited from the test process that starts it), without the imports.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

# What every child needs: a test process starts one fork server, for whichever
# race or run comes first, and it serves them all (a preload set later is not
# read), so the list names what any of them imports.
WORKER_MODULES = ["app.factory", "tests.faults.worker", "tests.faults.fenced"]


def worker_context() -> BaseContext:
    """A multiprocessing context whose processes fork from a server with the
    ``WORKER_MODULES`` imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_MODULES)
    return context
