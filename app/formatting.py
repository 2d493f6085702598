"""How times and durations read on every face."""

from datetime import UTC, datetime


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
