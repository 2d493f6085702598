"""``session_heartbeat_vs_renew_each_100``: the requests a worker holding 100
locks sends per renewal interval with a session (one heartbeat renews them all)
against renewing each lock (``client.lock()``, one renew per lock per interval).

Measured, not computed: the worker client (``LockClient``) against a server in
this process (Werkzeug's threaded server; the figure is a request count, not a
throughput), whose requests a WSGI wrapper counts by kind over the same number
of intervals on both sides, after every lock was granted. Target: at most 0.02.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path

from bench.measure import Comparison

LOCKS = 100
INTERVAL = 0.5  # seconds between renewals (heartbeats), both sides
# The ttl of the session and of each lock: what is counted is one heartbeat or
# renewal per INTERVAL, whatever the ttl; a long one keeps a loaded machine
# (100 renewals queued on one test server) from losing a lock mid-count.
HELD_FOR = 60 * INTERVAL


class Counting:
    """WSGI middleware counting requests by (method, first path part)."""

    def __init__(self, app):
        self.app = app
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        parts = environ.get("PATH_INFO", "").split("/")
        kind = parts[3] if len(parts) > 3 else ""
        with self._lock:
            self.counts[environ["REQUEST_METHOD"], kind] += 1
        return self.app(environ, start_response)

    def take(self, method: str, kind: str) -> int:
        with self._lock:
            return self.counts.pop((method, kind), 0)


def bench_sessions(databases, workdir: Path, intervals: int, log) -> list[Comparison]:
    backend = "postgresql" if "postgresql" in databases else next(iter(databases))
    return [_bench(backend, databases[backend].url, workdir, intervals, log)]


def _bench(backend: str, url: str, workdir: Path, intervals: int, log) -> Comparison:
    from lockkeeper_client import LockClient
    from werkzeug.serving import make_server

    from app import create_app
    from app.auth.service import create_token

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(workdir / f"instance-sessions-{backend}"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )
    with app.app_context():
        token = create_token(f"bench-sessions-{backend}", max_locks=10 * LOCKS)
    counting = Counting(app.wsgi_app)
    app.wsgi_app = counting
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    seconds = intervals * INTERVAL
    try:
        with LockClient(base, token, timeout=30) as client:
            with client.session(ttl=HELD_FOR, heartbeat_every=INTERVAL) as s:
                with contextlib.ExitStack() as stack:
                    for n in range(LOCKS):
                        stack.enter_context(s.lock(f"bench-session:{n}"))
                    counting.take("PATCH", "sessions")
                    time.sleep(seconds)
                    heartbeats = counting.take("PATCH", "sessions")
                    stack.pop_all()  # the session's end releases them
            with contextlib.ExitStack() as stack:
                for n in range(LOCKS):
                    stack.enter_context(
                        client.lock(
                            f"bench-renew:{n}", ttl=HELD_FOR, renew_every=INTERVAL
                        )
                    )
                counting.take("PATCH", "locks")
                time.sleep(seconds)
                renewals = counting.take("PATCH", "locks")
    finally:
        server.shutdown()
        server.server_close()
        with app.app_context():
            from app.extensions import db

            db.engine.dispose()
    value = heartbeats / intervals
    baseline = renewals / intervals
    log(
        f"sessions on {backend}: {value:g} heartbeats per interval against "
        f"{baseline:g} renewals per interval for {LOCKS} locks"
    )
    return Comparison(
        name="session_heartbeat_vs_renew_each_100",
        value=value,
        baseline=baseline,
        ratio=value / baseline if baseline else float("inf"),
        unit=f"requests per {INTERVAL:g} s interval for {LOCKS} locks (below 1: "
        "fewer; target at most 0.02)",
        baseline_name="renewing each lock (client.lock(), renew_every = interval)",
        detail={"backend": backend, "intervals": intervals, "locks": LOCKS},
    )
