"""Operations: /healthz, /metrics (one and several processes), logs, gunicorn."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lockkeeper_core.errors import LockExpired, LockNotFound, NotOwner
from lockkeeper_core.schema import required_revisions, shown_revisions
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from app.extensions import lock_service
from app.ops.request_log import LOGGER_NAME, render_line
from app.ops.upgrade import upgrade
from app.ops.version import RELEASE
from app.paths import PROJECT_ROOT
from bench.ports import free_port

# -- helpers ----------------------------------------------------------------


FLEET = "/metrics/fleet"


def scrape(client, path: str = "/metrics") -> dict[tuple[str, tuple], float]:
    """GET ``path`` and parse it: {(sample name, sorted labels): value}."""
    response = client.get(path)
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    return parse(response.get_data(as_text=True))


def parse(text: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# -- /healthz ---------------------------------------------------------------


@pytest.mark.usefixtures("backend")
def test_healthz_is_ok_when_the_database_answers(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json == {"status": "ok", "database": "ok"}
    assert response.headers["Cache-Control"] == "no-store"


def test_healthz_is_503_problem_when_postgresql_does_not_listen(make_app):
    # A port nobody listens on stands in for a stopped server; the shared
    # database servers stay up.
    app = make_app(
        LOCKKEEPER_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    )

    response = app.test_client().get("/healthz")

    assert response.status_code == 503
    assert response.mimetype == "application/problem+json"
    assert response.json["status"] == 503
    assert response.json["instance"] == "/healthz"
    assert "database" in response.json["detail"]
    assert response.headers["Retry-After"]


def test_healthz_is_503_when_the_sqlite_file_cannot_be_opened(make_app, tmp_path):
    missing = tmp_path / "no-such-directory" / "locks.sqlite3"
    app = make_app(LOCKKEEPER_DATABASE_URL=f"sqlite:///{missing}")

    response = app.test_client().get("/healthz")

    assert response.status_code == 503
    assert response.mimetype == "application/problem+json"


def test_metrics_report_the_database_down_instead_of_failing(make_app):
    app = make_app(
        LOCKKEEPER_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    )

    samples = scrape(app.test_client(), FLEET)

    assert value(samples, "lockkeeper_database_up") == 0
    # Every gauge is there, reading 0, rather than vanishing from the graphs.
    for state in ("held", "expiring", "stale"):
        assert ("lockkeeper_locks", (("state", state),)) in samples
    for gauge in ("lockkeeper_queued_waiters", "lockkeeper_live_sessions"):
        assert samples[(gauge, ())] == 0
    assert value(samples, "lockkeeper_database_schema_info", revision="none") == 1


@pytest.mark.usefixtures("backend")
def test_fleet_metrics_on_a_schema_behind_the_code_name_its_revision(
    make_app, empty_url
):
    """This code on a database one migration behind it (an instance restarted
    before ``lockkeeper db upgrade``): it cannot count there (0035's column is
    missing), so ``lockkeeper_database_up`` is 0, but the database answers and
    its revision is named, which tells the two apart (docs/runbook.md)."""
    upgrade(make_app(LOCKKEEPER_DATABASE_URL=empty_url), "0034")
    client = make_app(LOCKKEEPER_DATABASE_URL=empty_url).test_client()

    samples = scrape(client, FLEET)

    assert value(samples, "lockkeeper_database_up") == 0
    assert value(samples, "lockkeeper_database_schema_info", revision="0034") == 1
    assert value(samples, "lockkeeper_database_schema_info", revision="none") == 0


# -- /metrics: lock operations ----------------------------------------------


@pytest.mark.usefixtures("backend")
def test_acquisitions_are_counted_by_outcome(fake_app, clock):
    client = fake_app.test_client()
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=10)
        service.acquire("job:1", "w1", ttl=10)
        service.acquire("job:1", "w2", ttl=10)
        service.acquire("job:1", "w2", ttl=10)
        clock.advance(11)
        service.acquire("job:1", "w2", ttl=10)

    samples = scrape(client)

    total = "lockkeeper_acquisitions_total"
    assert value(samples, total, outcome="acquired") == 1
    assert value(samples, total, outcome="reacquired") == 1
    assert value(samples, total, outcome="held") == 2
    assert value(samples, total, outcome="took_over") == 1


@pytest.mark.usefixtures("backend")
def test_late_renewals_and_releases_of_a_lost_lock_are_counted(fake_app, clock):
    client = fake_app.test_client()
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=10)
        service.renew("job:1", "w1", ttl=10)
        clock.advance(11)
        with pytest.raises(LockExpired):
            service.renew("job:1", "w1")
        with pytest.raises(LockNotFound):
            service.release("job:1", "w1")
        service.acquire("job:1", "w2", ttl=10)
        with pytest.raises(NotOwner):
            service.renew("job:1", "w1")
        with pytest.raises(NotOwner):
            service.release("job:1", "w1")
        service.release("job:1", "w2")
        with pytest.raises(LockNotFound):
            service.renew("job:1", "w2")
        with pytest.raises(LockNotFound):
            service.release("job:1", "w2")

    samples = scrape(client)

    renewals, releases = "lockkeeper_renewals_total", "lockkeeper_releases_total"
    assert value(samples, renewals, outcome="renewed") == 1
    assert value(samples, renewals, outcome="expired") == 1
    assert value(samples, renewals, outcome="not_owner") == 1
    assert value(samples, renewals, outcome="not_found") == 1
    assert value(samples, releases, outcome="released") == 1
    assert value(samples, releases, outcome="expired") == 1
    assert value(samples, releases, outcome="not_owner") == 1
    assert value(samples, releases, outcome="not_found") == 1


def test_operator_actions_are_counted(fake_app):
    client = fake_app.test_client()
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=60)
        service.claim("job:1", "ops", ttl=60, actor="admin", reason="x", force=True)
        service.force_release("job:1", actor="admin", reason="stuck")
        service.claim("job:1", "ops", ttl=60, actor="admin")

    samples = scrape(client)

    total = "lockkeeper_operator_actions_total"
    assert value(samples, total, action="force_claimed") == 1
    assert value(samples, total, action="force_released") == 1
    assert value(samples, total, action="claimed") == 1


@pytest.mark.usefixtures("backend")
def test_lock_gauges_follow_held_expiring_and_stale_at_scrape_time(fake_app, clock):
    client = fake_app.test_client()
    with fake_app.app_context():
        service = lock_service()
        service.acquire("old", "w1", ttl=1)
        service.acquire("short", "w1", ttl=16)
        clock.advance(10)  # 6 s of its 16 s left: expiring
        service.acquire("long", "w1", ttl=300)

        first = scrape(client, FLEET)
        service.release("long", "w1")
        clock.advance(3)
        second = scrape(client, FLEET)
        clock.advance(5)
        third = scrape(client, FLEET)

    def states(samples):
        return {
            s: value(samples, "lockkeeper_locks", state=s)
            for s in ("held", "expiring", "stale")
        }

    assert states(first) == {"held": 1, "expiring": 1, "stale": 1}
    assert states(second) == {"held": 0, "expiring": 1, "stale": 1}
    assert states(third) == {"held": 0, "expiring": 0, "stale": 2}
    assert value(third, "lockkeeper_database_up") == 1


# -- /metrics: requests -----------------------------------------------------


def test_requests_are_counted_by_route_template_and_status(client):
    client.get("/healthz")
    client.get("/healthz")
    client.get("/no/such/page/42")

    samples = scrape(client)

    requests = "lockkeeper_http_requests_total"
    assert value(samples, requests, method="GET", route="/healthz", status="200") == 2
    assert (
        value(samples, requests, method="GET", route="<unmatched>", status="404") == 1
    )
    # Raw paths never become label values (unbounded cardinality).
    assert not any("/no/such/page/42" in str(labels) for _, labels in samples)
    latency = "lockkeeper_http_request_duration_seconds_count"
    assert value(samples, latency, method="GET", route="/healthz") == 2
    assert (
        value(
            samples,
            "lockkeeper_http_request_duration_seconds_sum",
            method="GET",
            route="/healthz",
        )
        > 0
    )


# -- /metrics: several processes --------------------------------------------

_WORKER = textwrap.dedent(
    """
    import sys
    from app import create_app
    from app.extensions import lock_service

    url, instance, prefix, count, render = sys.argv[1:6]
    app = create_app({
        "LOCKKEEPER_DATABASE_URL": url, "LOCKKEEPER_INSTANCE_PATH": instance,
        "LOCKKEEPER_BOOTSTRAP": False, "LOCKKEEPER_AUTO_MIGRATE": False,
        "SECRET_KEY": "test",
    })
    client = app.test_client()
    with app.app_context():
        for n in range(int(count)):
            lock_service().acquire(f"{prefix}:{n}", prefix, ttl=300)
        lock_service().acquire(f"{prefix}:0", "someone-else", ttl=300)
    assert client.get("/healthz").status_code == 200
    if render == "render":
        sys.stdout.write(client.get("/metrics").get_data(as_text=True))
        sys.stdout.write(client.get("/metrics/fleet").get_data(as_text=True))
    """
)


def run_worker(database_url, tmp_path, metrics_dir, prefix, count, render=False):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _WORKER,
            database_url,
            str(tmp_path / "instance"),
            prefix,
            str(count),
            "render" if render else "-",
        ],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_metrics_of_several_processes_add_up(database_url, tmp_path):
    metrics_dir = tmp_path / "metrics"

    run_worker(database_url, tmp_path, metrics_dir, "a", 3)
    exposition = run_worker(database_url, tmp_path, metrics_dir, "b", 2, render=True)

    samples = parse(exposition)
    acquisitions = "lockkeeper_acquisitions_total"
    assert value(samples, acquisitions, outcome="acquired") == 5
    assert value(samples, acquisitions, outcome="held") == 2
    requests = "lockkeeper_http_requests_total"
    assert value(samples, requests, method="GET", route="/healthz", status="200") == 2
    # Scrape-time gauges come from the database (its own target), once, not
    # summed per process.
    assert value(samples, "lockkeeper_locks", state="held") == 5
    schema = shown_revisions(required_revisions())
    info = value(samples, "lockkeeper_build_info", version=RELEASE, schema=schema)
    assert info == 1
    # The test process reads the same files and gets the same sums.
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))
    assert registry.get_sample_value(acquisitions, {"outcome": "acquired"}) == 5
    assert len(list(metrics_dir.glob("counter_*.db"))) == 2


@pytest.mark.slow
def test_gunicorn_with_two_workers_serves_summed_metrics_and_stops_cleanly(
    database_url, tmp_path
):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    head = shown_revisions(required_revisions())
    env = {
        **os.environ,
        "LOCKKEEPER_DATABASE_URL": database_url,
        "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
        "LOCKKEEPER_SECRET_KEY": "test-secret",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "python:app.ops.gunicorn_conf",
            "-w",
            "2",
            "-b",
            f"127.0.0.1:{port}",
            "app:create_app()",
        ],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    healthy = 0
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=30) as reply:
                    healthy += reply.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline, "gunicorn did not come up"
                time.sleep(0.2)

        def hit(_):
            with urllib.request.urlopen(f"{base}/healthz", timeout=30) as reply:
                return reply.status

        with ThreadPoolExecutor(8) as pool:
            healthy += sum(status == 200 for status in pool.map(hit, range(40)))

        # Whichever worker answers the scrape reports every worker's requests.
        for _ in range(4):
            with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
                samples = parse(reply.read().decode())
            assert (
                value(
                    samples,
                    "lockkeeper_http_requests_total",
                    method="GET",
                    route="/healthz",
                    status="200",
                )
                == healthy
                == 41
            )
            assert (
                value(samples, "lockkeeper_build_info", version=RELEASE, schema=head)
                == 1
            )
        with urllib.request.urlopen(f"{base}/metrics/fleet", timeout=30) as reply:
            fleet = parse(reply.read().decode())
        assert value(fleet, "lockkeeper_database_up") == 1
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            _, stderr = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            _, stderr = server.communicate()
    assert server.returncode == 0, stderr
    assert '"request_id"' in stderr  # the structured request lines
    assert "Traceback" not in stderr


def wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def slow_wsgi_app(environ, start_response):
    """Served by gunicorn in the graceful-shutdown test: /slow answers only once
    the test has seen gunicorn take the SIGTERM (the release file appears)."""
    if environ["PATH_INFO"] == "/slow":
        Path(os.environ["SLOW_STARTED_FILE"]).touch()
        wait_for_file(Path(os.environ["SLOW_RELEASE_FILE"]), timeout=60)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"done"]


@pytest.mark.slow
def test_gunicorn_finishes_requests_in_flight_on_sigterm(tmp_path):
    port = free_port()
    started = tmp_path / "slow-started"
    release = tmp_path / "slow-release"
    error_log = tmp_path / "gunicorn.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "python:app.ops.gunicorn_conf",
            "-w",
            "1",
            "-b",
            f"127.0.0.1:{port}",
            "--env",
            f"SLOW_STARTED_FILE={started}",
            "--env",
            f"SLOW_RELEASE_FILE={release}",
            "--error-logfile",
            str(error_log),
            "tests.test_ops:slow_wsgi_app",
        ],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")},
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                # gunicorn's master listens before its worker has loaded the
                # app: a request waits in the backlog until then, up to the
                # deadline, not a guessed few seconds.
                left = max(deadline - time.monotonic(), 1)
                urllib.request.urlopen(f"{base}/ready", timeout=left).close()
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline, "gunicorn did not come up"
                time.sleep(0.2)

        def slow_request():
            with urllib.request.urlopen(f"{base}/slow", timeout=30) as reply:
                return reply.status, reply.read()

        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(slow_request)
            wait_for_file(started, timeout=60)
            server.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 60
            while "Handling signal: term" not in error_log.read_text():
                assert time.monotonic() < deadline, "gunicorn did not take SIGTERM"
                time.sleep(0.02)
            assert not in_flight.done()  # still in flight after the signal
            release.touch()

            assert in_flight.result(timeout=60) == (200, b"done")
        _, stderr = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, stderr


# -- request logs -----------------------------------------------------------


def request_lines(caplog) -> list[dict]:
    return [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == LOGGER_NAME
    ]


def test_request_log_line_carries_the_callers_request_id(client, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    response = client.get("/healthz", headers={"X-Request-ID": "req-42.abc"})

    assert response.headers["X-Request-ID"] == "req-42.abc"
    [line] = request_lines(caplog)
    assert line["request_id"] == "req-42.abc"
    assert line["method"] == "GET"
    assert line["path"] == "/healthz"
    assert line["status"] == 200
    assert line["duration_ms"] >= 0
    assert line["actor"] is None


def test_request_without_id_gets_a_fresh_one_in_log_and_response(client, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    first = client.get("/healthz")
    second = client.get("/healthz", headers={"X-Request-ID": "bad id; forged"})

    ids = [line["request_id"] for line in request_lines(caplog)]
    assert ids == [first.headers["X-Request-ID"], second.headers["X-Request-ID"]]
    assert len(set(ids)) == 2
    assert all(len(i) == 32 for i in ids)
    assert "forged" not in caplog.text


def test_request_log_never_contains_tokens_cookies_or_query(client, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    client.get(
        "/healthz?token=lk_querysecret",
        headers={
            "Authorization": "Bearer lk_headersecret",
            "Cookie": "session=cookiesecret",
        },
    )

    [line] = request_lines(caplog)
    assert line["path"] == "/healthz"
    for secret in ("lk_querysecret", "lk_headersecret", "cookiesecret", "Bearer"):
        assert secret not in caplog.text


@pytest.mark.parametrize(
    "text",
    ["plain", 'quo"te \\ slash/', "ünïcødé ✓", "ctl\x00\x1f\x7f\n", "\u2028\ud800"],
)
@pytest.mark.parametrize("absent", [None, "x"])
def test_the_request_line_is_written_as_json_dumps_would(text, absent):
    line = {
        "event": "request",
        "request_id": text,
        "method": text,
        "path": text,
        "route": absent,
        "status": 404,
        "duration_ms": round(0.1234567 * 1000, 3),
        "actor": absent,
        "remote_addr": absent,
    }
    assert render_line(line) == json.dumps(line, ensure_ascii=False)


def test_api_request_log_names_the_token_not_the_token_itself(app, caplog):
    from app.auth.service import create_token

    with app.app_context():
        token = create_token("ci-worker")
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    response = app.test_client().post(
        "/api/v1/locks/job:1",
        json={"owner": "w1", "ttl": 30},
        headers={"Authorization": f"Bearer {token}"},
    )

    assert response.status_code == 200
    [line] = request_lines(caplog)
    assert line["actor"] == "ci-worker"
    assert line["route"].startswith("/api/v1/locks/<")
    assert token not in caplog.text


@pytest.mark.usefixtures("backend")
def test_sessions_and_heartbeats_are_counted_and_live_sessions_gauged(fake_app, clock):
    from lockkeeper_core.errors import SessionExpired

    client = fake_app.test_client()
    with fake_app.app_context():
        sessions = lock_service().sessions
        first = sessions.create("w-1", 10, token="ops")
        sessions.create("w-2", 30, token="ops")
        sessions.heartbeat(first.id, token="ops")
        sessions.heartbeat(first.id, token="ops")
        assert value(scrape(client, FLEET), "lockkeeper_live_sessions") == 2
        clock.advance(20)
        with pytest.raises(SessionExpired):
            sessions.heartbeat(first.id, token="ops")
        samples = scrape(client)
        fleet = scrape(client, FLEET)
    total = "lockkeeper_sessions_total"
    assert value(samples, total, outcome="created") == 2
    assert value(samples, total, outcome="heartbeat") == 2
    assert value(samples, total, outcome="heartbeat_expired") == 1
    assert value(fleet, "lockkeeper_live_sessions") == 1


@pytest.mark.usefixtures("backend")
def test_holders_used_of_their_limit_and_shared_grants_are_gauged(fake_app, clock):
    client = fake_app.test_client()
    with fake_app.app_context():
        service = lock_service()
        service.acquire("m:sem", "a", ttl=10, limit=4)
        service.acquire("m:sem", "b", ttl=30, limit=4)
        service.acquire("m:two", "a", ttl=30, limit=2)
        service.acquire("m:rw", "r", ttl=30, mode="shared")
        samples = scrape(client, FLEET)
        assert value(samples, "lockkeeper_places_used") == 3
        assert value(samples, "lockkeeper_places_limit") == 6
        assert value(samples, "lockkeeper_shared_grants") == 1
        clock.advance(20)
        samples = scrape(client, FLEET)
    assert value(samples, "lockkeeper_places_used") == 2
    assert value(samples, "lockkeeper_places_limit") == 6


# -- /metrics: by prefix family, build info, the fleet's own target ----------


@pytest.mark.usefixtures("backend")
def test_lost_locks_and_hold_times_are_counted_by_prefix_family(make_app, clock):
    app = make_app(LOCKKEEPER_CLOCK=clock, LOCKKEEPER_METRICS_PREFIXES="job:,billing:")
    client = app.test_client()
    with app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=10)
        service.acquire("zzz:1", "w1", ttl=10)
        clock.advance(4)
        service.release("job:1", "w1")
        service.release("zzz:1", "w1")
        service.acquire("billing:1", "w1", ttl=1)
        clock.advance(2)
        with pytest.raises(LockExpired):
            service.renew("billing:1", "w1", ttl=10)
        service.acquire("billing:1", "w2", ttl=10)  # took over the lapsed lock
        with pytest.raises(NotOwner):
            service.renew("billing:1", "w1", ttl=10)
        samples = scrape(client)
    lost = "lockkeeper_lost_locks_total"
    assert value(samples, lost, family="billing:", how="expired") == 1
    assert value(samples, lost, family="billing:", how="taken_over") == 1
    # Families with nothing lost are there, at 0, not absent.
    assert (lost, (("family", "job:"), ("how", "expired"))) in samples
    assert value(samples, "lockkeeper_took_over_total", family="billing:") == 1
    held = "lockkeeper_hold_seconds"
    assert value(samples, f"{held}_count", family="job:") == 1
    assert value(samples, f"{held}_sum", family="job:") == pytest.approx(4, abs=0.01)
    assert value(samples, f"{held}_count", family="other") == 1
    assert value(samples, f"{held}_bucket", family="job:", le="5.0") == 1
    assert value(samples, f"{held}_bucket", family="job:", le="1.0") == 0


def test_a_semaphore_holder_and_a_session_grant_record_their_hold_time(fake_app, clock):
    client = fake_app.test_client()
    with fake_app.app_context():
        service = lock_service()
        service.acquire("sem:1", "a", ttl=30, limit=2)
        session = service.sessions.create("s", 30, token="ops")
        service.acquire("ses:1", "s", session=session.id, token="ops")
        clock.advance(3)
        service.release("sem:1", "a")
        service.sessions.end(session.id, token="ops", actor="ops")
        samples = scrape(client)
    held = "lockkeeper_hold_seconds"
    assert value(samples, f"{held}_count", family="other") == 2
    assert value(samples, f"{held}_sum", family="other") == pytest.approx(6, abs=0.02)


def test_build_info_names_the_version_and_the_schema_the_code_needs(client):
    samples = scrape(client)
    (schema,) = required_revisions()
    assert value(samples, "lockkeeper_build_info", version=RELEASE, schema=schema) == 1
    # Per instance, not the database's gauges: those are /metrics/fleet's.
    assert not any(name == "lockkeeper_locks" for name, _ in samples)
    fleet = scrape(client, FLEET)
    assert value(fleet, "lockkeeper_database_schema_info", revision=schema) == 1
    assert not any(name.startswith("lockkeeper_http") for name, _ in fleet)


@pytest.mark.parametrize(
    "prefixes",
    [",".join(f"p{n}:" for n in range(51)), "job:,job:", "other", "x" * 65],
)
def test_a_prefix_family_list_past_its_bounds_is_refused(make_app, prefixes):
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="LOCKKEEPER_METRICS_PREFIXES"):
        make_app(LOCKKEEPER_METRICS_PREFIXES=prefixes)
