"""The operator dashboard: overview, lock pages, force-release and claim."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Blueprint

bp = Blueprint("dashboard", __name__, url_prefix="/")


@bp.app_template_filter("rfc3339")
def rfc3339(value: datetime | None) -> str:
    """RFC 3339 in UTC with a ``Z`` and milliseconds, as the API writes it."""
    if value is None:
        return ""
    if value.tzinfo is None:  # the service hands out aware datetimes; be safe
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@bp.app_template_filter("duration")
def duration(seconds: float) -> str:
    """Seconds as a person reads them; static/app.js formats the same way."""
    if seconds <= 0:
        return "expired"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = int(seconds)
    days, hours = divmod(whole, 86400)
    hours, rest = divmod(hours, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s"


from app.dashboard import views  # noqa: E402,F401  (routes attach to bp)
