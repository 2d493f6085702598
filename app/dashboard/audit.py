"""The audit page and its exports: parse the query, call the audit service, render.

``/audit`` lists events newest first with the filters in the URL (so every page,
filtered or paged, can be bookmarked and restored by Back); htmx aiming at
``#audit-results`` gets that fragment only, as on every dashboard page
(``htmx.py``). ``/audit/export.csv`` and ``/audit/export.jsonl`` stream exactly
the filtered set. Viewers and operators may both read and export.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, Response, request, stream_with_context, url_for
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.pagination import DEFAULT_PAGE
from lockkeeper_core.state import Action
from lockkeeper_core.validation import client_integer

from app.audit.export import ExportFormat, chunks
from app.audit.service import (
    FOLDED,
    EventFilter,
    iter_events,
    list_events,
    renewals,
    tenures,
)
from app.auth.views import login_required
from app.dashboard.htmx import render_page_or_fragment
from app.dashboard.views import POLL_SECONDS, _unchanged, is_live, shown_version
from app.extensions import lock_service
from app.timestamps import MissingOffset, human_duration, parse_rfc3339

bp = Blueprint("audit", __name__)

FILTER_FIELDS = ("resource", "prefix", "owner", "actor", "mode", "since", "until")
# ``?rows=all``: every event, renewals included; by default a history shows the
# ownership changes, each grant with its renewals counted (``renewals``).
EVERY_ROW = "all"
QUICK_RANGES = (
    ("15 min", timedelta(minutes=15)),
    ("1 h", timedelta(hours=1)),
    ("24 h", timedelta(hours=24)),
    ("7 d", timedelta(days=7)),
)


def held_for(value: timedelta) -> str:
    """A tenure's length: ``7 ms``, ``2.5 s``, ``45 s``, ``3 min 20 s``,
    ``2 h 5 min`` (never a float's digits: "0.00703 s" was a short hold)."""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    return human_duration(seconds, sub_minute_digits=0)


def rfc3339_short(value: datetime) -> str:
    """``2026-11-29 09:00:05Z``: an instant to read, to the second."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


bp.add_app_template_filter(held_for, "held_for")
bp.add_app_template_filter(rfc3339_short, "rfc3339_short")


# "-24h", "24 h ago", "-7d", "90 min ago": that long before now.
_AGO = re.compile(
    r"^(?:-\s*(?P<a>\d+(?:\.\d+)?)\s*(?P<au>[a-z]+)"
    r"|(?P<b>\d+(?:\.\d+)?)\s*(?P<bu>[a-z]+)\s+ago)$"
)
_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}  # fmt: skip
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
INSTANT_HELP = "type yesterday, -24h, 2026-11-29 or 2026-11-29 09:00 (UTC)"


def _form_instant(text: str, now: datetime) -> datetime:
    """An instant as people type it, in UTC: ``now``, ``today``,
    ``yesterday`` (their midnight), ``-24h`` or ``24 h ago``, a date (its
    midnight), a date and time with or without seconds, ``T`` or a space, an
    offset or ``Z``.

    :raise ValueError: none of those.
    """
    typed = " ".join(text.lower().split())
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    named = {"now": now, "today": midnight, "yesterday": midnight - timedelta(days=1)}
    if typed in named:
        return named[typed]
    ago = _AGO.match(typed)
    if ago:
        amount = float(ago["a"] or ago["b"])
        unit = _UNITS.get(ago["au"] or ago["bu"])
        if unit is None:
            raise ValueError(text)
        try:
            return now - timedelta(seconds=amount * unit)
        except OverflowError:
            raise ValueError(text) from None
    # RFC 3339 (its range checks and all), with a space for the "T", and
    # without an offset read as UTC (the labels say so); a date alone is its
    # midnight.
    instant = text.strip().replace(" ", "T", 1)
    if _DATE.fullmatch(instant):
        instant += "T00:00"
    try:
        return parse_rfc3339(instant)
    except MissingOffset:
        return parse_rfc3339(instant + "Z")


def _shown(args) -> dict[str, Any]:
    """The filters as typed, to show back in the form; empty ones left out.
    ``action`` repeats (a list), ``except`` inverts it, ``rows=all`` shows
    every row."""
    raw: dict[str, Any] = {
        field: args.get(field, "").strip() for field in FILTER_FIELDS
    }
    raw["action"] = [a.strip() for a in args.getlist("action") if a.strip()]
    if raw["action"] and args.get("except") == "1":
        raw["except"] = "1"
    if args.get("rows") == EVERY_ROW:
        raw["rows"] = EVERY_ROW
    return {field: value for field, value in raw.items() if value}


def folds_renewals(shown: dict[str, Any]) -> bool:
    """Renewals are hidden (and counted on their grant) unless the reader asked
    for every row or chose actions."""
    return "action" not in shown and shown.get("rows") != EVERY_ROW


def action_filter(shown: dict[str, Any]) -> dict[str, Any]:
    if folds_renewals(shown):
        return {"actions": FOLDED, "except_actions": True}
    return {
        "actions": tuple(shown.get("action", ())),
        "except_actions": shown.get("except") == "1",
    }


def _parse_query(
    args, now: datetime, fold: bool = True
) -> tuple[EventFilter, int, str | None]:
    """The filters, page size and cursor; ``fold=False`` (exports): every row
    unless actions were chosen.

    :raise InvalidInput: naming every bad field; nothing is queried.
    """
    errors: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    shown = _shown(args)
    if not fold:
        shown.setdefault("rows", EVERY_ROW)
    values.update(action_filter(shown))
    for field, text in shown.items():
        if field in ("action", "except", "rows"):
            continue
        if field in ("since", "until"):
            try:
                values[field] = _form_instant(text, now)
            except ValueError:
                errors.append(
                    (field, f"must be a date and time, not {text!r}: {INSTANT_HELP}")
                )
        else:
            values[field] = text
    limit: Any = DEFAULT_PAGE
    if args.get("limit"):
        limit = client_integer(args["limit"])
        if limit is None:
            errors.append(("limit", "must be an integer"))
    cursor = args.get("cursor") or None
    filters = EventFilter(**values)
    try:
        filters.validate()
    except InvalidInput as exc:
        errors.extend(exc.errors)
    if errors:
        raise InvalidInput(errors)
    return filters, limit, cursor


@bp.get("/audit")
@login_required
def audit():
    errors: list[tuple[str, str]] = []
    shown = _shown(request.args)
    page = None
    found = None
    folded: dict = {}
    filters = EventFilter()
    limit: Any = DEFAULT_PAGE
    cursor = None
    now = lock_service().now()
    try:
        filters, limit, cursor = _parse_query(request.args, now)
        page = list_events(filters, limit=limit, cursor=cursor)
        found = tenures(page.items)
        if folds_renewals(shown):
            folded = renewals(page.items)
    except InvalidInput as exc:
        errors = exc.errors
    query = dict(shown)
    if limit != DEFAULT_PAGE:
        query["limit"] = str(limit)
    # Quick ranges: the filters as they are, from that long ago until now;
    # and yesterday (UTC), whole.
    ranged = {k: v for k, v in query.items() if k not in ("since", "until")}
    range_urls = [
        (
            label,
            url_for(
                "audit.audit",
                **ranged,
                since=(now - span).strftime("%Y-%m-%dT%H:%M:%SZ"),
            ),
        )
        for label, span in QUICK_RANGES
    ]
    yesterday_url = url_for("audit.audit", **ranged, since="yesterday", until="today")
    # A live tail: page 1 of a range with no end gets the newest events by
    # polling; anything else (an older page, an "until") stays as it was read.
    live = is_live()
    tailing = not errors and cursor is None and filters.until is None
    version = shown_version([e.id for e in page.items] if page else [], query)
    if tailing and live:
        unchanged = _unchanged(version)
        if unchanged is not None:
            return unchanged
    return render_page_or_fragment(
        "audit/index.html",
        {"audit-results": "audit/_results.html"},
        status=400 if errors else 200,
        tailing=tailing,
        live=live,
        version=version,
        poll_seconds=POLL_SECONDS,
        poll_url=url_for("audit.audit", **query),
        switch_url=url_for("audit.audit", **query, live="0" if live else "1"),
        page=page,
        tenures=found,
        renewals=folded,
        now=now,
        range_urls=range_urls,
        yesterday_url=yesterday_url,
        folding=folds_renewals(shown),
        every_row_url=url_for("audit.audit", **{**query, "rows": EVERY_ROW}),
        changes_url=url_for(
            "audit.audit", **{k: v for k, v in query.items() if k != "rows"}
        ),
        filters=filters,
        shown=shown,
        errors=errors,
        actions=[a.value for a in Action],
        first_url=url_for("audit.audit", **query) if cursor else None,
        next_url=(
            url_for("audit.audit", **query, cursor=page.next_cursor)
            if page and page.next_cursor
            else None
        ),
        export_urls={
            f.value: url_for(f"audit.export_{f.value}", **shown) for f in ExportFormat
        },
    )


def _export(export_format: ExportFormat):
    try:
        filters, _limit, _cursor = _parse_query(
            request.args, lock_service().now(), fold=False
        )
    except InvalidInput as exc:
        message = "; ".join(f"{field}: {text}" for field, text in exc.errors)
        return Response(message + "\n", status=400, mimetype="text/plain")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    rows = chunks(iter_events(filters), export_format)
    response = Response(
        stream_with_context(rows),
        mimetype=export_format.mimetype,
        headers={
            "Content-Disposition": (
                f'attachment; filename="lockkeeper-events-{stamp}.{export_format}"'
            ),
            "Cache-Control": "no-store",
        },
    )
    if export_format is ExportFormat.CSV:
        response.mimetype_params["header"] = "present"
    response.mimetype_params["charset"] = "utf-8"
    return response


@bp.get("/audit/export.csv")
@login_required
def export_csv():
    return _export(ExportFormat.CSV)


@bp.get("/audit/export.jsonl")
@login_required
def export_jsonl():
    return _export(ExportFormat.JSONL)
