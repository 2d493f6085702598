"""Smoke tests of the benchmark suite's baselines (the suite itself is not a test).

The driver-level statements are the yardsticks the service is measured against,
so they must grant, refuse and release exactly as the service does, on the same
schema, and the baseline WSGI app must answer like the API.
"""

from __future__ import annotations

import shutil
import socket

import httpx
import pytest
from lockkeeper_core.errors import LockNotFound
from lockkeeper_core.models import LockEvent
from sqlalchemy import func, select

from app.extensions import db, lock_service
from bench import baseline_app
from bench.driver_sql import connect, driver_for
from bench.measure import Sample, alternate, compare
from bench.report import markdown
from bench.service_layer import WARMUP_CYCLES
from tests.databases import unavailable


def _opened(url):
    return driver_for(url), connect(url)


def _chosen(request, backend: str) -> None:
    if backend not in request.config.getoption("--backends").split(","):
        pytest.skip(f"{backend} not among --backends")


@pytest.fixture
def driver_conn(database_url):
    driver, conn = _opened(database_url)
    yield driver, conn
    conn.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def http_database_url(request, databases, tmp_path):
    """The databases the HTTP baselines (ideal, seed design) run on."""
    _chosen(request, request.param)
    return databases(request.param).fresh(tmp_path)


@pytest.fixture
def http_driver_conn(http_database_url):
    driver, conn = _opened(http_database_url)
    yield driver, conn
    conn.close()


@pytest.mark.usefixtures("backend")
def test_service_statements_through_the_driver_decide_like_the_service(
    driver_conn, app
):
    driver, conn = driver_conn
    assert driver.service_acquire(conn, "job:1", "w-1", 30) is not None
    assert driver.service_acquire(conn, "job:1", "w-2", 30) is None
    with app.app_context():
        lock = lock_service().get("job:1")
        assert (lock.owner, lock.state.value) == ("w-1", "held")
    assert not driver.service_release(conn, "job:1", "w-2")
    assert driver.service_release(conn, "job:1", "w-1")
    with app.app_context():
        events = db.session.scalar(select(func.count()).select_from(LockEvent))
    assert events == 2  # acquired + released, like the service writes


def test_ideal_statements_grant_refuse_reacquire_and_release(
    http_driver_conn, http_database_url, make_app
):
    driver, conn = http_driver_conn
    app = make_app(LOCKKEEPER_DATABASE_URL=http_database_url)
    first = driver.ideal_acquire(conn, "job:2", "w-1", 30)
    assert first is not None
    assert driver.ideal_acquire(conn, "job:2", "w-2", 30) is None
    again = driver.ideal_acquire(conn, "job:2", "w-1", 30)
    assert again[2] == first[2]  # same owner, still valid: same fence
    with app.app_context():
        assert lock_service().get("job:2").owner == "w-1"
    assert not driver.ideal_release(conn, "job:2", "w-2")
    assert driver.ideal_release(conn, "job:2", "w-1")
    assert driver.ideal_acquire(conn, "job:2", "w-2", 30)[2] > first[2]


def test_seed_design_grants_and_refuses(request, databases, tmp_path):
    _chosen(request, "postgresql")
    driver, conn = _opened(databases("postgresql").fresh(tmp_path))
    assert driver.seed_acquire(conn, "job:3", "w-1", 30) is not None
    assert driver.seed_acquire(conn, "job:3", "w-2", 30) is None
    assert not driver.seed_release(conn, "job:3", "w-2")
    assert driver.seed_release(conn, "job:3", "w-1")
    conn.close()


def test_baseline_app_answers_like_the_api(http_database_url, monkeypatch):
    monkeypatch.setenv("BENCH_DATABASE_URL", http_database_url)
    monkeypatch.delenv("BENCH_REDIS_URL", raising=False)
    client = baseline_app.create_app().test_client()
    assert client.get("/floor").json == {"ok": True}
    granted = client.post("/ideal/locks/job:4", json={"owner": "w-1", "ttl": 30})
    assert granted.status_code == 200
    assert granted.json["lock"]["owner"] == "w-1"
    refused = client.post("/ideal/locks/job:4", json={"owner": "w-2"})
    assert refused.status_code == 409
    assert client.delete("/ideal/locks/job:4", json={"owner": "w-2"}).status_code == 404
    assert client.delete("/ideal/locks/job:4", json={"owner": "w-1"}).status_code == 204


def test_comparison_is_the_median_ratio_of_alternating_runs():
    rates = iter([100.0, 50.0, 300.0, 60.0, 200.0, 70.0])
    samples = alternate(
        {"ours": lambda: Sample(next(rates)), "base": lambda: Sample(next(rates))},
        rounds=3,
    )
    result = compare("http_vs_ideal_sqlite", samples, "ours", "base", "cycles/s")
    assert (result.value, result.baseline) == (200.0, 60.0)
    assert result.ratio == pytest.approx(200 / 60)
    table = markdown(
        {
            "mode": "quick",
            "elapsed_seconds": 1,
            "environment": {
                "date": "2026-11-30T00:00:00Z",
                "cpus": 2,
                "load_average_at_start": [0.1],
                "python": "3.11",
                "sqlite": "3.40",
            },
            "comparisons": [result.as_json()],
        }
    )
    assert "| http_vs_ideal_sqlite | 200 | 60 (base) | 3.33 | 0.5× met |" in table


def test_the_benchmark_without_wrk_fails_naming_it(tmp_path, monkeypatch, capsys):
    """A run that silently skipped every HTTP comparison would look like a pass."""
    from bench.__main__ import main

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no wrk on it
    output = tmp_path / "latest.json"
    assert main(["--quick", "--only", "http", "--output", str(output)]) != 0
    assert "wrk" in capsys.readouterr().err
    assert not output.exists()


def test_the_etcd_baseline_cycles_through_etcds_own_lock_api(tmp_path):
    """The etcd side of ``http_vs_etcd_lock_postgresql`` really takes and frees
    etcd locks: every cycle is one put (the lock's key on the lease) and one
    delete (the unlock of the key the lock answered), so etcd's revision moves
    twice per cycle. An unlock that named no key would leave the key in place,
    the next lock of the name would reuse it, and the revision would stand
    still."""
    from bench.etcd_bench import Etcd
    from bench.servers import run_wrk

    for tool in ("wrk", "etcd"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (.ci/run installs it)")
    etcd = Etcd(tmp_path / "etcd")
    try:
        lease = etcd.grant_lease()

        def revision() -> int:
            answer = httpx.post(etcd.base_url + "/v3/kv/range", json={"key": "AA=="})
            return int(answer.json()["header"]["revision"])

        before = revision()
        result = run_wrk(
            etcd.base_url, "/", "etcd", "smoke", 1, token=lease, connections=2
        )
        moved = revision() - before
        kept_alive = run_wrk(
            etcd.base_url, "/", "etcd-keepalive", "smoke", 1, token=lease, connections=2
        )
    finally:
        etcd.stop()
    assert result["bad_status"] == 0, result
    assert result["socket_errors"] == 0, result
    assert result["acquires"] > 10, result
    # The last cycle of each connection may end between its lock and unlock.
    assert moved >= result["acquires"] + result["releases"] - 2, (moved, result)
    assert kept_alive["bad_status"] == 0, kept_alive
    assert kept_alive["acquires"] > 10, kept_alive


def test_python_workers_on_etcd_take_and_free_etcd_locks(tmp_path, monkeypatch):
    """The etcd side of ``embedded_vs_etcd_from_python_workers``: each worker
    process's cycle is a lock (a put of its key on the lease) and an unlock
    of that key (a delete), so etcd's revision moves twice per cycle, warm-up
    included; etcd's CPU a cycle is read over the timed loop."""
    from bench import etcd_bench

    if shutil.which("etcd") is None:
        unavailable("etcd is not installed (.ci/run installs it)")
    monkeypatch.setattr(etcd_bench, "EMBEDDED_WORKERS", 2)
    etcd = etcd_bench.Etcd(tmp_path / "etcd")
    try:
        lease = etcd.grant_lease()

        def revision() -> int:
            answer = httpx.post(etcd.base_url + "/v3/kv/range", json={"key": "AA=="})
            return int(answer.json()["header"]["revision"])

        before = revision()
        found = etcd_bench._python_workers_on_etcd(etcd, lease, 0.5)
        moved = revision() - before
    finally:
        etcd.stop()
    cycles = found.rate * 0.5
    assert cycles > 10, found
    assert moved == 2 * (cycles + 2 * WARMUP_CYCLES), (moved, found)
    assert found.extra["client_cpu_ms_per_cycle"] > 0
    assert found.extra["server_cpu_ms_per_cycle"] > 0


def test_the_session_bench_counts_heartbeats_against_renewals(database_url, tmp_path):
    from bench.session_bench import LOCKS, _bench

    found = _bench("sqlite", database_url, tmp_path, 2, lambda _message: None)
    assert found.name == "session_heartbeat_vs_renew_each_100"
    assert 0 < found.value <= 2  # one heartbeat per interval (a late one at most)
    # Every lock renews once per interval when the machine keeps up; a loaded
    # one (four test workers on two cores) runs the renewal threads late, and
    # counts fewer in the window. Either way one heartbeat stands for dozens.
    assert found.baseline >= LOCKS / 5
    assert found.ratio <= 0.1


@pytest.mark.parametrize("kind", ["set", "singles"])
def test_the_set_and_singles_cycles_take_their_three_locks_and_let_go(
    kind, database_url, tmp_path
):
    """Each cycle of set_of_3_vs_3_singles is granted on its free resources
    (``run_cycles`` raises on a refused one, which one left held would cause)."""
    from bench.service_layer import run_cycles

    found = run_cycles(kind, database_url, tmp_path / "instance", 1, 0.3)
    assert found.rate > 0


@pytest.mark.parametrize("kind", ["driver", "embedded"])
def test_a_run_of_cycles_counts_the_cpu_of_its_workers_and_their_backends(
    kind, request, databases, tmp_path
):
    """What a cycle cost in CPU, the workers' own and that of the PostgreSQL
    backends serving them (read from /proc while their sessions are open),
    is what ``embedded_vs_etcd_lock_postgresql`` names as its limit."""
    from bench.service_layer import run_cycles

    _chosen(request, "postgresql")
    url = databases("postgresql").fresh(tmp_path)
    found = run_cycles(kind, url, tmp_path / "instance", 2, 0.5)
    assert found.rate > 0
    assert found.extra["client_cpu_ms_per_cycle"] > 0
    assert found.extra["database_cpu_ms_per_cycle"] > 0


def test_the_instruction_count_runs_its_cycles_on_a_trees_own_migration(
    tmp_path, database_url
):
    """What bench.instructions has callgrind count: a migrated database, the
    warm-up, then the cycles in a thread of their own, every one granted and
    released (one acquired and one released event each)."""
    from bench import instructions

    instructions._cycles(3, database_url, str(tmp_path), migrate=False)
    from app import create_app

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": database_url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
        }
    )
    with app.app_context():
        counted = db.session.scalar(
            select(func.count()).where(LockEvent.resource == "bench:1")
        )
        assert counted == 2 * (instructions.WARMUP + 3)
        with pytest.raises(LockNotFound):  # released
            lock_service().get("bench:1")


def test_a_free_port_is_below_the_ephemeral_range_and_takes_a_listener():
    """Ports for the suite's servers come from below the range the kernel
    gives outgoing connections (a database client cannot take one between
    the pick and the bind), and are free: a server binds them."""
    from bench.ports import LOWEST_PORT, _ephemeral_start, free_port

    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < _ephemeral_start() for port in ports)
    assert len(ports) > 1  # picked at random, not one port over and over
    for port in ports:
        with socket.create_server(("127.0.0.1", port)):
            pass


def test_a_free_port_is_handed_out_once_though_nothing_bound_it_yet():
    """A cluster picks all its ports before its servers bind any (a Galera
    node binds its IST port only when it rejoins): two picks that both found
    one port free gave two of its servers the same port, and the second to
    start failed ("could not bind", "postmaster is not running")."""
    from bench import ports

    narrow = (ports.LOWEST_PORT, ports.LOWEST_PORT + 40)
    real = ports._share
    ports._share = lambda low, top: narrow
    try:
        picked = [ports.free_port() for _ in range(30)]
    finally:
        ports._share = real
    assert len(set(picked)) == len(picked), sorted(picked)


def test_each_test_worker_picks_ports_from_its_own_share(monkeypatch):
    from bench.ports import LOWEST_PORT, _share

    top = 32768
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    shares = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        shares.append(_share(LOWEST_PORT, top))
    assert shares[0][0] == LOWEST_PORT
    assert shares[-1][1] <= top
    for (_, end), (start, _) in zip(shares, shares[1:], strict=False):
        assert end <= start  # disjoint
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert _share(LOWEST_PORT, top) == (LOWEST_PORT, top)  # not under xdist
