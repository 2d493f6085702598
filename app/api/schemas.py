"""Request parsing and response shapes of the JSON API.

Parsing checks the shape (JSON object, known fields, JSON types); the rules of a
field's value (resource pattern, ttl range, owner characters) belong to
``LockService.validate`` so every face applies the same ones. Every failure is an
``InvalidInput`` naming the field, which the API answers with a 400 problem.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import unquote_to_bytes

from flask import Request

from app.audit.export import event_record
from app.locks import validation
from app.locks.errors import InvalidInput
from app.locks.results import Event, Freeze, Lock
from app.timestamps import parse_rfc3339, rfc3339

JSON_MIMETYPE = "application/json"
BODY = "body"
LOCKS_PATH = "/api/v1/locks/"
SLASH_MESSAGE = "may contain only A-Z a-z 0-9 and . _ : @ = + - (no '/')"


# -- responses ------------------------------------------------------------------


def lock_to_json(lock: Lock) -> dict[str, Any]:
    return {
        "resource": lock.resource,
        "owner": lock.owner,
        "token": lock.token,
        "fence": lock.fence,
        "acquired_at": rfc3339(lock.acquired_at),
        "expires_at": rfc3339(lock.expires_at),
        "ttl_remaining": round(lock.ttl_remaining, 3),
        "state": lock.state.value,
        "waiters": lock.waiters,
    }


def freeze_to_json(freeze: Freeze) -> dict[str, Any]:
    return {
        "prefix": freeze.prefix,
        "reason": freeze.reason,
        "actor": freeze.actor,
        "frozen_at": rfc3339(freeze.frozen_at),
        "ends_at": rfc3339(freeze.ends_at) if freeze.ends_at is not None else None,
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
    for pair in request.query_string.split(b"&"):
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


# -- bodies ---------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]}... is too large for a number")
    return value


def parse_json_body(
    request: Request, *, fields: Mapping[str, type | tuple[type, ...]]
) -> dict[str, Any] | None:
    """The request's JSON object, with only ``fields`` and each of its JSON type.

    Returns None when there is no body, whatever its declared type: generated
    clients send ``Content-Type: application/json`` with an empty body on DELETE.
    Raises ``InvalidInput`` for anything that is not a JSON object of known fields;
    a non-JSON content type is an ``UnsupportedMediaType`` (415) raised by
    ``require_json``.
    """
    raw = request.get_data(cache=True)  # raises 413 over MAX_CONTENT_LENGTH
    if not raw:
        return None
    require_json(request)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput([(BODY, "is not valid UTF-8")]) from exc
    try:
        document = json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float
        )
    except RecursionError as exc:
        raise InvalidInput([(BODY, "is nested too deeply")]) from exc
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, huge numbers
        raise InvalidInput([(BODY, f"is not valid JSON: {exc}")]) from exc
    if not isinstance(document, dict):
        raise InvalidInput([(BODY, "must be a JSON object")])

    errors: list[tuple[str, str]] = []
    for name in document:
        if name not in fields:
            errors.append((name, "is not a known field"))
    for name, expected in fields.items():
        if name in document and not _is_json_type(document[name], expected):
            errors.append((name, f"must be {_type_name(expected)}"))
    if errors:
        raise InvalidInput(errors)
    return document


def require_json(request: Request) -> None:
    from werkzeug.exceptions import UnsupportedMediaType

    if request.mimetype != JSON_MIMETYPE:
        raise UnsupportedMediaType(
            f"the body must be {JSON_MIMETYPE}, not {request.mimetype or 'untyped'}"
        )


def _is_json_type(value: Any, expected: type | tuple[type, ...]) -> bool:
    # bool is an int subclass, but JSON true is not a number of seconds.
    if isinstance(value, bool):
        return expected is bool
    return isinstance(value, expected)


def _type_name(expected: type | tuple[type, ...]) -> str:
    if expected is str:
        return "a string"
    if expected == (int, float):
        return "a number"
    return "of another type"


NUMBER = (int, float)


def ttl_value(value: Any) -> float | None:
    """A JSON number as seconds; an integer too large for a float is refused here
    because the range check compares it with floats."""
    return seconds_value("ttl", value)


def seconds_value(field: str, value: Any) -> float | None:
    """``field``'s JSON number as float seconds (None when absent)."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError as exc:
        raise InvalidInput([(field, "is too large")]) from exc


# -- query strings ---------------------------------------------------------------


class QueryArgs:
    """Typed reads of the query string that collect every bad parameter.

    Unknown parameters are refused by name, as unknown body fields are, so a typo
    (``?ownr=``) is an error instead of a silently broader answer.
    """

    def __init__(self, args: Mapping[str, str], allowed: tuple[str, ...]):
        self.args = args
        self.errors: list[tuple[str, str]] = [
            (name, "is not a known query parameter")
            for name in args
            if name not in allowed
        ]

    def text(self, name: str) -> str | None:
        return self.args.get(name)

    def limit(self, default: int) -> int:
        raw = self.args.get("limit")
        if raw is None:
            return default
        if not re.fullmatch(r"[0-9]{1,6}", raw):
            self.errors.append(("limit", "must be an integer between 1 and 500"))
            return default
        return int(raw)

    def positive_integer(self, name: str) -> int | None:
        raw = self.args.get(name)
        if raw is None:
            return None
        if not re.fullmatch(r"[1-9][0-9]{0,17}", raw):
            self.errors.append((name, "must be a positive integer"))
            return None
        return int(raw)

    def timestamp(self, name: str) -> datetime | None:
        raw = self.args.get(name)
        if raw is None:
            return None
        try:
            return parse_rfc3339(raw)
        except ValueError as exc:
            self.errors.append((name, str(exc)))
            return None

    def raise_errors(self) -> None:
        if self.errors:
            raise InvalidInput(self.errors)
