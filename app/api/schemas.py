"""Response shapes of the JSON API, and the checks of the raw request bytes that
come before any field is read.

What a request's fields may hold is checked against the OpenAPI document
(``app.api.shapes``); the service applies the same rules again for every face.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from flask import Request
from lockkeeper_core import validation
from lockkeeper_core.results import Event
from lockkeeper_core.wire import freeze_to_json, lock_to_json  # noqa: F401 - the API's names

from app.audit.export import event_record

if TYPE_CHECKING:
    from lockkeeper_core.results import Holders

LOCKS_PATH = "/api/v1/locks/"
SLASH_MESSAGE = validation.RESOURCE_CHARACTERS + " (no '/')"


# -- responses ------------------------------------------------------------------


def holders_to_json(found: Holders) -> dict[str, Any]:
    return {
        "resource": found.resource,
        "limit": found.limit,
        "mode": found.mode,
        "holders": [lock_to_json(lock) for lock in found.holders],
        "waiters": found.waiters,
    }


def event_to_json(event: Event) -> dict[str, Any]:
    """The same object the JSON Lines export writes, one per line."""
    return event_record(event)


# -- the raw request --------------------------------------------------------------


def raw_input_errors(request: Request) -> list[tuple[str, str]]:
    """Bytes no field may hold, checked before any field is read.

    Werkzeug decodes the path and query with ``errors="replace"``, which would turn
    invalid UTF-8 into U+FFFD and let it through as a name; so the raw bytes are
    checked here. A bad value is reported under its parameter's name; a bad name,
    which names nothing, under ``query``.
    """
    errors: list[tuple[str, str]] = []
    raw_path = request.environ.get("PATH_INFO", "").encode("latin-1", "replace")
    errors.extend(_bytes_errors("path", raw_path))
    for pair in request.query_string.split(b"&") if request.query_string else ():
        raw_name, _, raw_value = pair.partition(b"=")
        found = _bytes_errors("query", _unquote(raw_name))
        if not found:
            name = _unquote(raw_name).decode("utf-8")
            found = _bytes_errors(name, _unquote(raw_value))
        if found:
            errors.extend(found)
            return errors
    return errors


def _unquote(part: bytes) -> bytes:
    return unquote_to_bytes(part.replace(b"+", b" "))


def encoded_slash_errors(environ: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A ``%2F`` in the raw path: WSGI servers decode it into PATH_INFO, where it
    is a separator, so ``/locks/x%2Fevents`` would route to the events of ``x``.

    The raw request line (``REQUEST_URI`` from werkzeug, ``RAW_URI`` from
    gunicorn) still has it; a resource never contains '/', so it is refused.
    """
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
    path = raw.partition("?")[0]
    if "%2f" not in path.lower():
        return []
    field = "resource" if path.startswith(LOCKS_PATH) else "path"
    return [(field, SLASH_MESSAGE)]


def _bytes_errors(field: str, raw: bytes) -> list[tuple[str, str]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return [(field, "is not valid UTF-8")]
    if validation.has_control_characters(text):
        return [(field, "must not contain control characters")]
    return []
