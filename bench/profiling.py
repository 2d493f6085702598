"""Where one acquire+release cycle spends its time: pyinstrument over the API.

The whole request path is run in-process through Flask's test client (routing,
auth, validation, service, SQL, JSON), so the profile has no network wait of the
server's own. Werkzeug's test-client machinery shows up too; it is listed apart.
The full reports are written next to latest.json as ``profile-<backend>.txt``.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

from bench.http_api import create_api_token

PROFILED = ("sqlite", "postgresql")
WARMUP = 50


@contextmanager
def _stderr_to_devnull():
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _frames(session, top: int = 25) -> list[dict]:
    """The functions with the most own time, as shares of the whole."""
    totals: dict[str, float] = {}

    def walk(frame) -> None:
        key = f"{frame.function} ({Path(frame.file_path or '?').name}:{frame.line_no})"
        totals[key] = totals.get(key, 0.0) + frame.total_self_time
        for child in frame.children:
            walk(child)

    root = session.root_frame()
    if root is None:
        return []
    walk(root)
    whole = root.time or 1.0
    totals = {k: v for k, v in totals.items() if not k.startswith("[self]")}
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return [{"function": k, "self_share": round(v / whole, 4)} for k, v in ranked]


def _profile_backend(backend, database, workdir, cycles, results_dir, log) -> dict:
    from pyinstrument import Profiler

    from app import create_app

    instance = workdir / f"instance-{backend}"
    token = create_api_token(database.url, instance)
    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": database.url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    url = "/api/v1/locks/bench.profile"

    def cycle() -> None:
        granted = client.post(url, json={"owner": "p", "ttl": 30}, headers=headers)
        released = client.delete(url, json={"owner": "p"}, headers=headers)
        if granted.status_code != 200 or released.status_code != 204:
            raise RuntimeError(
                f"profile cycle failed: {granted.status_code} {granted.data!r}"
                f" / {released.status_code} {released.data!r}"
            )

    with _stderr_to_devnull():  # the app logs every request; keep the console
        for _ in range(WARMUP):
            cycle()
        profiler = Profiler(interval=0.0002)
        started = time.perf_counter()
        profiler.start()
        for _ in range(cycles):
            cycle()
        profiler.stop()
        elapsed = time.perf_counter() - started
    report = results_dir / f"profile-{backend}.txt"
    report.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    log(
        f"profile {backend}: {cycles / elapsed:.0f} cycles/s in-process; "
        f"report in {report}"
    )
    return {
        "cycles": cycles,
        "cycles_per_s_in_process": round(cycles / elapsed, 1),
        "report": report.name,
        "top_self_time": _frames(profiler.last_session),
    }


def profile_hot_path(databases, workdir, plan, log) -> dict:
    from bench.__main__ import RESULTS_DIR

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    return {
        backend: _profile_backend(
            backend,
            databases[backend],
            workdir,
            plan.profile_cycles,
            RESULTS_DIR,
            log,
        )
        for backend in PROFILED
        if backend in databases
    }
