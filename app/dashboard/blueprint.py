"""The dashboard blueprint and the template filters every page uses."""

from __future__ import annotations

import hashlib
from datetime import datetime

from flask import Blueprint

from app.dashboard.forms import USUAL_REASONS
from app.timestamps import human_duration, rfc3339

bp = Blueprint("dashboard", __name__, url_prefix="/")
# The reasons every confirmation offers (templates/_macros.html reason_fields).
bp.add_app_template_global(USUAL_REASONS, "usual_reasons")


@bp.app_template_filter("rfc3339")
def rfc3339_milliseconds(value: datetime | None) -> str:
    """The one way every page shows an instant: RFC 3339 in UTC with a ``Z``, to
    the millisecond (the API and the exports keep microseconds)."""
    return rfc3339(value, timespec="milliseconds") or ""


@bp.app_template_filter("duration")
def duration(seconds: float) -> str:
    """A remaining ttl as a person reads it; static/app.js counts down the same way."""
    if seconds <= 0:
        return "expired"
    return human_duration(seconds, sub_minute_digits=0)


@bp.app_template_filter("age")
def age(seconds: float) -> str:
    """How long ago, coarsely: ``12 s``, ``3 min``, ``2 h 5 min``, ``4 d 1 h``.
    static/app.js keeps the same text current between polls."""
    seconds = max(seconds, 0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return human_duration(seconds, sub_minute_digits=0)


@bp.app_template_filter("dom_id")
def dom_id(name: str, prefix: str = "lock") -> str:
    """A stable, valid HTML id for any resource or owner name: polls morph rows
    by id, so a row keeps its place (and focus) while it exists."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return f"{prefix}-{digest}"
