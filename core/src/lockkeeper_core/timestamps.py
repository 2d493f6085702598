"""Reading an RFC 3339 timestamp, as every face reads one: the server's API
and dashboard, its CLI, and the embedded mode (``app.timestamps`` re-exports
it beside the formatter and durations). Pure standard library."""

import re
from datetime import UTC, datetime

# RFC 3339 section 5.6 ``date-time``, with two allowances that name the same
# instant: seconds may be left out (``09:00Z``, as HTML time fields write it) and
# the separator may be a space or a lower-case ``t`` (the RFC's own note).
_RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]"
    r"(?P<time>[0-9]{2}:[0-9]{2}(?::[0-9]{2})?)(?:\.(?P<fraction>[0-9]+))?"
    r"(?P<offset>[Zz]|[+-][0-9]{2}:[0-9]{2})?",
    re.ASCII,
)
# Longer than any real timestamp (a long fraction included): refused unread.
_MAX_TIMESTAMP = 64
TIMESTAMP_EXAMPLE = "2026-11-30T09:00:00Z"


class MissingOffset(ValueError):
    """A date and time without ``Z`` or ``+hh:mm``: a wall-clock reading, not an
    instant. A face whose input is a wall clock in a zone it states (the audit
    page's ``datetime-local`` fields, labelled UTC) adds that zone itself."""


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time as an aware UTC datetime.

    The offset is required: ``Z`` (or ``z``) or ``+hh:mm``/``-hh:mm``. A timestamp
    without one is rejected (``MissingOffset``), never guessed: the same text would
    name a different instant in every zone. Seconds may be left out
    (``2026-11-30T09:00Z``); a fraction longer than microseconds is truncated, not
    rounded (the instant never moves past the next microsecond). A leap second
    (``:60``) is rejected: Python has no such instant.

    :raise ValueError: with a message that completes "<field> ...", e.g. "must
        include a UTC offset (Z for UTC), like 2026-11-30T09:00:00Z".
    """
    if not isinstance(text, str) or len(text) > _MAX_TIMESTAMP:
        raise ValueError(_not_a_timestamp())
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(_not_a_timestamp())
    if match["offset"] is None:
        raise MissingOffset(
            f"must include a UTC offset (Z for UTC), like {TIMESTAMP_EXAMPLE}"
        )
    fraction = (match["fraction"] or "")[:6]
    offset = match["offset"].upper().replace("Z", "+00:00")
    iso = f"{match['date']}T{match['time']}{'.' + fraction if fraction else ''}"
    try:
        value = datetime.fromisoformat(iso + offset)
    except ValueError:
        raise ValueError(_not_a_timestamp()) from None
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T00:00:00+01:00 is well formed but falls before year 1 in UTC.
        raise ValueError("is out of range (years 0001 to 9999 in UTC)") from None


def _not_a_timestamp() -> str:
    return f"must be an RFC 3339 timestamp like {TIMESTAMP_EXAMPLE}"
