"""``python -m bench [--quick] [--only SECTION ...] [--backends ...]``.

Starts what it needs on loopback (private databases, gunicorn servers), measures,
stops everything it started, and writes ``bench/results/latest.json`` and
``bench/results/latest.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from bench.databases import BenchDatabase, DatabaseUnavailable
from bench.measure import Comparison
from bench.servers import ToolMissing, wrk_path

RESULTS_DIR = Path(__file__).parent / "results"
SECTIONS = (
    "service",
    "guard",
    "http",
    "contention",
    "memory",
    "watch",
    "sessions",
    "etcd",
    "profile",
)


@dataclass(frozen=True)
class Plan:
    """How long and how often; ``--quick`` must finish in under 3 minutes, the full
    run in under 20 (10 of them are the memory-growth run)."""

    rounds: int
    service_seconds: float
    service_workers: tuple[int, ...]
    http_rounds: int
    http_seconds: float
    contention_seconds: float
    memory_seconds: float
    profile_cycles: int
    watch_events: int
    session_intervals: int = 4


QUICK = Plan(2, 1.0, (1, 8), 2, 1.0, 3.0, 10.0, 300, 10, 4)
FULL = Plan(3, 2.5, (1, 8), 3, 4.0, 30.0, 600.0, 1000, 40, 20)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def environment() -> dict:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    def command_output(*args: str) -> str | None:
        try:
            out = subprocess.run(args, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return (out.stdout or out.stderr).strip().splitlines()[0] if out else None

    import os
    import sqlite3

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "sqlite": sqlite3.sqlite_version,
        "postgresql": command_output("psql", "--version"),
        "mariadb": command_output("mariadb", "--version"),
        "redis": command_output("redis-server", "--version"),
        "wrk": command_output("wrk", "--version"),
        "packages": {
            name: version(name)
            for name in (
                "flask",
                "sqlalchemy",
                "flask-sqlalchemy",
                "gunicorn",
                "psycopg",
                "pymysql",
                "redis",
            )
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (< 3 min)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=None)
    parser.add_argument(
        "--backends", default="sqlite,postgresql,mariadb", help="comma-separated"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    sections = args.only or list(SECTIONS)
    if args.quick and args.only is None:
        sections = [s for s in SECTIONS if s != "profile"]
    backends = [b for b in args.backends.split(",") if b]
    if {"http", "memory"} & set(sections):
        try:
            wrk_path()
        except ToolMissing as exc:
            # Without it every HTTP comparison would be missing from the results.
            print(f"python -m bench: {exc}", file=sys.stderr)
            return 2

    started = time.monotonic()
    comparisons: list[Comparison] = []
    notes: list[str] = []
    extra: dict = {}
    env = environment()
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="lk-bench-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        databases: dict[str, BenchDatabase] = {}
        for backend in backends:
            try:
                databases[backend] = BenchDatabase(backend, workdir)
            except DatabaseUnavailable as exc:
                notes.append(f"skipped {backend}: {exc}")
                log(notes[-1])
                continue
            stack.callback(databases[backend].close)
        log(f"databases ready: {', '.join(databases)}")

        def section(name: str, run) -> None:
            """A failing section is reported, and the others still run."""
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - keep the rest of the run
                notes.append(f"section {name} failed: {exc!r}")
                log(notes[-1])

        if "service" in sections:
            from bench.service_layer import bench_service_layer

            section(
                "service",
                lambda: comparisons.extend(
                    bench_service_layer(
                        databases,
                        workdir,
                        plan.service_workers,
                        plan.rounds,
                        plan.service_seconds,
                        log,
                    )
                ),
            )
        if "guard" in sections:
            from bench.guard_bench import bench_guard

            section(
                "guard",
                lambda: comparisons.extend(
                    bench_guard(
                        databases, workdir, plan.rounds, plan.service_seconds, log
                    )
                ),
            )
        if {"http", "contention", "memory"} & set(sections):
            from bench.http_api import bench_http

            def http() -> None:
                found, http_notes, http_extra = bench_http(
                    databases, workdir, plan, sections, log
                )
                comparisons.extend(found)
                notes.extend(http_notes)
                extra.update(http_extra)

            section("http", http)
        if "watch" in sections:
            from bench.watch_bench import bench_watch

            section(
                "watch",
                lambda: comparisons.extend(
                    bench_watch(databases, workdir, plan.watch_events, log)
                ),
            )
        if "sessions" in sections:
            from bench.session_bench import bench_sessions

            section(
                "sessions",
                lambda: comparisons.extend(
                    bench_sessions(databases, workdir, plan.session_intervals, log)
                ),
            )
        if "etcd" in sections:
            from bench.etcd_bench import bench_etcd

            section(
                "etcd",
                lambda: comparisons.extend(bench_etcd(databases, workdir, plan, log)),
            )
        if "profile" in sections:
            from bench.profiling import profile_hot_path

            section(
                "profile",
                lambda: extra.update(
                    profile=profile_hot_path(databases, workdir, plan, log)
                ),
            )

    elapsed = time.monotonic() - started
    report = {
        "mode": "quick" if args.quick else "full",
        "elapsed_seconds": round(elapsed, 1),
        "environment": env,
        "comparisons": [c.as_json() for c in comparisons],
        "notes": notes,
        **extra,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    from bench.report import markdown

    table = markdown(report)
    args.output.with_suffix(".md").write_text(table)
    print(table)
    log(f"done in {elapsed:.0f} s: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
