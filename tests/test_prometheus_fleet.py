"""Two instances on one database, scraped by a real Prometheus (Debian's
``prometheus``) as docs/deploy.md says: each instance's ``/metrics``, and
``/metrics/fleet`` once. ``sum()`` over the instances is the fleet's work, and
the database's gauges equal the database's counts (not once per instance). The
shipped alert rules load."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable

import pytest
from lockkeeper_core.schema import required_revisions, shown_revisions

from app.extensions import lock_service
from app.ops.version import RELEASE
from app.paths import PROJECT_ROOT
from bench.ports import free_port
from tests.databases import unavailable
from tests.live_server import serve

pytestmark = [pytest.mark.usefixtures("backend"), pytest.mark.slow]


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)["data"]["result"]


def scalar(base: str, promql: str) -> float | None:
    result = query(base, promql)
    return float(result[0]["value"][1]) if result else None


def until(check: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = threading.Event()
    timer = threading.Timer(seconds, deadline.set)
    timer.start()
    try:
        while True:
            try:
                if check():
                    return
            except OSError:
                pass  # Prometheus still starting
            if deadline.wait(0.25):
                raise AssertionError(f"timed out waiting for {what}")
    finally:
        timer.cancel()


@pytest.mark.backends("postgresql")
def test_two_instances_scraped_by_prometheus_sum_to_the_databases_counts(
    make_app, tmp_path
):
    binary = shutil.which("prometheus")
    if binary is None:
        unavailable("prometheus is not installed (Debian package prometheus)")
    first, second = make_app(), make_app()
    with first.app_context():
        for n in range(3):
            lock_service().acquire(f"job:{n}", "a", ttl=600)
    with second.app_context():
        for n in range(3, 5):
            lock_service().acquire(f"job:{n}", "b", ttl=600)
        lock_service().acquire("sem:1", "b", ttl=600, limit=3)
    # No API token: Prometheus is the only client (a token is not created).
    with serve(first, token="-") as a, serve(second, token="-") as b:
        hosts = [server.url.removeprefix("http://") for server in (a, b)]
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(PROJECT_ROOT / "docs/monitoring/alerts.yml")],
                    "scrape_configs": [
                        {
                            "job_name": "lockkeeper",
                            "static_configs": [{"targets": hosts}],
                        },
                        {
                            "job_name": "lockkeeper-fleet",
                            "metrics_path": "/metrics/fleet",
                            "static_configs": [{"targets": hosts[:1]}],
                        },
                    ],
                }
            )
        )
        prometheus = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )
        base = f"http://127.0.0.1:{port}"
        try:
            until(
                lambda: (
                    scalar(base, "count(up == 1)") == 3
                    and scalar(base, "count(lockkeeper_locks)") == 3
                ),
                "Prometheus to scrape the three targets",
            )
            acquired = 'sum(lockkeeper_acquisitions_total{outcome="acquired"})'
            assert scalar(base, acquired) == 6
            per_instance = query(
                base, f"sum by (instance) ({acquired.removeprefix('sum(')}"
            )
            assert sorted(float(r["value"][1]) for r in per_instance) == [3, 3]
            # The database's gauges, once: 6 held (5 locks and a holder's resource).
            assert scalar(base, 'sum(lockkeeper_locks{state="held"})') == 6
            assert scalar(base, "sum(lockkeeper_places_used)") == 1
            assert scalar(base, "sum(lockkeeper_database_up)") == 1
            schema = shown_revisions(required_revisions())
            versions = query(base, "count by (version, schema) (lockkeeper_build_info)")
            assert [
                (r["metric"]["version"], r["metric"]["schema"], r["value"][1])
                for r in versions
            ] == [(RELEASE, schema, "2")]
            rules = json.load(urllib.request.urlopen(f"{base}/api/v1/rules"))
            loaded = [r["name"] for g in rules["data"]["groups"] for r in g["rules"]]
            assert "LockkeeperDatabaseDown" in loaded
            assert scalar(base, 'count(ALERTS{alertstate="firing"})') is None
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
