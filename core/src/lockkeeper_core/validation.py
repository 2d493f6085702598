"""Field rules shared by every face (API, dashboard, CLI)."""

from __future__ import annotations

import math
import re
from typing import Any

from lockkeeper_core.models import MODES, SESSION_ID_LENGTH, SET_ID_LENGTH, SHARED

RESOURCE_PATTERN = re.compile(r"[A-Za-z0-9._:@=+\-]{1,255}")
# Path segments that browsers, proxies and URL libraries resolve away
# (/locks/.. becomes /): such a lock could never be addressed by URL.
DOT_SEGMENTS = frozenset({".", ".."})
MAX_NAME = 255
MAX_BIGINT = 2**63 - 1  # the largest fence or event id a column holds
MIN_TTL = 0.001
MAX_REASON = 1000
# What a releasing worker may report of its run (the OpenAPI ``Run``).
RUN_FIELDS = frozenset({"exit_status", "duration", "host"})
MAX_EXIT_STATUS = 255
MAX_RUN_SECONDS = 31_536_000
# Lone surrogates too: no character at all (a CLI argument of invalid UTF-8 comes
# in as one), and neither the databases nor a log could encode them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# A client's integer: ASCII digits, an optional minus. str.isdigit() also takes
# "²" and "①", which int() then refuses; int() takes "١٢", "１", " 12", "+12" and
# "1_2". re's [0-9] is ASCII alone, and fullmatch refuses a trailing newline.
_CLIENT_INTEGER = re.compile(r"-?[0-9]+")
RESOURCE_CHARACTERS = "may contain only A-Z a-z 0-9 and . _ : @ = + -"
DOT_SEGMENT_MESSAGE = "must not be . or .. (a URL path would resolve it away)"
CONTROL_MESSAGE = "must not contain control or non-printable characters"


def has_control_characters(value: str) -> bool:
    return bool(_CONTROL.search(value))


def client_integer(
    text: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """The integer a client wrote as text (a header, a query parameter, a form
    field), or None when it is not one in ASCII digits or is out of range.

    The one rule for every such integer: each caller says what None means to it.
    """
    if not isinstance(text, str) or not _CLIENT_INTEGER.fullmatch(text):
        return None
    try:
        value = int(text)
    except ValueError:  # more digits than Python converts
        return None
    if (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum
    ):
        return None
    return value


def resource_error(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > MAX_NAME:
        return f"must be at most {MAX_NAME} characters"
    if not RESOURCE_PATTERN.fullmatch(value):
        return RESOURCE_CHARACTERS
    if value in DOT_SEGMENTS:
        return DOT_SEGMENT_MESSAGE
    return None


def name_error(value: Any, what: str = "owner") -> str | None:
    """Owners and actors: 1-255 printable characters."""
    if not isinstance(value, str) or not value:
        return f"{what} must be a non-empty string"
    if len(value) > MAX_NAME:
        return f"must be at most {MAX_NAME} characters"
    if has_control_characters(value) or not value.isprintable():
        return CONTROL_MESSAGE
    return None


def run_errors(value: Any) -> list[tuple[str, str]]:
    """What is wrong with a released run's record, each field named ``run.*``.

    The lock page shows the last one to everybody, so a record holds only what
    it can render, and its host obeys the owner's printable rule."""
    if not isinstance(value, dict):
        return [("run", "must be a JSON object")]
    errors = [
        (f"run.{name}", "is not a known field") for name in value.keys() - RUN_FIELDS
    ]
    status = value.get("exit_status")
    if (
        not _is_number(status)
        or not isinstance(status, int)
        or abs(status) > MAX_EXIT_STATUS
    ):
        errors.append(
            (
                "run.exit_status",
                f"must be an integer from -{MAX_EXIT_STATUS} to {MAX_EXIT_STATUS}",
            )
        )
    if "duration" in value:
        duration = value["duration"]
        if not _is_number(duration) or not 0 <= duration <= MAX_RUN_SECONDS:
            errors.append(
                (
                    "run.duration",
                    f"must be a number of seconds from 0 to {MAX_RUN_SECONDS}",
                )
            )
    if "host" in value:
        message = name_error(value["host"], "host")
        if message:
            errors.append(("run.host", message))
    return errors


def _is_number(value: Any) -> bool:
    # bool is an int subclass; NaN compares false both ways, so it fails a range.
    return isinstance(value, int | float) and not isinstance(value, bool)


def ttl_error(value: Any, max_ttl: float) -> str | None:
    # bool is an int subclass: True must not pass as a one-second ttl.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a JSON number of seconds"
    if value <= 0:
        return "must be a positive, finite number of seconds"
    if value < MIN_TTL:
        # Timestamps keep microseconds: a shorter lock is stale when granted.
        return f"must be at least {MIN_TTL:g} seconds"
    # An int beyond the float range (a JSON integer of 400 digits) cannot be
    # asked isfinite(); it is above any max_ttl anyway.
    if isinstance(value, int) and value > max_ttl:
        return f"must be at most {max_ttl:g} seconds"
    if not math.isfinite(value):
        return "must be a positive, finite number of seconds"
    if value > max_ttl:
        return f"must be at most {max_ttl:g} seconds"
    return None


def reason_error(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > MAX_REASON:
        return f"must be at most {MAX_REASON} characters"
    if _CONTROL.search(value.replace("\r", "").replace("\n", "").replace("\t", "")):
        return "must not contain control characters"
    return None


def wait_error(value: Any, max_wait: float) -> str | None:
    """``wait``: how long an acquire may wait in line, 0 (do not wait) to max."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a JSON number of seconds"
    if isinstance(value, int) and value > max_wait:
        return f"must be at most {max_wait:g} seconds"
    if not math.isfinite(value) or value < 0:
        return "must be zero or a positive, finite number of seconds"
    if value > max_wait:
        return f"must be at most {max_wait:g} seconds"
    return None


# What ``secrets.token_urlsafe`` writes a session id with.
SESSION_ID_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)


def session_id_error(session_id: Any) -> str | None:
    if (
        not isinstance(session_id, str)
        or not session_id
        or len(session_id) > SESSION_ID_LENGTH
        or not set(session_id) <= SESSION_ID_CHARACTERS
    ):
        return "is not a session id"
    return None


def set_id_error(set_id: Any) -> str | None:
    """A set's id (``lockkeeper_core.sets.new_set_id``): the characters of a
    session id, at most ``SET_ID_LENGTH``."""
    if (
        not isinstance(set_id, str)
        or not set_id
        or len(set_id) > SET_ID_LENGTH
        or not set(set_id) <= SESSION_ID_CHARACTERS
    ):
        return "is not a set id"
    return None


def session_ttl_error(ttl: Any, session: Any) -> str | None:
    """A grant bound to a session has the session's ttl, and no other."""
    if ttl is not None and session is not None:
        return "give either a ttl or a session (its ttl is the session's)"
    return None


MAX_HOLDER_LIMIT = 1000


def holder_errors(limit: Any, mode: Any) -> list[tuple[str, str]]:
    """What is wrong with an acquire's ``limit`` and ``mode``."""
    errors = []
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_HOLDER_LIMIT
    ):
        errors.append(("limit", f"must be an integer from 1 to {MAX_HOLDER_LIMIT}"))
    if mode not in MODES:
        errors.append(("mode", "must be exclusive or shared"))
    elif mode == SHARED and not errors and limit > 1:
        errors.append(("mode", "shared grants have no limit: leave limit at 1"))
    return errors
