"""The OpenAPI document is valid, covers exactly the routes of the API, and the
responses the API really sends conform to it."""

from __future__ import annotations

import re

import pytest
from jsonschema import Draft202012Validator
from lockkeeper_core.pagination import DEFAULT_PAGE, MAX_PAGE
from lockkeeper_core.state import Action, LockState
from lockkeeper_core.validation import MAX_NAME, RESOURCE_PATTERN
from openapi_spec_validator import validate

from app.api.openapi import openapi_document
from app.api.shapes import set_places
from app.config import DEFAULTS
from app.extensions import lock_service

# Not an operation: answers /api/v1/locks/a/b with a 400 naming the resource,
# because a resource never contains '/'.
UNDOCUMENTED_ENDPOINTS = {"api.resource_with_slash"}
IGNORED_METHODS = {"HEAD", "OPTIONS"}
HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def document() -> dict:
    return openapi_document()


def api_rules(app) -> dict[str, set[str]]:
    """``{"/api/v1/locks/{resource}": {"GET", ...}}`` from the URL map."""
    found: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/v1"):
            continue
        if rule.endpoint in UNDOCUMENTED_ENDPOINTS:
            continue
        template = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        found.setdefault(template, set()).update(rule.methods - IGNORED_METHODS)
    return found


def documented(document: dict) -> dict[str, set[str]]:
    return {
        path: {method.upper() for method in item if method in HTTP_METHODS}
        for path, item in document["paths"].items()
    }


def test_document_is_valid_openapi_3_1(document):
    validate(document)
    assert document["openapi"].startswith("3.1.")


def test_served_document_is_the_yaml_file(client, document):
    assert client.get("/api/v1/openapi.json").get_json() == document


def test_every_api_route_is_documented_and_every_documented_path_exists(app, document):
    assert api_rules(app) == documented(document)


def test_route_comparison_would_notice_a_new_route(app, document):
    """Guards the test above: a route added without documentation shows up."""
    from flask import Blueprint

    extra = Blueprint("api_extra", __name__, url_prefix="/api/v1")
    extra.add_url_rule("/locks/<resource>/steal", "steal", lambda resource: "")
    app.register_blueprint(extra)
    assert api_rules(app) != documented(document)


def test_schema_enums_and_limits_match_the_code(document):
    schemas = document["components"]["schemas"]
    assert set(schemas["Action"]["enum"]) == {action.value for action in Action}
    assert set(schemas["Lock"]["properties"]["state"]["enum"]) == {
        state.value for state in LockState
    }
    assert schemas["Ttl"]["maximum"] == DEFAULTS["LOCKKEEPER_MAX_TTL"]
    resource = schemas["Resource"]
    pattern = re.compile(resource["pattern"])
    for name in ("job:42", "a.b_c:d@e=f+g-h", "r" * 255):
        assert pattern.search(name)
        assert RESOURCE_PATTERN.fullmatch(name)
    for name in ("a/b", "a b", "jöb", ""):
        assert not pattern.search(name)
        assert not RESOURCE_PATTERN.fullmatch(name)
    assert resource["maxLength"] == 255
    limit = document["components"]["parameters"]["Limit"]["schema"]
    assert (limit["maximum"], limit["default"]) == (MAX_PAGE, DEFAULT_PAGE)
    assert schemas["Owner"]["maxLength"] == MAX_NAME
    for bounded in ("SetMembers", "SetResources"):
        assert schemas[bounded]["maxItems"] == DEFAULTS["LOCKKEEPER_MAX_SET_SIZE"]
    for places in set_places(schemas):
        assert places["maxProperties"] == DEFAULTS["LOCKKEEPER_MAX_SET_SIZE"]
        assert places["propertyNames"] == {"$ref": "#/components/schemas/Resource"}


def test_served_document_carries_the_configured_limits_and_requests_obey_it(
    make_app,
):
    """Requests are checked against the document served, so it says what this
    server allows, not the defaults."""
    from tests.conftest import ApiClient

    api = ApiClient(make_app(LOCKKEEPER_MAX_TTL=60.0, LOCKKEEPER_MAX_WAIT=0.5))
    served = api.client.get("/api/v1/openapi.json").get_json()
    schemas = served["components"]["schemas"]
    assert schemas["Ttl"]["maximum"] == 60
    assert schemas["AcquireRequest"]["properties"]["wait"]["maximum"] == 0.5
    response = api.post("/api/v1/locks/job:1", json={"owner": "w", "ttl": 61})
    assert response.status_code == 400
    assert response.get_json()["errors"] == [
        {"field": "ttl", "message": "must be at least 0.001 and at most 60"}
    ]


# -- responses conform to the document ----------------------------------------


class Conformance:
    """Checks real responses against the documented status, media type, headers
    and body schema of their operation."""

    def __init__(self, app, document: dict):
        self.app = app
        self.document = document
        self.seen: set[tuple[str, str, int]] = set()

    def check(self, response, method: str) -> None:
        path = response.request.path
        rule, _ = self.app.url_map.bind("localhost").match(
            path, method=method, return_rule=True
        )
        template = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        operation = self.document["paths"][template][method.lower()]
        status = str(response.status_code)
        assert status in operation["responses"], f"{method} {template} {status}"
        spec = self._resolve(operation["responses"][status])
        self.seen.add((method, template, response.status_code))
        for name, header in (spec.get("headers") or {}).items():
            header = self._resolve(header)
            if header.get("required"):
                assert name in response.headers, f"{method} {template}: {name}"
        content = spec.get("content")
        if not content:
            assert response.get_data() == b""
            return
        assert response.mimetype in content, (response.mimetype, list(content))
        schema = {
            **content[response.mimetype]["schema"],
            "components": self.document["components"],
        }
        Draft202012Validator(
            schema, format_checker=Draft202012Validator.FORMAT_CHECKER
        ).validate(response.get_json())

    def _resolve(self, item: dict) -> dict:
        while "$ref" in item:
            node = self.document
            for part in item["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            item = node
        return item


@pytest.mark.usefixtures("backend")
def test_responses_of_every_operation_conform_to_the_document(api, clock, document):
    conformance = Conformance(api.app, document)

    def call(method: str, path: str, **kwargs):
        response = api.open(method, path, **kwargs)
        conformance.check(response, method)
        return response

    lock = "/api/v1/locks/job:42"
    call("POST", lock, json={"owner": "w-1", "ttl": 30})
    call("POST", lock, json={"owner": "w-2"})
    call("POST", lock, json={"owner": "w-2", "ttl": "soon"})
    call("POST", lock, data="{}", content_type="text/plain")
    call("POST", lock, data="x" * 70_000, content_type="application/json")
    call("GET", lock)
    call("GET", "/api/v1/locks/job:7")
    call("GET", "/api/v1/locks/bad*name")
    call("PATCH", lock, json={"owner": "w-1", "ttl": 60})
    call("PATCH", lock, json={"owner": "w-2"})
    call("PATCH", "/api/v1/locks/job:7", json={"owner": "w-1"})
    call("DELETE", lock, json={"owner": "w-2"})
    call("GET", "/api/v1/locks?state=held&limit=1")
    call("GET", "/api/v1/locks?limit=x")
    call("GET", "/api/v1/locks/job:42/events?limit=1")
    call("GET", "/api/v1/locks/job:42/holders")
    call("POST", "/api/v1/locks/sem:1", json={"owner": "w-1", "limit": 2})
    call("POST", "/api/v1/locks/sem:1", json={"owner": "w-2", "limit": 3})
    call("POST", "/api/v1/locks/sem:1", json={"owner": "w-2", "limit": "x"})
    call("GET", "/api/v1/locks/sem:1/holders")
    both = [{"resource": "acct:1"}, {"resource": "acct:2", "mode": "shared"}]
    call("POST", "/api/v1/sets", json={"owner": "w-1", "members": both})
    call("POST", "/api/v1/sets", json={"owner": "w-2", "members": both[:1]})
    call("POST", "/api/v1/sets", json={"owner": "w-2", "members": both * 2})
    names = ["acct:1", "acct:2"]
    call("PATCH", "/api/v1/sets", json={"owner": "w-1", "resources": names})
    call("PATCH", "/api/v1/sets", json={"owner": "w-2", "resources": names})
    call("DELETE", "/api/v1/sets", json={"owner": "w-1", "resources": names})
    call("GET", "/api/v1/events?action=renewed")
    call("GET", "/api/v1/events?since=never")
    fence = call("GET", lock).get_json()["fence"]
    call("GET", f"{lock}?fence={fence}")
    call("GET", f"{lock}?fence={fence + 1}")
    call("GET", f"{lock}?fence=0")
    call("DELETE", f"{lock}?owner=w-1")
    call("DELETE", f"{lock}?owner=w-1")
    call("GET", f"{lock}?fence={fence}")
    with api.app.app_context():
        lock_service().freeze("job:", actor="alice", reason="migration")
    call("POST", lock, json={"owner": "w-1"})
    call("GET", "/api/v1/freezes")
    call("GET", "/api/v1/freezes?x=1")
    session = call("POST", "/api/v1/sessions", json={"owner": "w-7", "ttl": 15})
    sessions = f"/api/v1/sessions/{session.get_json()['id']}"
    call("POST", "/api/v1/sessions", json={"owner": "w-7", "ttl": 0})
    call("POST", "/api/v1/locks/job:s", json={"owner": "w-7", "session": "x"})
    call("GET", sessions)
    call("PATCH", sessions)
    call("PATCH", "/api/v1/sessions/unknown")
    call("GET", "/api/v1/sessions/unknown")
    call("DELETE", "/api/v1/sessions/unknown")
    call("DELETE", sessions)
    call("GET", "/api/v1/openapi.json")
    conformance.check(api.client.get("/api/v1/locks"), "GET")

    statuses = {status for _, _, status in conformance.seen}
    assert statuses == {200, 201, 204, 400, 401, 403, 404, 409, 413, 415, 423}
    operations = {(method, template) for method, template, _ in conformance.seen}
    assert operations == {
        (method, path)
        for path, methods in documented(document).items()
        for method in methods
    }
