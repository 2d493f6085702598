"""The audit log over the API: per resource and in full, filters and cursors."""

from __future__ import annotations

import base64

import pytest

pytestmark = pytest.mark.usefixtures("backend")

EVENTS = "/api/v1/events"
FOLLOW = "/api/v1/events?follow=true"

EVENT_FIELDS = {
    "id",
    "resource",
    "action",
    "owner",
    "previous_owner",
    "fence",
    "acquired_at",
    "expires_at",
    "actor",
    "token",
    "reason",
    "occurred_at",
    "mode",
    "details",
    "set",
}


def get_events(api, path: str) -> dict:
    response = api.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def actions(page: dict) -> list[str]:
    return [event["action"] for event in page["events"]]


@pytest.fixture
def history(api, clock):
    """job:1 acquired, renewed, released by w-1; job:2 acquired by w-2 via "bot"."""
    api.post("/api/v1/locks/job:1", json={"owner": "w-1", "ttl": 30})
    clock.advance(10)
    api.patch("/api/v1/locks/job:1", json={"owner": "w-1", "ttl": 30})
    clock.advance(10)
    api.delete("/api/v1/locks/job:1?owner=w-1")
    clock.advance(10)
    api.with_token("bot").post("/api/v1/locks/job:2", json={"owner": "w-2"})
    return api


def test_resource_events_are_newest_first_with_every_field(history):
    page = get_events(history, "/api/v1/locks/job:1/events")
    assert actions(page) == ["released", "renewed", "acquired"]
    assert page["next_cursor"] is None
    for event in page["events"]:
        assert set(event) == EVENT_FIELDS
        assert event["resource"] == "job:1"
        assert event["actor"] == "worker"
        assert event["token"] == "worker"
        assert event["occurred_at"].endswith("Z")
    acquired = page["events"][-1]
    assert acquired["owner"] == "w-1"
    assert acquired["acquired_at"] == "2026-11-30T09:00:00.000000Z"
    assert acquired["expires_at"] == "2026-11-30T09:00:30.000000Z"
    assert isinstance(acquired["fence"], int)


def test_events_of_a_never_locked_resource_are_an_empty_page(api):
    assert get_events(api, "/api/v1/locks/job:9/events") == {
        "events": [],
        "next_cursor": None,
    }


def test_resource_events_page_with_cursor(history):
    first = get_events(history, "/api/v1/locks/job:1/events?limit=2")
    assert actions(first) == ["released", "renewed"]
    rest = get_events(
        history, f"/api/v1/locks/job:1/events?limit=2&cursor={first['next_cursor']}"
    )
    assert actions(rest) == ["acquired"]
    assert rest["next_cursor"] is None


def test_all_events_are_newest_first(history):
    page = get_events(history, "/api/v1/events")
    assert [(e["resource"], e["action"]) for e in page["events"]] == [
        ("job:2", "acquired"),
        ("job:1", "released"),
        ("job:1", "renewed"),
        ("job:1", "acquired"),
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("resource=job:2", ["acquired"]),
        ("prefix=job:", ["acquired", "released", "renewed", "acquired"]),
        ("prefix=job:1", ["released", "renewed", "acquired"]),
        ("owner=w-2", ["acquired"]),
        ("action=renewed", ["renewed"]),
        ("actor=bot", ["acquired"]),
        ("actor=worker&action=acquired", ["acquired"]),
    ],
)
def test_all_events_filter(history, query, expected):
    assert actions(get_events(history, f"/api/v1/events?{query}")) == expected


def test_all_events_filter_by_time_range(history):
    everything = get_events(history, "/api/v1/events")["events"]
    middle = everything[2]["occurred_at"]  # the renewal
    newer = get_events(history, f"/api/v1/events?since={middle}")
    assert actions(newer) == ["acquired", "released", "renewed"]
    older = get_events(history, f"/api/v1/events?until={middle}")
    assert actions(older) == ["acquired"]


def test_time_range_accepts_offsets_and_lowercase_z(api):
    for value in ("2026-11-30T10:00:00%2B01:00", "2026-11-30t09:00:00.5z"):
        assert get_events(api, f"/api/v1/events?since={value}")["events"] == []


def test_all_events_page_with_cursor(history):
    first = get_events(history, "/api/v1/events?limit=3")
    assert len(first["events"]) == 3
    rest = get_events(history, f"/api/v1/events?limit=3&cursor={first['next_cursor']}")
    assert [e["id"] for e in rest["events"]] == [
        e["id"] for e in get_events(history, "/api/v1/events")["events"][3:]
    ]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v1/events?since=yesterday", "since"),
        ("/api/v1/events?since=2026-11-30", "since"),
        ("/api/v1/events?until=2026-11-30T09:00:00", "until"),
        ("/api/v1/events?since=2026-13-01T00:00:00Z", "since"),
        ("/api/v1/events?since=0001-01-01T00:00:00%2B01:00", "since"),
        (
            "/api/v1/events?since=2026-12-01T00:00:00Z&until=2026-11-01T00:00:00Z",
            "until",
        ),
        ("/api/v1/events?action=stolen", "action"),
        ("/api/v1/events?resource=a/b", "resource"),
        ("/api/v1/events?limit=0", "limit"),
        ("/api/v1/events?limit=1.5", "limit"),
        ("/api/v1/events?cursor=%%%", "cursor"),
        ("/api/v1/events?order=asc", "order"),
        ("/api/v1/locks/job:1/events?limit=501", "limit"),
        ("/api/v1/locks/job:1/events?cursor=eyJ4IjoxfQ", "cursor"),
        ("/api/v1/locks/job:1/events?owner=w-1", "owner"),
        ("/api/v1/locks/bad*name/events", "resource"),
    ],
)
def test_bad_query_is_400_naming_the_parameter(api, path, field):
    response = api.get(path)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    assert field in [error["field"] for error in response.get_json()["errors"]]


# Each is a digit to str.isdigit() or to int(); none is an ASCII integer.
NOT_ASCII_INTEGERS = ["²", "1³", "١٢", "１", " 12", "1_2", "+12", "12\n"]


def refused_field(api, path: str, **kwargs) -> str | None:
    """The field a 400 names, or None for any other answer. A stream that opened
    by mistake is closed unread (reading it would wait for events forever)."""
    response = api.get(path, **kwargs)
    try:
        if response.status_code != 400:
            return None
        return response.get_json()["errors"][0]["field"]
    finally:
        response.close()


# An HTTP header cannot carry a newline at all.
@pytest.mark.parametrize("value", [v for v in NOT_ASCII_INTEGERS if "\n" not in v])
def test_a_last_event_id_that_is_not_ascii_digits_is_a_400(api, value):
    headers = {"Last-Event-ID": value}
    assert refused_field(api, FOLLOW, headers=headers) == "Last-Event-ID"


@pytest.mark.parametrize("value", NOT_ASCII_INTEGERS)
def test_a_followed_cursor_that_is_not_ascii_digits_is_a_400(api, value):
    query = {"follow": "true", "cursor": value}
    assert refused_field(api, EVENTS, query_string=query) == "cursor"


@pytest.mark.parametrize("value", NOT_ASCII_INTEGERS)
def test_an_integer_query_parameter_that_is_not_ascii_digits_is_a_400(api, value):
    assert refused_field(api, EVENTS, query_string={"limit": value}) == "limit"


@pytest.mark.parametrize("position", ['{"id": "12"}', '{"id": 1.5}', '{"id": true}'])
def test_a_followed_cursor_whose_event_id_is_not_a_json_integer_is_a_400(api, position):
    """The id inside a followed cursor is read as every other cursor's is."""
    cursor = base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")
    query = {"follow": "true", "cursor": cursor}
    assert refused_field(api, EVENTS, query_string=query) == "cursor"


def test_extreme_but_valid_time_range_is_accepted(api):
    path = "/api/v1/events?since=1000-01-01T00:00:00Z&until=9999-12-31T23:59:59Z"
    assert get_events(api, path)["events"] == []
