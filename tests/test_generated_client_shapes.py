"""The API driven exactly as a client generated from ``/api/v1/openapi.json`` by
openapi-python-client drives it, against a live server.

Such a client percent-encodes every path parameter (``quote(resource,
safe="")``, so a ``/`` travels as ``%2F``), sends ``Content-Type:
application/json`` on every operation that has a body even when it sends none
(release by ``?owner=``), and drops query parameters it was not given.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest

from app.api.openapi import openapi_document

JSON = {"Content-Type": "application/json"}


class GeneratedShapes:
    """One function per operation, each building its request as the generated
    ``_get_kwargs`` does."""

    def __init__(self, client: httpx.Client):
        self.client = client

    def _send(self, method, template, resource=None, *, body=None, typed=False, **q):
        url = template.format(resource=quote(str(resource), safe=""))
        params = {k: v for k, v in q.items() if v is not None}
        headers = dict(JSON) if typed else {}
        return self.client.request(
            method, url, params=params, headers=headers, json=body
        )

    def acquire(self, resource, owner, ttl=None):
        body = {"owner": owner} | ({"ttl": ttl} if ttl is not None else {})
        return self._send("POST", LOCK, resource, body=body, typed=True)

    def renew(self, resource, owner, ttl=None):
        body = {"owner": owner} | ({"ttl": ttl} if ttl is not None else {})
        return self._send("PATCH", LOCK, resource, body=body, typed=True)

    def get(self, resource, fence=None):
        return self._send("GET", LOCK, resource, fence=fence)

    def release(self, resource, *, body_owner=None, owner=None):
        body = {"owner": body_owner} if body_owner is not None else None
        return self._send("DELETE", LOCK, resource, body=body, typed=True, owner=owner)

    def list_locks(self, **query):
        return self._send("GET", "/api/v1/locks", **query)

    def resource_events(self, resource, limit=None):
        return self._send("GET", EVENTS, resource, limit=limit)


LOCK = "/api/v1/locks/{resource}"
EVENTS = "/api/v1/locks/{resource}/events"


@pytest.fixture
def generated(live_server):
    with httpx.Client(
        base_url=live_server.url, headers=live_server.auth_headers, timeout=10
    ) as client:
        yield GeneratedShapes(client)


def test_the_templates_are_the_documented_paths():
    paths = openapi_document()["paths"]
    assert set(paths[LOCK]) >= {"post", "patch", "get", "delete"}
    assert "get" in paths[EVENTS]


def test_a_generated_client_runs_every_lock_operation(generated, live_server):
    granted = generated.acquire("job:42", "w-1", ttl=30)
    assert granted.status_code == 200, granted.text
    fence = granted.json()["lock"]["fence"]

    refused = generated.acquire("job:42", "w-2")
    assert refused.status_code == 409
    assert refused.json()["lock"]["owner"] == "w-1"

    renewed = generated.renew("job:42", "w-1", ttl=60)
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["fence"] == fence

    assert generated.get("job:42").json()["owner"] == "w-1"
    assert generated.get("job:42", fence=fence).status_code == 200
    page = generated.list_locks(state="held", limit=10)
    assert [lock["resource"] for lock in page.json()["locks"]] == ["job:42"]
    events = generated.resource_events("job:42", limit=10).json()["events"]
    assert [event["action"] for event in events] == ["renewed", "acquired"]

    # By query: a JSON-typed request with no body at all.
    released = generated.release("job:42", owner="w-1")
    assert released.status_code == 204, released.text
    assert generated.get("job:42").status_code == 404

    # By body.
    assert generated.acquire("job:7", "w-1").status_code == 200
    released = generated.release("job:7", body_owner="w-1")
    assert released.status_code == 204, released.text
    assert generated.list_locks().json()["locks"] == []


@pytest.mark.parametrize(
    ("call", "resource"),
    [
        ("get", "job:42/events"),
        ("acquire", "job:42/events"),
        ("renew", "job:42/events"),
        ("release", "job:42/events"),
        ("resource_events", "job:42/x"),
        ("get", "/job:42"),
        ("acquire", "/job:42"),
    ],
)
def test_an_encoded_slash_is_the_documented_400(generated, call, resource):
    assert generated.acquire("job:42", "w-1").status_code == 200
    operation = getattr(generated, call)
    args = () if call in {"get", "resource_events"} else ("w-1",)
    if call == "release":
        response = operation(resource, owner="w-1")
    else:
        response = operation(resource, *args)
    assert "%2F" in str(response.request.url)
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    assert [e["field"] for e in response.json()["errors"]] == ["resource"]
    assert generated.get("job:42").json()["owner"] == "w-1"
