"""32 clients on ONE resource: grants per second and the worst wait.

Each client loops: wait for the lock, hold it briefly, release it. "none" retries
a refused acquire at once (``LockClient.acquire`` in a loop); "backoff" is the
polling worker client (``with client.lock(...)`` with server-side waiting off),
which backs off exponentially with jitter, capped by the refusal's Retry-After;
"queue" is the worker client as shipped: it waits in the server's line
(``"wait"``), granted in order of arrival. The clients are threads spread over a
few processes (so the client side is not one GIL), all driven through
``lockkeeper_client.LockClient`` against a Lockkeeper gunicorn server (gthread, as many
threads per worker as ``app.ops.gunicorn_conf`` gives: 4 + the waiting room).

From the queue run:

- ``contention_worst_wait_vs_fifo_bound``: the worst wait of any client divided by
  (clients - 1) x the median time from one grant to the next: a fair line serves
  everyone within about (clients - 1) grants, so 1.0 is the ideal.
- ``worst_grants_to_others_while_waiting`` (in the detail): the same as a count,
  which load does not stretch: a fair line serves everyone within clients - 1
  grants to others; ``attempts_turned_away_by_a_full_room`` counts the 503s
  (a turned-away request has no place in line while its client polls).
- ``handoff_vs_round_trip``: the median time from a release's reply to the next
  holder's grant reply, divided by the median round trip of an uncontended
  acquire.
"""

from __future__ import annotations

import bisect
import multiprocessing
import statistics
import threading
import time
from functools import partial

from bench.measure import Comparison, Sample, alternate
from bench.servers import Server, ServerConfig, server_configs

CLIENTS = 32
PROCESSES = 4
HOLD_SECONDS = 0.01
TTL = 10.0
RESOURCE = "bench.contention"

_CTX = multiprocessing.get_context("fork")


def _client_loop(base_url, token, mode, index, start, end, out, lock) -> None:
    from lockkeeper_client import LockClient, LockNotAcquired

    client = LockClient(
        base_url, token, max_server_wait=30.0 if mode == "queue" else 0.0
    )
    attempts = 0
    turned_away = 0  # attempts that found the server's waiting room full
    acquire = client.acquire

    def counted_acquire(*args, **kwargs):
        nonlocal attempts, turned_away
        attempts += 1
        result = acquire(*args, **kwargs)
        turned_away += result.waiting_room_full
        return result

    client.acquire = counted_acquire  # type: ignore[method-assign]
    owner = f"client-{index}"
    waits: list[float] = []
    granted_at: list[float] = []
    released_at: list[float] = []
    unfinished = 0.0
    start.wait()
    try:
        while (now := time.monotonic()) < end:
            began = now
            if mode == "none":
                granted = False
                while time.monotonic() < end:
                    if client.acquire(RESOURCE, owner, TTL).acquired:
                        granted = True
                        break
                if not granted:
                    unfinished = end - began
                    break
                granted_at.append(time.monotonic())
                waits.append(granted_at[-1] - began)
                time.sleep(HOLD_SECONDS)
                client.release(RESOURCE, owner)
                released_at.append(time.monotonic())
            else:
                try:
                    with client.lock(
                        RESOURCE, ttl=TTL, wait=max(0.0, end - began), owner=owner
                    ):
                        granted_at.append(time.monotonic())
                        waits.append(granted_at[-1] - began)
                        time.sleep(HOLD_SECONDS)
                    released_at.append(time.monotonic())
                except LockNotAcquired:
                    unfinished = end - began
                    break
    finally:
        client.close()
    with lock:
        out.append((waits, unfinished, attempts, granted_at, released_at, turned_away))


def _process(base_url, token, mode, first, count, barrier, seconds, results) -> None:
    out: list = []
    lock = threading.Lock()
    start = threading.Event()
    barrier.wait()
    end = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=_client_loop,
            args=(base_url, token, mode, first + i, start, end, out, lock),
        )
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    start.set()
    for thread in threads:
        thread.join()
    results.put(out)


def run_contention(base_url: str, token: str, mode: str, seconds: float) -> Sample:
    barrier = _CTX.Barrier(PROCESSES + 1)
    results = _CTX.Queue()
    per = CLIENTS // PROCESSES
    processes = [
        _CTX.Process(
            target=_process,
            args=(base_url, token, mode, p * per, per, barrier, seconds, results),
            daemon=True,
        )
        for p in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    barrier.wait(timeout=60)
    clients = []
    for _ in processes:
        clients += results.get(timeout=seconds + 120)
    for process in processes:
        process.join(timeout=10)
    waits = [w for client in clients for w in client[0]]
    worst = max([*waits, *(client[1] for client in clients)], default=0.0)
    grants_per_client = [len(client[0]) for client in clients]
    # CLOCK_MONOTONIC is one clock for every process of the host.
    grants = sorted(t for client in clients for t in client[3])
    releases = sorted(t for client in clients for t in client[4])
    gaps = [b - a for a, b in zip(grants, grants[1:], strict=False)]
    # Counts, not times: how many grants went to others while each wait went
    # on (a fair line: at most clients - 1), which load does not stretch.
    overtaken = [
        bisect.bisect_left(grants, granted)
        - bisect.bisect_right(grants, granted - wait)
        for client in clients
        for wait, granted in zip(client[0], client[3], strict=True)
    ]
    # The i-th release ends the i-th grant; the next grant is the hand-over.
    handoffs = [g - r for r, g in zip(releases, grants[1:], strict=False)]
    return Sample(
        len(waits) / seconds,
        {
            "grants": len(waits),
            "worst_wait_s": round(worst, 3),
            "median_wait_s": round(statistics.median(waits), 4) if waits else None,
            "attempts_per_s": round(sum(c[2] for c in clients) / seconds, 1),
            "median_grant_gap_s": round(statistics.median(gaps), 5) if gaps else None,
            "median_handoff_s": (
                round(statistics.median(handoffs), 5) if handoffs else None
            ),
            "clients_never_granted": sum(1 for n in grants_per_client if n == 0),
            "worst_grants_to_others_while_waiting": max(overtaken, default=0),
            "waits_past_twice_the_fifo_count": sum(
                1 for n in overtaken if n > 2 * (CLIENTS - 1)
            ),
            "attempts_turned_away_by_a_full_room": sum(c[5] for c in clients),
            "fewest_grants_of_a_client": min(grants_per_client, default=0),
        },
    )


def acquire_round_trip(base_url: str, token: str, rounds: int = 40) -> float:
    """The median round trip of an uncontended acquire (released after each)."""
    from lockkeeper_client import LockClient

    samples = []
    with LockClient(base_url, token) as client:
        for i in range(rounds):
            began = time.monotonic()
            assert client.acquire(f"{RESOURCE}.rtt", f"rtt-{i}", TTL).acquired
            samples.append(time.monotonic() - began)
            client.release(f"{RESOURCE}.rtt", f"rtt-{i}")
    return statistics.median(samples)


def bench_contention(backend, database, workdir, token, plan, log):
    from bench.http_api import lockkeeper_env

    base = server_configs()[1]
    # As app.ops.gunicorn_conf sizes it: 4 threads plus the waiting room (16).
    config = ServerConfig(
        "gthread-waiting", base.worker_class, base.workers, threads=4 + 16
    )
    server = Server(
        'app:create_app({"LOCKKEEPER_BOOTSTRAP": False})',
        config,
        lockkeeper_env(database.url, workdir / f"instance-{backend}"),
        workdir / f"gunicorn-contention-{backend}.log",
    )
    extra_comparisons: list[Comparison] = []
    try:
        from bench.client_faces import bench_client_faces

        faces = bench_client_faces(
            backend,
            server.base_url,
            token,
            seconds=min(plan.contention_seconds, 2.0),
            rounds=2,
        )
        log(
            f"async_client_vs_threads {backend}: {faces.value:.0f} vs "
            f"{faces.baseline:.0f} cycles/s (x{faces.ratio:.2f}); client CPU "
            f"{faces.detail['tasks_cpu_ms_per_cycle']} vs "
            f"{faces.detail['threads_cpu_ms_per_cycle']} ms a cycle"
        )
        from bench.client_faces import bench_embedded_faces

        for embedded in bench_embedded_faces(
            backend,
            server.base_url,
            token,
            database.url,
            seconds=min(plan.contention_seconds, 2.0),
            rounds=2,
        ):
            log(
                f"{embedded.name}: {embedded.value:.0f} vs "
                f"{embedded.baseline:.0f} cycles/s (x{embedded.ratio:.2f})"
            )
            extra_comparisons.append(embedded)
        round_trip = acquire_round_trip(server.base_url, token)
        samples = alternate(
            {
                mode: partial(
                    run_contention,
                    server.base_url,
                    token,
                    mode,
                    plan.contention_seconds,
                )
                for mode in ("queue", "backoff", "none")
            },
            rounds=1,
        )
    finally:
        server.stop()
    queue = samples["queue"][0]
    backoff, none = samples["backoff"][0], samples["none"][0]
    for name, sample in (("queue", queue), ("backoff", backoff), ("none", none)):
        log(
            f"contention {backend}: {name} {sample.rate:.1f} grants/s "
            f"(worst wait {sample.extra['worst_wait_s']} s, "
            f"{sample.extra['attempts_per_s']} attempts/s)"
        )
    common = {
        "clients": CLIENTS,
        "hold_s": HOLD_SECONDS,
        "seconds": plan.contention_seconds,
        "server": f"{config.worker_class} -w {config.workers} "
        f"--threads {config.threads}",
    }
    gap = queue.extra["median_grant_gap_s"] or float("nan")
    fifo_bound = (CLIENTS - 1) * gap
    handoff = queue.extra["median_handoff_s"]
    handoff = float("nan") if handoff is None else handoff
    return [
        faces,
        *extra_comparisons,
        Comparison(
            name=f"contention_grants_queue_vs_polling_{backend}",
            value=queue.rate,
            baseline=backoff.rate,
            ratio=queue.rate / backoff.rate if backoff.rate else float("nan"),
            unit="grants/s",
            baseline_name="polling client",
            detail={**common, "queue": queue.extra, "polling": backoff.extra},
        ),
        Comparison(
            name=f"contention_worst_wait_vs_fifo_bound_{backend}",
            value=queue.extra["worst_wait_s"],
            baseline=fifo_bound,
            ratio=queue.extra["worst_wait_s"] / fifo_bound,
            unit="s (ratio: lower is better)",
            baseline_name="(clients-1) x median grant gap",
            detail={**common, "median_grant_gap_s": queue.extra["median_grant_gap_s"]},
        ),
        Comparison(
            name=f"handoff_vs_round_trip_{backend}",
            value=handoff,
            baseline=round_trip,
            ratio=handoff / round_trip,
            unit="s (ratio: lower is better)",
            baseline_name="median acquire round trip",
            detail=common,
        ),
        Comparison(
            name=f"contention_grants_backoff_vs_none_{backend}",
            value=backoff.rate,
            baseline=none.rate,
            ratio=backoff.rate / none.rate if none.rate else float("nan"),
            unit="grants/s",
            baseline_name="no backoff",
            detail={
                **common,
                "backoff": backoff.extra,
                "none": none.extra,
            },
        ),
        Comparison(
            name=f"contention_worst_wait_backoff_vs_none_{backend}",
            value=backoff.extra["worst_wait_s"],
            baseline=none.extra["worst_wait_s"],
            ratio=(
                backoff.extra["worst_wait_s"] / none.extra["worst_wait_s"]
                if none.extra["worst_wait_s"]
                else float("nan")
            ),
            unit="s (lower is better)",
            baseline_name="no backoff",
            detail=common,
        ),
    ]
