"""The audit log over the API: one resource's events, or all of them, newest first."""

from __future__ import annotations

from flask import g, jsonify

from app.api.blueprint import bp
from app.api.schemas import event_to_json
from app.api.shapes import query
from app.audit.service import EventFilter, list_events


def _page(filters: EventFilter):
    page = list_events(filters, limit=query()["limit"], cursor=query()["cursor"])
    return jsonify(
        events=[event_to_json(event) for event in page.items],
        next_cursor=page.next_cursor,
    )


@bp.get("/locks/<resource>/events")
def resource_events(resource: str):
    return _page(EventFilter(resource=resource, scope=g.token.prefixes))


@bp.get("/events")
def all_events():
    filters = dict(query())
    del filters["limit"], filters["cursor"]
    return _page(EventFilter(**filters, scope=g.token.prefixes))
