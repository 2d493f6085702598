"""How times and durations read and are read on every face: one formatter
(``rfc3339``), one parser (``parse_rfc3339``, the core's: the embedded mode reads
timestamps without the server), durations. Pure standard library."""

import re
from datetime import UTC, datetime, timedelta

from lockkeeper_core.timestamps import (  # noqa: F401 (read here by every face)
    TIMESTAMP_EXAMPLE,
    MissingOffset,
    parse_rfc3339,
)

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


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds.

    :raise ValueError: with a message fit to show the user.
    """
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration like 7d, 12h, 30m or 45s")
    amount, unit = match.groups()
    return timedelta(seconds=float(amount) * _DURATION_UNITS[unit])
