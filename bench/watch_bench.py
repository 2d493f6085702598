"""Event-to-client latency: a followed stream against polling ``/events`` every second.

One server (Werkzeug's threaded server in this process: the figure is delivery
latency, not throughput) on each database. A writer grants one lock at a time at
irregular moments; one client follows ``GET /api/v1/events?follow=true``, another
asks ``GET /api/v1/events`` once a second, both in threads of their own. The
latency of an event is the moment a client first sees it less the moment its
grant returned to the writer. Both clients watch the same grants in the same run.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from pathlib import Path

import httpx

from bench.measure import Comparison

POLL_INTERVAL = 1.0


def bench_watch(databases, workdir: Path, events: int, log) -> list[Comparison]:
    return [
        _bench_watch(backend, database.url, workdir, events, log)
        for backend, database in databases.items()
    ]


def _bench_watch(backend: str, url: str, workdir: Path, events: int, log):
    from werkzeug.serving import make_server

    from app import create_app
    from app.auth.service import create_token
    from app.extensions import lock_service

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(workdir / f"instance-watch-{backend}"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )
    with app.app_context():
        token = create_token(f"bench-watch-{backend}")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/api/v1"
    headers = {"Authorization": f"Bearer {token}"}
    prefix = f"watch-bench-{backend}:"
    granted: dict[str, float] = {}
    streamed: dict[str, float] = {}
    polled: dict[str, float] = {}
    stop = threading.Event()
    opened = threading.Event()

    def follow() -> None:
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "GET",
                f"{base}/events",
                params={"follow": "true", "prefix": prefix},
                headers=headers,
            ) as response,
        ):
            for line in response.iter_lines():
                opened.set()
                if line.startswith("data: "):
                    resource = json.loads(line[6:])["resource"]
                    streamed.setdefault(resource, time.monotonic())
                if stop.is_set() and len(streamed) >= len(granted):
                    return

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set() or len(polled) < len(granted):
                page = client.get(
                    f"{base}/events", params={"prefix": prefix}, headers=headers
                ).json()
                now = time.monotonic()
                for event in page["events"]:
                    polled.setdefault(event["resource"], now)
                time.sleep(POLL_INTERVAL)

    log(f"watch: {events} grants followed and polled on {backend}")
    readers = [threading.Thread(target=follow), threading.Thread(target=poll)]
    for reader in readers:
        reader.start()
    opened.wait(10)
    rng = random.Random(7)
    with app.app_context():
        service = lock_service()
        for n in range(events):
            time.sleep(rng.uniform(0.1, 0.6))  # moments unrelated to the poll
            resource = f"{prefix}{n}"
            service.acquire(resource, "bench", ttl=60)
            granted[resource] = time.monotonic()
    stop.set()
    for reader in readers:
        reader.join(30)
    server.shutdown()
    with app.app_context():
        from app.extensions import db

        db.engine.dispose()

    def latencies(seen: dict[str, float]) -> list[float]:
        return [seen[r] - t for r, t in granted.items() if r in seen]

    stream, polling = latencies(streamed), latencies(polled)
    value, baseline = statistics.median(stream), statistics.median(polling)
    return Comparison(
        name=f"watch_delivery_vs_poll_{backend}",
        value=round(value * 1000, 1),
        baseline=round(baseline * 1000, 1),
        ratio=value / baseline,
        unit="ms (median event-to-client latency; below 1 the stream is sooner)",
        baseline_name=f"GET /events every {POLL_INTERVAL:g} s",
        detail={
            "events": events,
            "stream_max_ms": round(max(stream) * 1000, 1),
            "poll_max_ms": round(max(polling) * 1000, 1),
            "missed_by_stream": len(granted) - len(stream),
        },
    )
