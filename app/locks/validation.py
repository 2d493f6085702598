"""Field rules shared by every face (API, dashboard, CLI)."""

from __future__ import annotations

import math
import re
from typing import Any

RESOURCE_PATTERN = re.compile(r"[A-Za-z0-9._:@=+\-]{1,255}")
# Path segments that browsers, proxies and URL libraries resolve away
# (/locks/.. becomes /): such a lock could never be addressed by URL.
DOT_SEGMENTS = frozenset({".", ".."})
MAX_NAME = 255
MIN_TTL = 0.001
MAX_REASON = 1000
# Lone surrogates too: no character at all (a CLI argument of invalid UTF-8 comes
# in as one), and neither the databases nor a log could encode them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
RESOURCE_CHARACTERS = "may contain only A-Z a-z 0-9 and . _ : @ = + -"
DOT_SEGMENT_MESSAGE = "must not be . or .. (a URL path would resolve it away)"
CONTROL_MESSAGE = "must not contain control or non-printable characters"


def has_control_characters(value: str) -> bool:
    return bool(_CONTROL.search(value))


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
