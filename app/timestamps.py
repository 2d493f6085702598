"""How times and durations read and are read on every face: one formatter
(``rfc3339``), one parser (``parse_rfc3339``), durations. Pure standard library:
the worker client uses it without the web stack."""

import re
from datetime import UTC, datetime, timedelta

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

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def human_duration(seconds: float, *, sub_minute_digits: int) -> str:
    """``45 s``, ``3 min 20 s``, ``2 h 5 min``, ``1 d 3 h``.

    Below ten seconds ``sub_minute_digits`` significant digits are kept (0: whole
    seconds, as the dashboard's countdown shows them; 3: ``0.25 s`` in the audit).
    """
    if seconds < 10 and sub_minute_digits:
        return f"{seconds:.{sub_minute_digits}g} s"
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


def rfc3339(moment: datetime | None, timespec: str = "microseconds") -> str | None:
    """``2026-11-30T09:00:00.123456Z``: UTC with a ``Z``, as every face writes it."""
    if moment is None:
        return None
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(timespec=timespec) + "Z"


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


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds.

    :raise ValueError: with a message fit to show the user.
    """
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration like 7d, 12h, 30m or 45s")
    amount, unit = match.groups()
    return timedelta(seconds=float(amount) * _DURATION_UNITS[unit])
