"""The audit page and its exports: parse the query, call the audit service, render.

``/audit`` lists events newest first with the filters in the URL (so every page,
filtered or paged, can be bookmarked and restored by Back); htmx aiming at
``#audit-results`` gets that fragment only, as on every dashboard page
(``htmx.py``). ``/audit/export.csv`` and ``/audit/export.jsonl`` stream exactly
the filtered set. Viewers and operators may both read and export.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, Response, request, stream_with_context, url_for

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
from app.locks.errors import InvalidInput
from app.locks.pagination import DEFAULT_PAGE
from app.locks.service import lock_service
from app.locks.state import Action
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
)


def held_for(value: timedelta) -> str:
    """A tenure's length: ``0.25 s``, ``45 s``, ``3 min 20 s``, ``2 h 5 min``."""
    return human_duration(value.total_seconds(), sub_minute_digits=3)


def datetime_local(value: datetime | None) -> str:
    """The value an ``<input type="datetime-local">`` shows, in UTC."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") if value else ""


bp.add_app_template_filter(held_for, "held_for")
bp.add_app_template_filter(datetime_local, "datetime_local")


def _form_instant(text: str) -> datetime:
    """The form's ``datetime-local`` fields send a wall clock without an offset;
    their labels say UTC, so that is the zone they are read in."""
    try:
        return parse_rfc3339(text)
    except MissingOffset:
        return parse_rfc3339(text + "Z")


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


def _parse_query(args, fold: bool = True) -> tuple[EventFilter, int, str | None]:
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
                values[field] = _form_instant(text)
            except ValueError:
                errors.append((field, "must be a date and time like 2026-11-30T09:00Z"))
        else:
            values[field] = text
    limit: Any = DEFAULT_PAGE
    if args.get("limit"):
        try:
            limit = int(args["limit"])
        except ValueError:
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
    try:
        filters, limit, cursor = _parse_query(request.args)
        page = list_events(filters, limit=limit, cursor=cursor)
        found = tenures(page.items)
        if folds_renewals(shown):
            folded = renewals(page.items)
    except InvalidInput as exc:
        errors = exc.errors
    query = dict(shown)
    if limit != DEFAULT_PAGE:
        query["limit"] = str(limit)
    now = lock_service().now()
    # Quick ranges: the filters as they are, from that long ago until now.
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
        filters, _limit, _cursor = _parse_query(request.args, fold=False)
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
