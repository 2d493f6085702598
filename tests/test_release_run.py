"""A release that reports how the work under the lock ended (``run``): kept with
its ``released`` event, on every database and both paths (the exclusive lock's
one statement, a semaphore's holder), and sent by ``lockkeeper exec``."""

from __future__ import annotations

import subprocess

import pytest
from lockkeeper_client import LockClient
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.validation import CONTROL_MESSAGE

from tests.dashboard_helpers import soup
from tests.test_api_locks import acquire, assert_problem, events_of
from tests.test_exec import LOCKKEEPER, child, exec_environment

RUN = {"exit_status": 3, "duration": 12.5, "host": "batch-07"}


@pytest.mark.usefixtures("backend")
def test_a_release_with_a_run_keeps_it_with_the_released_event(api):
    assert acquire(api).status_code == 200
    released = api.delete("/api/v1/locks/job:42", json={"owner": "w-1", "run": RUN})
    assert released.status_code == 204
    last = events_of(api)[0]
    assert last["action"] == "released"
    assert last["details"] == {"run": RUN}
    granted = events_of(api)[1]
    assert granted["details"] is None


@pytest.mark.usefixtures("backend")
def test_a_holder_of_a_semaphore_released_with_a_run_keeps_it_too(api):
    body = {"owner": "w-1", "ttl": 30, "limit": 2}
    assert api.post("/api/v1/locks/slots", json=body).status_code == 200
    released = api.delete("/api/v1/locks/slots", json={"owner": "w-1", "run": RUN})
    assert released.status_code == 204
    assert events_of(api, "slots")[0]["details"] == {"run": RUN}


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize(
    "run",
    [
        {"exit_status": "3"},
        {"duration": 1.0},
        {"exit_status": 0, "duration": -1},
        {"exit_status": 0, "host": "a\u0000b"},
        # Direction-reversing and zero-width: an owner refuses them, so a host does.
        {"exit_status": 0, "host": "batch\u202e70"},
        {"exit_status": 0, "host": "batch\u200b07"},
        {"exit_status": 0, "host": ""},
        {"exit_status": 0, "extra": 1},
        {"exit_status": 999},
    ],
)
def test_a_malformed_run_is_a_400_and_releases_nothing(api, run):
    assert acquire(api).status_code == 200
    refused = api.delete("/api/v1/locks/job:42", json={"owner": "w-1", "run": run})
    assert_problem(refused, 400)
    assert api.get("/api/v1/locks/job:42").status_code == 200


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize(
    "run",
    [
        {"exit_status": 0},
        {"exit_status": -9, "host": "batch-07"},
        {"exit_status": 255, "duration": 0},
        {"exit_status": 1, "duration": 31536000, "host": "h" * 255},
    ],
)
def test_every_run_the_schema_accepts_renders_on_the_lock_page(api, operator, run):
    """``duration`` and ``host`` are optional: a run without them still shows."""
    assert acquire(api).status_code == 200
    released = api.delete("/api/v1/locks/job:42", json={"owner": "w-1", "run": run})
    assert released.status_code == 204
    page = operator.get("/locks/job:42")
    assert page.status_code == 200
    text = soup(page).select_one("#last-run").get_text(" ", strip=True)
    assert f"exit {run['exit_status']}" in text
    assert ("after" in text) == ("duration" in run)
    assert (" on " in text) == ("host" in run)


def test_the_service_refuses_a_run_whose_host_is_not_printable(service):
    """Every face reaches the rule, not only the API's schema."""
    service.acquire("job:42", "w-1", ttl=30)
    with pytest.raises(InvalidInput) as refused:
        service.release(
            "job:42", "w-1", details={"run": {"exit_status": 0, "host": "a\u2066b"}}
        )
    assert refused.value.errors == [("run.host", CONTROL_MESSAGE)]
    assert service.get("job:42").owner == "w-1"


def test_exec_reports_how_its_command_ended_with_the_release(
    live_server, backend, tmp_path
):
    env = exec_environment(live_server, tmp_path / "untouched")
    ran = subprocess.run(
        [LOCKKEEPER, "exec", "nightly:report", "--", *child("raise SystemExit(3)")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 3, ran.stderr
    with LockClient(live_server.url, live_server.token) as client:
        events = client._http.get(
            "/events", params={"resource": "nightly:report"}
        ).json()["events"]
    released = next(e for e in events if e["action"] == "released")
    run = released["details"]["run"]
    assert run["exit_status"] == 3
    assert run["duration"] >= 0
    assert run["host"]
