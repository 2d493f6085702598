"""The audit log over the API: one resource's events, or all of them, newest first."""

from __future__ import annotations

from flask import g, jsonify, request

from app.api.blueprint import bp
from app.api.schemas import QueryArgs, event_to_json
from app.audit.service import EventFilter, list_events
from app.locks.pagination import DEFAULT_PAGE


def _page(filters: EventFilter, query: QueryArgs):
    limit = query.limit(DEFAULT_PAGE)
    query.raise_errors()
    page = list_events(filters, limit=limit, cursor=query.text("cursor"))
    return jsonify(
        events=[event_to_json(event) for event in page.items],
        next_cursor=page.next_cursor,
    )


@bp.get("/locks/<resource>/events")
def resource_events(resource: str):
    query = QueryArgs(request.args, allowed=("limit", "cursor"))
    return _page(EventFilter(resource=resource, scope=g.token.prefixes), query)


@bp.get("/events")
def all_events():
    query = QueryArgs(
        request.args,
        allowed=(
            "resource",
            "prefix",
            "owner",
            "action",
            "actor",
            "since",
            "until",
            "limit",
            "cursor",
        ),
    )
    filters = EventFilter(
        resource=query.text("resource"),
        prefix=query.text("prefix"),
        owner=query.text("owner"),
        action=query.text("action"),
        actor=query.text("actor"),
        since=query.timestamp("since"),
        until=query.timestamp("until"),
        scope=g.token.prefixes,
    )
    return _page(filters, query)
