"""The operator dashboard: overview, lock pages, force-release and claim."""

from __future__ import annotations

from datetime import datetime

from flask import Blueprint

from app.formatting import human_duration, rfc3339

bp = Blueprint("dashboard", __name__, url_prefix="/")


@bp.app_template_filter("rfc3339")
def rfc3339_milliseconds(value: datetime | None) -> str:
    """RFC 3339 in UTC with a ``Z`` and milliseconds, as the API writes it."""
    return rfc3339(value, timespec="milliseconds") or ""


@bp.app_template_filter("duration")
def duration(seconds: float) -> str:
    """A remaining ttl as a person reads it; static/app.js counts down the same way."""
    if seconds <= 0:
        return "expired"
    return human_duration(seconds, sub_minute_digits=0)


from app.dashboard import views  # noqa: E402,F401  (routes attach to bp)
