"""32 clients on ONE resource: grants per second and the worst wait.

Each client loops: wait for the lock, hold it briefly, release it. "none" retries
a refused acquire at once (``LockClient.acquire`` in a loop); "backoff" uses the
worker client's ``with client.lock(...)``, which backs off exponentially with
jitter, capped by the refusal's Retry-After. The clients are threads spread over
a few processes (so the client side is not one GIL), all driven through
``app.client.LockClient`` against a Lockkeeper gunicorn server (gthread).
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from functools import partial

from bench.measure import Comparison, Sample, alternate
from bench.servers import Server, server_configs

CLIENTS = 32
PROCESSES = 4
HOLD_SECONDS = 0.01
TTL = 10.0
RESOURCE = "bench.contention"

_CTX = multiprocessing.get_context("fork")


def _client_loop(base_url, token, mode, index, start, end, out, lock) -> None:
    from app.client import LockClient, LockNotAcquired

    client = LockClient(base_url, token)
    attempts = 0
    acquire = client.acquire

    def counted_acquire(*args, **kwargs):
        nonlocal attempts
        attempts += 1
        return acquire(*args, **kwargs)

    client.acquire = counted_acquire  # type: ignore[method-assign]
    owner = f"client-{index}"
    waits: list[float] = []
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
                waits.append(time.monotonic() - began)
                time.sleep(HOLD_SECONDS)
                client.release(RESOURCE, owner)
            else:
                try:
                    with client.lock(
                        RESOURCE, ttl=TTL, wait=max(0.0, end - began), owner=owner
                    ):
                        waits.append(time.monotonic() - began)
                        time.sleep(HOLD_SECONDS)
                except LockNotAcquired:
                    unfinished = end - began
                    break
    finally:
        client.close()
    with lock:
        out.append((waits, unfinished, attempts))


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
    waits = [w for client_waits, _, _ in clients for w in client_waits]
    worst = max([*waits, *(u for _, u, _ in clients)], default=0.0)
    grants_per_client = [len(client_waits) for client_waits, _, _ in clients]
    return Sample(
        len(waits) / seconds,
        {
            "grants": len(waits),
            "worst_wait_s": round(worst, 3),
            "median_wait_s": round(statistics.median(waits), 4) if waits else None,
            "attempts_per_s": round(sum(a for _, _, a in clients) / seconds, 1),
            "clients_never_granted": sum(1 for n in grants_per_client if n == 0),
            "fewest_grants_of_a_client": min(grants_per_client, default=0),
        },
    )


def bench_contention(backend, database, workdir, token, plan, log):
    from bench.http_api import lockkeeper_env

    config = server_configs()[1]
    server = Server(
        'app:create_app({"LOCKKEEPER_BOOTSTRAP": False})',
        config,
        lockkeeper_env(database.url, workdir / f"instance-{backend}"),
        workdir / f"gunicorn-contention-{backend}.log",
    )
    try:
        samples = alternate(
            {
                mode: partial(
                    run_contention,
                    server.base_url,
                    token,
                    mode,
                    plan.contention_seconds,
                )
                for mode in ("backoff", "none")
            },
            rounds=1,
        )
    finally:
        server.stop()
    backoff, none = samples["backoff"][0], samples["none"][0]
    log(
        f"contention {backend}: backoff {backoff.rate:.1f} grants/s "
        f"(worst wait {backoff.extra['worst_wait_s']} s, "
        f"{backoff.extra['attempts_per_s']} attempts/s) vs none {none.rate:.1f} "
        f"(worst {none.extra['worst_wait_s']} s, "
        f"{none.extra['attempts_per_s']} attempts/s)"
    )
    common = {
        "clients": CLIENTS,
        "hold_s": HOLD_SECONDS,
        "seconds": plan.contention_seconds,
        "server": f"{config.worker_class} -w {config.workers}",
    }
    return [
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
