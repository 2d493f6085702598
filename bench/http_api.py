"""The JSON API through gunicorn against the bench-only baselines, plus the
contention and memory runs that need a running server.

For each database and gunicorn configuration, two servers run side by side:
Lockkeeper (``app:create_app``) and the baseline app (``bench.baseline_app``).
wrk (16 keep-alive connections, one per thread) drives one side at a time,
alternating between them round after round.
"""

from __future__ import annotations

import os
import resource
import uuid
from functools import partial
from pathlib import Path

from bench.measure import Comparison, Sample, alternate, compare, median_of
from bench.pgbouncer import PgBouncer, find_pgbouncer
from bench.servers import (
    RssSampler,
    Server,
    ServerConfig,
    run_wrk,
    server_configs,
    wrk_path,
)

LOCKKEEPER_APP = 'app:create_app({"LOCKKEEPER_BOOTSTRAP": False})'
BASELINE_APP = "bench.baseline_app:create_app()"
REDIS_URL = os.environ.get("LOCKKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
HTTP_BACKENDS = ("sqlite", "postgresql")
API_PREFIX = "/api/v1/locks/"


def create_api_token(url: str, instance: Path) -> str:
    from app import create_app
    from app.auth.service import create_token
    from app.extensions import db

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )
    with app.app_context():
        token = create_token(f"bench-{uuid.uuid4().hex[:12]}")
        db.session.remove()
        db.engine.dispose()
    return token


def redis_available() -> str | None:
    """None when Redis answers, else why not."""
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        return f"Redis at {REDIS_URL}: {exc}"
    return None


def lockkeeper_env(url: str, instance: Path) -> dict[str, str]:
    return {
        "LOCKKEEPER_DATABASE_URL": url,
        "LOCKKEEPER_INSTANCE_PATH": str(instance),
        "LOCKKEEPER_SECRET_KEY": "bench",
    }


def wrk_sample(
    server: Server, prefix, mode, tag, *, seconds, token="none", connections=16
) -> Sample:
    """One wrk run; also the server's CPU time per cycle, which other load on a
    shared machine disturbs far less than the rate, and wrk's own (the
    client's)."""
    cpu_before = server.cpu_seconds()
    client_before = _children_cpu_seconds()
    result = run_wrk(
        server.base_url,
        prefix,
        mode,
        tag,
        seconds,
        token=token,
        connections=connections,
    )
    cycles = min(result["acquires"], result["releases"])
    result["server_cpu_ms_per_cycle"] = (
        (server.cpu_seconds() - cpu_before) * 1000 / cycles if cycles else None
    )
    result["client_cpu_ms_per_cycle"] = (
        (_children_cpu_seconds() - client_before) * 1000 / cycles if cycles else None
    )
    if result["bad_status"] or not cycles:
        raise RuntimeError(f"{tag}: unexpected statuses in {result}")
    return Sample(result["cycles_per_s"], result)


def _children_cpu_seconds() -> float:
    """User + system CPU time of this process's finished children (wrk's,
    once ``run_wrk`` has waited for it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _latency_detail(samples, side, baseline) -> dict:
    detail = {}
    for who in (side, baseline):
        for key in ("acquire_p50_ms", "acquire_p99_ms", "server_cpu_ms_per_cycle"):
            value = median_of(samples[who], key)
            if value is not None:
                detail[f"{who}_{key}"] = round(value, 2)
    return detail


class Servers:
    """Lockkeeper and the baselines in one gunicorn configuration."""

    def __init__(self, backend, database, config: ServerConfig, workdir, redis_ok):
        instance = workdir / f"instance-{backend}"
        self.lockkeeper = Server(
            LOCKKEEPER_APP,
            config,
            lockkeeper_env(database.url, instance),
            workdir / f"gunicorn-lockkeeper-{backend}-{config.name}.log",
            wait=False,  # both boot at once; waited for below
        )
        env = {"BENCH_DATABASE_URL": database.url}
        if redis_ok:
            env["BENCH_REDIS_URL"] = REDIS_URL
        self.baseline = None
        self.bouncer = None
        self.behind_bouncer = None
        try:
            if backend == "postgresql" and find_pgbouncer() is not None:
                # The same app on the same database, through PgBouncer in
                # transaction pooling (as many instances would share it).
                self.bouncer = PgBouncer(database.url)
                self.behind_bouncer = Server(
                    LOCKKEEPER_APP,
                    config,
                    {
                        **lockkeeper_env(self.bouncer.url_for(database.url), instance),
                        "LOCKKEEPER_PGBOUNCER": "true",
                    },
                    workdir / f"gunicorn-pgbouncer-{config.name}.log",
                    wait=False,
                )
            self.baseline = Server(
                BASELINE_APP,
                config,
                env,
                workdir / f"gunicorn-baseline-{backend}-{config.name}.log",
            )
            self.lockkeeper.wait_ready()
            if self.behind_bouncer is not None:
                self.behind_bouncer.wait_ready()
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        self.lockkeeper.stop()
        if self.baseline is not None:
            self.baseline.stop()
        if self.behind_bouncer is not None:
            self.behind_bouncer.stop()
        if self.bouncer is not None:
            self.bouncer.close()


def bench_api(backend, database, config, workdir, token, plan, redis_ok, log):
    servers = Servers(backend, database, config, workdir, redis_ok)
    lk, base = servers.lockkeeper, servers.baseline
    seconds = plan.http_seconds
    tag = f"{backend}.{config.name}"
    # Each run is called with its duration: run(seconds=...).
    runs = {
        "lockkeeper": partial(
            wrk_sample, lk, API_PREFIX, "locks", f"lk.{tag}", token=token
        ),
        "floor": partial(wrk_sample, base, "/floor", "floor", "floor"),
        "ideal": partial(wrk_sample, base, "/ideal/locks/", "locks", f"ideal.{tag}"),
    }
    if backend == "postgresql":
        runs["seed_design"] = partial(
            wrk_sample, base, "/seed/locks/", "locks", f"seed.{tag}"
        )
        if redis_ok:
            runs["redis"] = partial(
                wrk_sample, base, "/redis/locks/", "locks", f"redis.{tag}"
            )
        if servers.behind_bouncer is not None:
            runs["pgbouncer"] = partial(
                wrk_sample,
                servers.behind_bouncer,
                API_PREFIX,
                "locks",
                f"lkpgb.{tag}",
                token=token,
            )
    sides = {name: partial(run, seconds=seconds) for name, run in runs.items()}
    try:
        # Warm every side first: each worker's first requests import lazily and
        # fill SQLAlchemy's compiled cache, which is not what is being measured.
        for run in runs.values():
            try:
                run(seconds=1)
            except RuntimeError:
                # On a loaded machine a worker's first requests can take a
                # second: no complete cycle in the warm-up is not a failure.
                pass
        with (
            RssSampler(servers.lockkeeper) as lk_rss,
            RssSampler(servers.baseline) as base_rss,
        ):
            samples = alternate(sides, plan.http_rounds)
    finally:
        servers.stop()

    suffix = "" if config.name == "sync" else f"_{config.name}"
    comparisons = []
    server = f"{config.worker_class} -w {config.workers}" + (
        f" --threads {config.threads}" if config.threads > 1 else ""
    )
    if "pgbouncer" in sides:
        result = compare(
            f"http_pgbouncer_vs_direct_{backend}{suffix}",
            samples,
            "pgbouncer",
            "lockkeeper",
            "cycles/s",
            server=server,
            **_latency_detail(samples, "pgbouncer", "lockkeeper"),
        )
        log(f"{result.name}: {result.ratio:.2f}x")
        comparisons.append(result)
    for baseline in sides:
        if baseline in ("lockkeeper", "pgbouncer"):
            continue
        result = compare(
            f"http_vs_{baseline}_{backend}{suffix}",
            samples,
            "lockkeeper",
            baseline,
            "cycles/s",
            server=f"{config.worker_class} -w {config.workers}"
            + (f" --threads {config.threads}" if config.threads > 1 else ""),
            **_latency_detail(samples, "lockkeeper", baseline),
        )
        log(
            f"{result.name}: {result.value:.0f} vs {baseline} "
            f"{result.baseline:.0f} cycles/s -> {result.ratio:.2f}x"
        )
        comparisons.append(result)
    lk_peak, base_peak = lk_rss.peak_per_worker(), base_rss.peak_per_worker()
    comparisons.append(
        Comparison(
            name=f"memory_peak_rss_{backend}{suffix}",
            value=lk_peak,
            baseline=base_peak,
            ratio=lk_peak / base_peak if base_peak else float("nan"),
            unit="MB per worker",
            baseline_name="baseline app",
            detail={"note": "peak RSS of any one gunicorn worker during the runs"},
        )
    )
    return comparisons


def bench_memory_growth(backend, database, workdir, token, seconds, log):
    """A long run against one Lockkeeper server: worker RSS after warm-up vs end."""
    config = server_configs()[1]
    server = Server(
        LOCKKEEPER_APP,
        config,
        lockkeeper_env(database.url, workdir / f"instance-{backend}"),
        workdir / f"gunicorn-memory-{backend}.log",
    )
    try:
        with RssSampler(server, interval=max(1.0, seconds / 120)) as rss:
            result = run_wrk(
                server.base_url, API_PREFIX, "locks", "memory", seconds, token=token
            )
    finally:
        server.stop()
    series = rss.series
    warm = [mb for t, mb in series if t >= seconds * 0.1] or [mb for _, mb in series]
    start, end = warm[0], series[-1][1]
    log(f"memory growth: {start:.1f} MB -> {end:.1f} MB per worker over {seconds} s")
    step = max(1, len(series) // 20)
    return Comparison(
        name=f"memory_growth_{backend}",
        value=end,
        baseline=start,
        ratio=end / start,
        unit="MB per worker (mean)",
        baseline_name="after warm-up",
        detail={
            "seconds": seconds,
            "server": f"{config.worker_class} -w {config.workers}",
            "cycles_per_s": round(result["cycles_per_s"], 1),
            "peak_mb": round(rss.peak_per_worker(), 1),
            "series_mb": [(round(t), round(mb, 1)) for t, mb in series[::step]],
        },
    )


def bench_http(databases, workdir, plan, sections, log):
    comparisons: list[Comparison] = []
    notes: list[str] = []
    extra: dict = {}
    chosen = {b: databases[b] for b in HTTP_BACKENDS if b in databases}
    tokens = {
        backend: create_api_token(db.url, workdir / f"instance-{backend}")
        for backend, db in chosen.items()
    }
    if {"http", "memory"} & set(sections):
        wrk_path()  # checked by main() already; raises ToolMissing
    redis_problem = redis_available()
    if redis_problem:
        notes.append(f"no Redis baseline: {redis_problem}")

    if "http" in sections:
        for backend, database in chosen.items():
            for config in server_configs():
                log(f"HTTP {backend} {config.name}")
                comparisons += bench_api(
                    backend,
                    database,
                    config,
                    workdir,
                    tokens[backend],
                    plan,
                    redis_problem is None,
                    log,
                )
    if "contention" in sections:
        from bench.contention import bench_contention

        for backend, database in chosen.items():
            comparisons += bench_contention(
                backend, database, workdir, tokens[backend], plan, log
            )
    if "memory" in sections and "postgresql" in chosen:
        comparisons.append(
            bench_memory_growth(
                "postgresql",
                chosen["postgresql"],
                workdir,
                tokens["postgresql"],
                plan.memory_seconds,
                log,
            )
        )
    return comparisons, notes, extra
