"""``async_client_vs_threads``: the worker client's two faces on one server.

16 asyncio tasks sharing one ``AsyncLockClient`` in one event loop against 16
threads sharing one ``LockClient``, each cycling acquire + release on a resource
of its own (no contention: what is measured is the client, not the line), against
the same gunicorn server in the same run, alternated A B A B.

Beside the rates, each side's CPU time per cycle in this process (the client's
own work: the server is another process). On a shared two-core machine the
rates also follow how the server's workers happened to accept the 16
connections (one worker holding 12 of them halves a side's rate); the CPU per
cycle does not.

Each side first runs for half as long, unmeasured: the section starts on a
server whose workers have just booted, and the side measured first (the tasks)
paid alone for their first requests and for its own first use in this process.
"""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from collections.abc import Callable

from bench.measure import Comparison, Sample, alternate, median_of, median_rate

WORKERS = 16
TTL = 10.0


def _threads(
    base_url: str, token: str, seconds: float, transport: object = None
) -> Sample:
    from lockkeeper_client import LockClient

    cycles = [0] * WORKERS
    cpu = _cpu_seconds()
    with LockClient(base_url, token, transport=transport) as client:
        end = time.monotonic() + seconds

        def cycle(index: int) -> None:
            resource, owner = f"bench.faces.{index}", f"thread-{index}"
            while time.monotonic() < end:
                assert client.acquire(resource, owner, TTL).acquired
                client.release(resource, owner)
                cycles[index] += 1

        threads = [threading.Thread(target=cycle, args=(i,)) for i in range(WORKERS)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
    return _sample(cycles, elapsed, cpu)


def _cpu_seconds() -> float:
    """User and system CPU time of this process so far."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _sample(cycles: list[int], elapsed: float, cpu_before: float) -> Sample:
    done = sum(cycles)
    cpu_ms = (_cpu_seconds() - cpu_before) * 1000 / done if done else None
    return Sample(done / elapsed, {"cycles": done, "client_cpu_ms_per_cycle": cpu_ms})


def _tasks(
    base_url: str, token: str, seconds: float, transport: object = None
) -> Sample:
    from lockkeeper_client import AsyncLockClient

    cycles = [0] * WORKERS

    async def run() -> float:
        async with AsyncLockClient(base_url, token, transport=transport) as client:
            end = time.monotonic() + seconds

            async def cycle(index: int) -> None:
                resource, owner = f"bench.faces.{index}", f"task-{index}"
                while time.monotonic() < end:
                    assert (await client.acquire(resource, owner, TTL)).acquired
                    await client.release(resource, owner)
                    cycles[index] += 1

            began = time.monotonic()
            await asyncio.gather(*(cycle(i) for i in range(WORKERS)))
            return time.monotonic() - began

    cpu = _cpu_seconds()
    elapsed = asyncio.run(run())
    return _sample(cycles, elapsed, cpu)


def warmed_up(
    sides: Callable[[float], dict[str, Callable[[], Sample]]], seconds: float
) -> dict[str, Callable[[], Sample]]:
    """``sides(seconds)``, after each side ran once for half as long, its
    sample dropped (see above)."""
    for run in sides(seconds / 2).values():
        run()
    return sides(seconds)


def bench_client_faces(
    backend: str, base_url: str, token: str, seconds: float, rounds: int
) -> Comparison:
    def sides(duration: float) -> dict[str, Callable[[], Sample]]:
        return {
            "tasks": lambda: _tasks(base_url, token, duration),
            "threads": lambda: _threads(base_url, token, duration),
        }

    samples = alternate(warmed_up(sides, seconds), rounds=rounds)
    tasks, threads = median_rate(samples["tasks"]), median_rate(samples["threads"])
    return Comparison(
        name=f"async_client_vs_threads_{backend}",
        value=tasks,
        baseline=threads,
        ratio=tasks / threads if threads else float("nan"),
        unit="cycles/s",
        baseline_name=f"{WORKERS} threads, LockClient",
        detail={
            "workers": WORKERS,
            "seconds": seconds,
            "rounds": rounds,
            "cycle": "acquire + release, a resource per worker",
            "tasks_cpu_ms_per_cycle": _rounded(
                median_of(samples["tasks"], "client_cpu_ms_per_cycle")
            ),
            "threads_cpu_ms_per_cycle": _rounded(
                median_of(samples["threads"], "client_cpu_ms_per_cycle")
            ),
        },
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def bench_embedded_faces(
    backend: str,
    base_url: str,
    token: str,
    database_url: str,
    seconds: float,
    rounds: int,
) -> list[Comparison]:
    """The same 16 threads of one ``LockClient`` over HTTP (the gunicorn server
    of the run) and in process (``EmbeddedTransport`` on the same database, the
    same token), and the asyncio face's 16 tasks in process against those
    threads: ``embedded_vs_http_{backend}`` and
    ``embedded_async_vs_threads_{backend}``. One process each side: the
    embedded figures share one GIL, as one worker process does."""
    from lockkeeper_core.embedded import AsyncEmbeddedTransport, EmbeddedTransport

    def sides(duration: float) -> dict[str, Callable[[], Sample]]:
        return {
            "http": lambda: _threads(base_url, token, duration),
            "embedded": lambda: _threads(
                base_url, token, duration, EmbeddedTransport(database_url)
            ),
            "embedded_tasks": lambda: _tasks(
                base_url, token, duration, AsyncEmbeddedTransport(database_url)
            ),
        }

    samples = alternate(warmed_up(sides, seconds), rounds=rounds)
    http = median_rate(samples["http"])
    embedded = median_rate(samples["embedded"])
    tasks = median_rate(samples["embedded_tasks"])
    detail = {
        "workers": WORKERS,
        "seconds": seconds,
        "rounds": rounds,
        "cycle": "acquire + release, a resource per worker",
    }
    return [
        Comparison(
            name=f"embedded_vs_http_{backend}",
            value=embedded,
            baseline=http,
            ratio=embedded / http if http else float("nan"),
            unit="cycles/s",
            baseline_name=f"{WORKERS} threads, LockClient over HTTP",
            detail=detail,
        ),
        Comparison(
            name=f"embedded_async_vs_threads_{backend}",
            value=tasks,
            baseline=embedded,
            ratio=tasks / embedded if embedded else float("nan"),
            unit="cycles/s",
            baseline_name=f"{WORKERS} threads, LockClient in process",
            detail=detail,
        ),
    ]
