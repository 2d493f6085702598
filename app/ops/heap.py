"""A server process's long-lived objects, kept out of the collector's full passes.

CPython's full (oldest-generation) collection walks every tracked object. A
loaded app holds ~130 000 of them (modules, the app, SQLAlchemy's metadata and
statement caches, the compiled templates), all alive for the process's life, so
every full pass, a few a minute under load, stalled whichever request ran at
that moment for 80-100 ms (the dashboard's p95 at 100 000 locks, see
docs/benchmarks-audit.md). Frozen once the app is loaded, they are skipped: the
pass then walks what requests made since (~12 ms).
"""

from __future__ import annotations

import gc


def freeze_loaded_app() -> int:
    """Collect what loading left as garbage, then freeze every object alive now
    (``gc.freeze``): they are never collected again, which is what they are
    (freezing garbage would keep it for good, hence the collection first).
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
