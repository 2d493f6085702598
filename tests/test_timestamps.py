"""The one timestamp parser and formatter every face uses (app/timestamps.py)."""

from datetime import UTC, datetime

import pytest

from app.timestamps import MissingOffset, parse_rfc3339, rfc3339
from tests.dashboard_helpers import log_in, make_user

NINE = datetime(2026, 11, 30, 9, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T09:00:00Z", NINE),
        ("2026-11-30t09:00:00z", NINE),
        ("2026-11-30 09:00:00Z", NINE),
        ("2026-11-30T09:00Z", NINE),  # seconds left out, as HTML time fields do
        ("2026-11-30T10:00:00+01:00", NINE),
        ("2026-11-30T04:30:00-04:30", NINE),
        ("2026-11-30T09:00:00-00:00", NINE),  # RFC 3339: UTC, local zone unknown
        ("2026-11-30T09:00:00.5Z", NINE.replace(microsecond=500000)),
        # Past microseconds the fraction is cut, never rounded up a microsecond.
        ("2026-11-30T09:00:00.1234569Z", NINE.replace(microsecond=123456)),
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
        ("9999-12-31T23:59:59.999999Z", datetime.max.replace(tzinfo=UTC)),
        ("2028-02-29T00:00:00Z", datetime(2028, 2, 29, tzinfo=UTC)),
    ],
)
def test_rfc3339_parses_to_aware_utc(text, expected):
    parsed = parse_rfc3339(text)
    assert parsed == expected
    assert parsed.utcoffset().total_seconds() == 0


@pytest.mark.parametrize(
    "text", ["2026-11-30T09:00:00", "2026-11-30T09:00", "2026-11-30 09:00:00.25"]
)
def test_a_timestamp_without_an_offset_is_rejected_saying_so(text):
    with pytest.raises(MissingOffset, match=r"must include a UTC offset \(Z for UTC\)"):
        parse_rfc3339(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "2026-11-30",  # a date names no instant
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2027-02-29T00:00:00Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T23:59:60Z",  # a leap second: Python has no such instant
        "2026-11-30T09:00:00+0100",  # ISO 8601 basic offset, not RFC 3339
        "2026-11-30T09:00:00+01",
        "2026-11-30T09:00:00+24:00",
        "2026-11-30T09:00:00.Z",
        "2026-11-30T09:00:00Z\n",
        " 2026-11-30T09:00:00Z",
        "2026-11-30T09:00:00Z\x00",
        "\uff12\uff10\uff12\uff16-11-30T09:00:00Z",  # full-width digits
        "2026-11-30T09:00:00." + "1" * 100 + "Z",
    ],
)
def test_anything_else_is_not_a_timestamp(text):
    with pytest.raises(ValueError, match="must be an RFC 3339 timestamp like") as info:
        parse_rfc3339(text)
    assert not isinstance(info.value, MissingOffset)


@pytest.mark.parametrize(
    "text",
    [
        "0001-01-01T00:00:00+01:00",
        "0001-01-01T00:00+14:00",
        "9999-12-31T23:59:59-01:00",
    ],
)
def test_an_instant_outside_years_1_to_9999_in_utc_is_out_of_range(text):
    with pytest.raises(ValueError, match="is out of range"):
        parse_rfc3339(text)


def test_not_a_string_is_not_a_timestamp():
    with pytest.raises(ValueError, match="must be an RFC 3339 timestamp"):
        parse_rfc3339(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "moment",
    [
        NINE.replace(microsecond=123456),
        datetime(2026, 11, 30, 10, 30, tzinfo=UTC).astimezone(),
        datetime(1, 1, 1, tzinfo=UTC),
    ],
)
def test_what_rfc3339_writes_parses_back_to_the_same_instant(moment):
    assert parse_rfc3339(rfc3339(moment)) == moment
    assert parse_rfc3339(rfc3339(moment, timespec="milliseconds")) == moment.replace(
        microsecond=moment.microsecond // 1000 * 1000
    )


def test_every_face_refuses_a_timestamp_without_an_offset_but_the_utc_form(
    api, fake_app
):
    """The API and the CLI name the missing offset; the audit page's
    ``datetime-local`` fields are labelled UTC and read so."""
    make_user(fake_app, "vera", role="viewer")
    viewer = fake_app.test_client()
    assert log_in(viewer, "vera").status_code in (302, 303)
    response = api.get("/api/v1/events", query_string={"since": "2026-11-30T09:00:00"})
    assert response.status_code == 400
    assert response.get_json()["errors"] == [
        {
            "field": "since",
            "message": "must include a UTC offset (Z for UTC), "
            "like 2026-11-30T09:00:00Z",
        }
    ]
    result = fake_app.test_cli_runner().invoke(
        args=["events", "export", "--format", "jsonl", "--since", "2026-11-30T09:00"]
    )
    assert result.exit_code == 2
    assert "must include a UTC offset" in result.output
    page = viewer.get("/audit", query_string={"since": "2026-11-30T09:00"})
    assert page.status_code == 200
