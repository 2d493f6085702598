"""Malformed requests: each gets a clear 4xx problem, none a 500, and none changes
anything, on every database."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("backend")

URL = "/api/v1/locks/job:42"


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["status"] == status
    return body


def error_fields(body: dict) -> list[str]:
    return [error["field"] for error in body["errors"]]


def assert_nothing_changed(api) -> None:
    assert api.get("/api/v1/locks").get_json()["locks"] == []
    assert api.get("/api/v1/events").get_json()["events"] == []


def post_raw(api, data: bytes | str, content_type="application/json", url=URL):
    return api.post(url, data=data, content_type=content_type)


# -- bodies -------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml"],
)
def test_non_json_body_is_415(api, content_type):
    response = post_raw(api, '{"owner": "w-1"}', content_type=content_type)
    assert_problem(response, 415)
    assert_nothing_changed(api)


def test_body_over_the_size_limit_is_413(api):
    padding = "x" * (api.app.config["MAX_CONTENT_LENGTH"] + 1)
    response = api.post(URL, json={"owner": "w-1", "pad": padding})
    assert_problem(response, 413)
    assert_nothing_changed(api)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{", "truncated"),
        ('{"owner": "w-1",}', "trailing comma"),
        ('{"owner": "w-1", "ttl": NaN}', "NaN"),
        ('{"owner": "w-1", "ttl": Infinity}', "Infinity"),
        ('{"owner": "w-1", "ttl": -Infinity}', "-Infinity"),
        ('{"owner": "w-1", "ttl": 1e999}', "overflows to inf"),
        ('{"owner": "w-1", "ttl": 1' + "0" * 5000 + "}", "too many digits"),
        ('{"owner": ' + "[" * 20_000 + "]" * 20_000 + "}", "nested too deeply"),
        ('["w-1", 30]', "a list"),
        ('"w-1"', "a string"),
        ("30", "a number"),
        ("null", "null"),
    ],
)
def test_body_that_is_not_a_json_object_is_400(api, raw, why):
    body = assert_problem(post_raw(api, raw), 400)
    assert error_fields(body) == ["body"], why
    assert_nothing_changed(api)


@pytest.mark.parametrize("content_type", [None, "application/json", "text/plain"])
def test_an_empty_body_is_no_body_whatever_its_type(api, content_type):
    """A generated client sends ``Content-Type: application/json`` and no bytes
    on DELETE; that is no body, not a malformed one."""
    body = assert_problem(api.post(URL, data=b"", content_type=content_type), 400)
    assert body["errors"] == [{"field": "owner", "message": "is required"}]
    api.post(URL, json={"owner": "w-1"})
    response = api.delete(f"{URL}?owner=w-1", data=b"", content_type=content_type)
    assert response.status_code == 204, response.get_data(as_text=True)
    assert_problem(api.get(URL), 404)


def test_body_with_invalid_utf8_is_400(api):
    body = assert_problem(post_raw(api, b'{"owner": "w-\xff\xfe"}'), 400)
    assert body["errors"] == [{"field": "body", "message": "is not valid UTF-8"}]
    assert_nothing_changed(api)


def test_unknown_fields_are_rejected_by_name(api):
    response = api.post(URL, json={"owner": "w-1", "tll": 30, "force": True})
    body = assert_problem(response, 400)
    assert sorted(error_fields(body)) == ["force", "tll"]
    assert_nothing_changed(api)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"owner": 7}, "owner"),
        ({"owner": None}, "owner"),
        ({"owner": ["w-1"]}, "owner"),
        ({"owner": ""}, "owner"),
        ({"owner": "x" * 256}, "owner"),
        ({"owner": "w\u00001"}, "owner"),
        ({"owner": "w\n1"}, "owner"),
        ({"owner": "w\u00851"}, "owner"),
        ({"owner": "w-1", "ttl": "30"}, "ttl"),
        ({"owner": "w-1", "ttl": True}, "ttl"),
        ({"owner": "w-1", "ttl": 0}, "ttl"),
        ({"owner": "w-1", "ttl": -5}, "ttl"),
        ({"owner": "w-1", "ttl": 86400.5}, "ttl"),
        ({"owner": "w-1", "ttl": 10**400}, "ttl"),
        ({"owner": "w-1", "ttl": None}, "ttl"),
        ({"ttl": 30}, "owner"),
        ({}, "owner"),
    ],
)
def test_bad_field_is_400_naming_it(api, payload, field):
    body = assert_problem(api.post(URL, json=payload), 400)
    assert field in error_fields(body)
    assert_nothing_changed(api)


def test_every_bad_field_is_named_at_once(api):
    body = assert_problem(api.post(URL, json={"owner": 1, "ttl": "x"}), 400)
    assert sorted(error_fields(body)) == ["owner", "ttl"]


def test_renew_and_release_parse_bodies_the_same_way(api):
    assert_problem(api.patch(URL, data="NaN", content_type="application/json"), 400)
    assert_problem(api.patch(URL, data="{}", content_type="text/plain"), 415)
    assert_problem(api.delete(URL, data="[1]", content_type="application/json"), 400)
    assert_problem(api.delete(URL, data="x", content_type="text/plain"), 415)
    body = assert_problem(api.delete(URL, json={"owner": "w-1", "ttl": 3}), 400)
    assert error_fields(body) == ["ttl"]


# -- paths --------------------------------------------------------------------


@pytest.mark.parametrize(
    "resource",
    ["job%0042", "job%0A42", "job%7F", "job%C2%85", "%00"],
)
def test_control_characters_in_path_are_400(api, resource):
    response = api.post(f"/api/v1/locks/{resource}", json={"owner": "w-1"})
    assert_problem(response, 400)
    assert_problem(api.get(f"/api/v1/locks/{resource}"), 400)
    assert_nothing_changed(api)


def test_invalid_utf8_in_path_is_400(api):
    # A WSGI server hands over the raw path bytes as latin-1 (PEP 3333).
    raw_path = "/api/v1/locks/job\xff\xfe"
    response = api.post(
        URL, json={"owner": "w-1"}, environ_overrides={"PATH_INFO": raw_path}
    )
    assert error_fields(assert_problem(response, 400)) == ["path"]
    assert_nothing_changed(api)


@pytest.mark.parametrize("resource", ["job 42", "job*", "jöb", "job%2542", "j%23b"])
def test_resource_outside_the_alphabet_is_400(api, resource):
    response = api.post(f"/api/v1/locks/{resource}", json={"owner": "w-1"})
    assert error_fields(assert_problem(response, 400)) == ["resource"]
    assert_nothing_changed(api)


def test_resource_of_ten_thousand_characters_is_400(api):
    response = api.post(f"/api/v1/locks/{'r' * 10_000}", json={"owner": "w-1"})
    assert error_fields(assert_problem(response, 400)) == ["resource"]
    assert_nothing_changed(api)


def test_resource_of_255_characters_is_fine(api):
    resource = "r" * 255
    response = api.post(f"/api/v1/locks/{resource}", json={"owner": "w-1"})
    assert response.status_code == 200
    assert response.get_json()["lock"]["resource"] == resource


@pytest.mark.parametrize("method", ["GET", "POST", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ["/api/v1/locks/a/b", "/api/v1/locks/job%2F42"])
def test_resource_with_a_slash_is_400_not_404(api, method, path):
    body = assert_problem(api.open(method, path, json={"owner": "w-1"}), 400)
    assert error_fields(body) == ["resource"]
    assert_nothing_changed(api)


@pytest.mark.parametrize("method", ["GET", "POST", "PATCH", "DELETE"])
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/locks/job:42%2Fevents",
        "/api/v1/locks/job:42%2fevents?limit=1",
        "/api/v1/locks/job:42%2F",
        "/api/v1/locks/%2Fjob:42",
    ],
)
def test_an_encoded_slash_is_the_documented_400_on_every_route(api, method, path):
    """WSGI servers decode %2F into a separator before routing, so
    ``job:42%2Fevents`` would be the events of ``job:42``; the raw path says
    otherwise."""
    api.post(URL, json={"owner": "w-1"})
    response = api.open(method, path, json={"owner": "w-1"})
    assert error_fields(assert_problem(response, 400)) == ["resource"]
    assert api.get(URL).get_json()["owner"] == "w-1"


def test_events_route_still_wins_over_the_slash_check(api):
    assert api.get("/api/v1/locks/job:42/events").status_code == 200


def test_writing_to_the_events_route_is_405(api):
    response = api.post("/api/v1/locks/job:42/events", json={"owner": "w-1"})
    assert_problem(response, 405)
    assert "GET" in response.headers["Allow"]


def test_unknown_api_path_is_a_404_problem(api):
    assert_problem(api.get("/api/v1/nope"), 404)
    assert_problem(api.get("/api/v1/locks/"), 404)


def test_unsupported_method_is_a_405_problem_with_allow(api):
    response = api.open("PUT", URL, json={"owner": "w-1"})
    assert_problem(response, 405)
    assert {"GET", "POST", "PATCH", "DELETE"} <= set(
        response.headers["Allow"].replace(" ", "").split(",")
    )


# -- query strings ------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v1/locks?prefix=job%00", "prefix"),
        ("/api/v1/locks?owner=w%0A1", "owner"),
        ("/api/v1/events?actor=%1B[31m", "actor"),
        ("/api/v1/events?resource=job%00", "resource"),
        ("/api/v1/locks?prefix=%FF", "prefix"),
        ("/api/v1/locks?%00=1", "query"),
        ("/api/v1/locks?%FF=1", "query"),
    ],
)
def test_control_characters_or_bad_utf8_in_query_are_400_naming_it(api, path, field):
    """A bad value is named by its parameter; a bad name names nothing."""
    assert error_fields(assert_problem(api.get(path), 400)) == [field]


def test_release_with_control_character_owner_in_query_is_400(api):
    api.post(URL, json={"owner": "w-1"})
    body = assert_problem(api.delete(f"{URL}?owner=w-1%00"), 400)
    assert error_fields(body) == ["owner"]
    assert api.get(URL).status_code == 200


def test_unknown_query_parameter_is_400_by_name(api):
    body = assert_problem(api.post(f"{URL}?ttl=30", json={"owner": "w-1"}), 400)
    assert error_fields(body) == ["ttl"]
    assert_nothing_changed(api)
