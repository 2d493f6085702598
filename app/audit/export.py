"""Audit exports: events as CSV or JSON Lines, produced row by row.

Both formats are generators of text chunks fed by ``iter_events`` (which streams
with ``yield_per``), so memory stays flat however many events match. The web view
and ``lockkeeper events export`` share them, so both emit the same rows. JSON Lines
carries every value as it is; CSV cells that a spreadsheet would run as a formula
are prefixed with ``'``."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

from lockkeeper_core import wire
from lockkeeper_core.results import Event

COLUMNS = (
    "id",
    "occurred_at",
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
    "mode",
    "details",
    "set",
)
# A spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV
# injection"): an owner like =HYPERLINK(...) would act in the auditor's sheet.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Rows gathered per chunk handed to the server: far fewer writes than one per row,
# still a few hundred kilobytes at most.
ROWS_PER_CHUNK = 500


class ExportFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"

    @property
    def mimetype(self) -> str:
        return {
            ExportFormat.CSV: "text/csv",
            ExportFormat.JSONL: "application/jsonl",
        }[self]


def event_record(event: Event) -> dict[str, Any]:
    """The event as plain JSON-ready values, keyed in ``COLUMNS`` order (the
    embedded mode's stream gives the same object)."""
    return wire.event_to_json(event)


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell that no spreadsheet evaluates: text that would start
    a formula gets a leading ``'`` (shown as text, the value otherwise intact)."""
    if value is None:
        return ""
    if isinstance(value, dict):
        value = json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_chunks(events: Iterable[Event]) -> Iterator[str]:
    """A header row, then one row per event (RFC 4180 quoting; empty = null;
    formula-like text neutralised by ``csv_cell``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    pending = 1
    for event in events:
        record = event_record(event)
        writer.writerow(csv_cell(record[c]) for c in COLUMNS)
        pending += 1
        if pending >= ROWS_PER_CHUNK:
            yield _drain(buffer)
            pending = 0
    yield _drain(buffer)


def jsonl_chunks(events: Iterable[Event]) -> Iterator[str]:
    """One JSON object per line; newlines inside values are escaped by JSON."""
    lines: list[str] = []
    for event in events:
        lines.append(json.dumps(event_record(event), ensure_ascii=False) + "\n")
        if len(lines) >= ROWS_PER_CHUNK:
            yield "".join(lines)
            lines.clear()
    if lines:
        yield "".join(lines)


def chunks(events: Iterable[Event], export_format: ExportFormat) -> Iterator[str]:
    if export_format is ExportFormat.CSV:
        return csv_chunks(events)
    return jsonl_chunks(events)


def _drain(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text
