"""Export formats: CSV header and quoting, JSON Lines, timestamps."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest
from lockkeeper_core.results import Event
from lockkeeper_core.state import Action

from app.audit.export import (
    COLUMNS,
    ROWS_PER_CHUNK,
    csv_chunks,
    event_record,
    jsonl_chunks,
)
from app.timestamps import rfc3339

AWKWARD = [
    'owner, with "quotes"',
    "reason with\nnewline, and, commas",
    'tricky "\r\n" =1+1',
]


def make_event(n: int, owner: str = "w-1", reason: str | None = None) -> Event:
    at = datetime(2026, 11, 30, 9, 0, 0, 123456, tzinfo=UTC)
    return Event(
        id=n,
        resource=f"job:{n}",
        action=Action.FORCE_RELEASED if reason else Action.ACQUIRED,
        owner=owner,
        previous_owner=None,
        fence=n,
        acquired_at=at,
        expires_at=at,
        actor="alice" if reason else None,
        reason=reason,
        occurred_at=at,
    )


def test_timestamps_are_rfc3339_utc_with_z():
    assert rfc3339(datetime(2026, 11, 30, 9, 0, tzinfo=UTC)) == (
        "2026-11-30T09:00:00.000000Z"
    )
    assert rfc3339(None) is None


def test_csv_starts_with_a_header_row():
    text = "".join(csv_chunks([]))
    assert text == ",".join(COLUMNS) + "\r\n"


def test_csv_quotes_commas_quotes_and_newlines_so_they_round_trip():
    exported = [
        make_event(i, owner=AWKWARD[i], reason=AWKWARD[2 - i]) for i in (0, 1, 2)
    ]
    text = "".join(csv_chunks(exported))
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert [r["owner"] for r in rows] == AWKWARD
    assert [r["reason"] for r in rows] == list(reversed(AWKWARD))
    assert rows[0]["occurred_at"] == "2026-11-30T09:00:00.123456Z"
    assert rows[0]["previous_owner"] == ""  # null is an empty field


def test_jsonl_is_one_json_object_per_line():
    exported = [make_event(i, owner=AWKWARD[i], reason=AWKWARD[i]) for i in (0, 1, 2)]
    lines = "".join(jsonl_chunks(exported)).split("\n")
    assert lines[-1] == ""  # every line, the last included, ends with \n
    records = [json.loads(line) for line in lines[:-1]]
    assert records == [event_record(e) for e in exported]
    assert [r["reason"] for r in records] == AWKWARD
    assert records[0]["previous_owner"] is None
    assert list(records[0]) == list(COLUMNS)


@pytest.mark.parametrize("chunker", [csv_chunks, jsonl_chunks])
def test_exports_are_produced_in_bounded_chunks(chunker):
    """A generator that never holds more than a chunk: feed it lazily and check it
    yields before it has consumed everything."""
    consumed = 0

    def events():
        nonlocal consumed
        for n in range(ROWS_PER_CHUNK * 3):
            consumed += 1
            yield make_event(n)

    stream = chunker(events())
    next(stream)
    assert consumed <= ROWS_PER_CHUNK
    rest = "".join(stream)
    assert rest.count("\n") >= ROWS_PER_CHUNK * 2
