"""What a request may hold, read from the OpenAPI document the app serves.

The document is the one statement of every operation's path parameters, query
parameters and body. At startup each operation's parts are put into one JSON
Schema (``{"path": ..., "query": ..., "body": ...}``) and compiled with
jsonschema-rs; a request is checked with one call, and every error comes back at
once, each named by its field. Werkzeug and ``json`` turn the raw request into
that instance first: query values arrive as text, so a parameter documented as
an integer is converted when it is one, and a ``date-time`` one is parsed.

The document served is the YAML file with the limits this server is configured
with (``LOCKKEEPER_MAX_TTL``, ``LOCKKEEPER_MAX_WAIT``, ``LOCKKEEPER_MAX_SET_SIZE``),
so what it promises is what the server checks.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
from flask import Flask, Request, current_app, g
from lockkeeper_core import validation
from lockkeeper_core.errors import InvalidInput
from werkzeug.exceptions import UnsupportedMediaType

from app.api.schemas import raw_input_errors
from app.timestamps import parse_rfc3339

EXTENSION = "lockkeeper.api.shapes"
JSON_MIMETYPE = "application/json"
BODY = "body"
QUERY = "query"
PATH = "path"
NO_BODY = object()  # JSON null is a body

# The rules a pattern or ``not`` states, in words, by the schema that states them.
RULE_MESSAGES: dict[tuple[str, str], str] = {
    ("Resource", "pattern"): validation.RESOURCE_CHARACTERS,
    ("Resource", "not"): validation.DOT_SEGMENT_MESSAGE,
    ("Owner", "pattern"): validation.CONTROL_MESSAGE,
}
TYPE_NAMES = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "object": "a JSON object",
    "array": "a list",
    "boolean": "true or false",
}


# -- the document this app serves ---------------------------------------------------


def served_document(base: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    """``base`` with this server's configured limits in place of the defaults."""
    document = copy.deepcopy(dict(base))
    schemas = document["components"]["schemas"]
    schemas["Ttl"]["maximum"] = _json_number(config["LOCKKEEPER_MAX_TTL"])
    for request in ("AcquireRequest", "SetAcquireRequest"):
        wait = schemas[request]["properties"]["wait"]
        wait["maximum"] = _json_number(config["LOCKKEEPER_MAX_WAIT"])
    schemas["SetMembers"]["maxItems"] = int(config["LOCKKEEPER_MAX_SET_SIZE"])
    schemas["SetResources"]["maxItems"] = int(config["LOCKKEEPER_MAX_SET_SIZE"])
    # A place in line for each member at most.
    for places in set_places(schemas):
        places["maxProperties"] = int(config["LOCKKEEPER_MAX_SET_SIZE"])
    return document


def set_places(schemas: Mapping[str, Any]) -> list[dict]:
    """The schemas of a set's ``places``: asked, answered by a 409, and by
    the waiting room's 503."""
    return [
        schemas["SetAcquireRequest"]["properties"]["places"],
        schemas["SetRefused"]["properties"]["places"],
        schemas["WaitingRoomFullProblem"]["allOf"][1]["properties"]["places"],
    ]


def _json_number(value: float) -> int | float:
    value = float(value)
    return int(value) if value.is_integer() else value


# -- compiled operations ---------------------------------------------------------


@dataclass(frozen=True)
class Parameter:
    name: str
    kind: str  # "integer", "date-time" or "string": how its text is read
    default: Any


@dataclass(frozen=True)
class Operation:
    schema: dict  # {"path": ..., "query": ..., "body": ...}, with the components
    validator: Any  # ``schema`` compiled by jsonschema-rs
    query: dict[str, Parameter]
    has_body: bool
    body_required: bool


class Shapes:
    """The served document and its operations compiled, keyed by Flask rule and
    method (``("/api/v1/locks/<resource>", "POST")``)."""

    def __init__(self, document: dict):
        self.document = document
        self.operations: dict[tuple[str, str], Operation] = {}
        for template, item in document["paths"].items():
            rule = re.sub(r"\{(\w+)\}", r"<\1>", template)
            shared = item.get("parameters", [])
            for method, spec in item.items():
                if method in {"get", "post", "put", "patch", "delete"}:
                    operation = self._compile(shared + spec.get("parameters", []), spec)
                    self.operations[(rule, method.upper())] = operation

    def _compile(self, parameters: list[dict], spec: dict) -> Operation:
        parts: dict[str, dict] = {PATH: {}, QUERY: {}}
        required: dict[str, list[str]] = {PATH: [], QUERY: []}
        query: list[Parameter] = []
        for parameter in parameters:
            parameter = self.resolve(parameter)
            schema = parameter["schema"]
            parts[parameter["in"]][parameter["name"]] = schema
            if parameter.get("required"):
                required[parameter["in"]].append(parameter["name"])
            if parameter["in"] == QUERY:
                resolved = self.resolve(schema)
                kind = resolved.get("format") or resolved.get("type", "string")
                query.append(
                    Parameter(parameter["name"], kind, resolved.get("default"))
                )
        properties = {
            where: {
                "type": "object",
                "properties": parts[where],
                "required": required[where],
                "additionalProperties": False,
            }
            for where in (PATH, QUERY)
        }
        content = (spec.get("requestBody") or {}).get("content", {})
        body = content.get(JSON_MIMETYPE, {}).get("schema")
        if body is not None:
            properties[BODY] = body
        schema = {
            "type": "object",
            "properties": properties,
            "components": self.document["components"],
        }
        return Operation(
            schema=schema,
            validator=jsonschema_rs.validator_for(schema),
            query={parameter.name: parameter for parameter in query},
            has_body=body is not None,
            body_required=bool((spec.get("requestBody") or {}).get("required")),
        )

    def resolve(self, node: dict) -> dict:
        while "$ref" in node:
            node = _at(self.document, node["$ref"].removeprefix("#/").split("/"))
        return node

    # -- checking a request ------------------------------------------------------

    def check(self, request: Request) -> list[tuple[str, str]]:
        """Every error of ``request`` as (field, message), none if it conforms.

        Leaves the JSON body (or None) in ``g.api_body`` and the typed query
        parameters, defaults filled in, in ``g.api_query``.
        """
        errors = raw_input_errors(request)
        if errors or request.url_rule is None:
            return errors
        method = "GET" if request.method == "HEAD" else request.method
        operation = self.operations.get((request.url_rule.rule, method))
        if operation is None:
            return errors
        query = {}
        typed: dict[str, Any] = {}
        known = operation.query
        for name, raw in request.args.items() if request.query_string else ():
            parameter = known.get(name)
            query[name] = raw
            if parameter is None:
                continue
            number = (
                validation.client_integer(raw) if parameter.kind == "integer" else None
            )
            if number is not None:  # else left as text, which the schema refuses
                query[name] = typed[name] = number
            elif parameter.kind == "date-time":
                try:
                    typed[name] = parse_rfc3339(raw)
                except ValueError as exc:  # its message names what is wrong
                    errors.append((name, str(exc)))
            else:
                typed[name] = raw
        instance: dict[str, Any] = {PATH: request.view_args or {}, QUERY: query}
        body = None
        if operation.has_body:
            try:
                document = json_body(request)
            except InvalidInput as exc:
                errors.extend(exc.errors)
            else:
                if document is not NO_BODY:
                    instance[BODY] = body = document
                elif operation.body_required:
                    instance[BODY] = {}
        if not operation.validator.is_valid(instance):
            found = operation.validator.iter_errors(instance)
            errors.extend(_named(operation.schema, found))
        for name, parameter in known.items():
            typed.setdefault(name, parameter.default)
        context = g._get_current_object()  # one lookup of the context-local
        context.api_body, context.api_query = body, typed
        return _first_per_field(errors) if errors else errors


def _at(node: Any, path: list) -> Any:
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _named(schema: dict, found) -> list[tuple[str, str]]:
    errors = []
    for error in found:
        where, *inside = list(error.instance_path)
        kind = error.kind
        name = kind.name
        if name == "additionalProperties":
            what = "field" if where == BODY else "query parameter"
            errors.extend(
                (extra, f"is not a known {what}") for extra in kind.unexpected
            )
        elif name == "required":
            errors.append((kind.property, "is required"))
        else:
            field = str(inside[0]) if inside else where
            schema_path = list(error.schema_path)
            errors.append((field, _message(schema, name, kind, schema_path)))
    return errors


def _message(schema: dict, name: str, kind: Any, schema_path: list) -> str:
    holder = _at(schema, schema_path[:-1])
    if name == "type":
        types = [TYPE_NAMES.get(t, t) for t in kind.types]
        return "must be " + " or ".join(types)
    if name == "minLength":
        return (
            "must not be empty"
            if kind.limit == 1
            else (f"must be at least {kind.limit} characters")
        )
    if name == "maxLength":
        return f"must be at most {kind.limit} characters"
    if name in {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}:
        return _range_message(holder)
    if name == "maxItems":
        bound = holder["maxItems"]
        setting = holder.get("x-setting")
        return f"must hold at most {bound} items" + (f" ({setting})" if setting else "")
    if name == "propertyNames":  # each key checked as a Resource
        return "must be keyed by resources' names"
    if name == "maxProperties":
        bound = holder["maxProperties"]
        setting = holder.get("x-setting")
        return f"must hold at most {bound} entries" + (
            f" ({setting})" if setting else ""
        )
    if name == "minItems":
        return f"must hold at least {holder['minItems']} item(s)"
    if name == "enum":
        return "must be one of " + ", ".join(map(str, holder["enum"]))
    named = schema_path[2] if schema_path[:2] == ["components", "schemas"] else None
    return RULE_MESSAGES.get((named, name), "is not in the documented form")


def _range_message(schema: Mapping[str, Any]) -> str:
    bounds = []
    if "minimum" in schema:
        bounds.append(f"at least {_bound(schema['minimum'])}")
    if "exclusiveMinimum" in schema:
        bounds.append(f"more than {_bound(schema['exclusiveMinimum'])}")
    if "maximum" in schema:
        bounds.append(f"at most {_bound(schema['maximum'])}")
    if "exclusiveMaximum" in schema:
        bounds.append(f"less than {_bound(schema['exclusiveMaximum'])}")
    return "must be " + " and ".join(bounds)


def _bound(value: float) -> str:
    """An integer bound in full (a place's 9223372036854775807, not
    9.22337e+18), a fractional one as short as it reads."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def _first_per_field(errors: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One message per field (``""`` is both too short and not of the alphabet)."""
    seen: dict[str, str] = {}
    for field, message in errors:
        seen.setdefault(field, message)
    return list(seen.items())


# -- the body ------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]}... is too large for a number")
    return value


# Built once: json.loads() with hooks builds a decoder (and its scanner) per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def json_body(request: Request) -> Any:
    """The request's JSON document, or NO_BODY when there is none, whatever its
    declared type: generated clients send ``Content-Type: application/json`` with
    an empty body on DELETE.

    A body of another type is a 415; one that is not JSON an ``InvalidInput``
    naming ``body``. NaN, Infinity and numbers beyond a float are refused here,
    before any schema sees them.
    """
    raw = request.get_data(cache=True)  # raises 413 over MAX_CONTENT_LENGTH
    if not raw:
        return NO_BODY
    if request.mimetype != JSON_MIMETYPE:
        raise UnsupportedMediaType(
            f"the body must be {JSON_MIMETYPE}, not {request.mimetype or 'untyped'}"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput([(BODY, "is not valid UTF-8")]) from exc
    try:
        document = _DECODER.decode(text)
    except RecursionError as exc:
        raise InvalidInput([(BODY, "is nested too deeply")]) from exc
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, huge numbers
        raise InvalidInput([(BODY, f"is not valid JSON: {exc}")]) from exc
    if _SURROGATE_ESCAPE.search(text):
        field = _lone_surrogate_in(document)
        if field is not None:
            raise InvalidInput([(field, LONE_SURROGATE)])
    return document


# A \ud800-\udfff escape: valid JSON, but alone (not half of a pair) it is no
# character at all, and encoding it for the database or a log would fail.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
LONE_SURROGATE = "contains a lone surrogate escape (\\ud800-\\udfff), which is not text"


def _lone_surrogate_in(document: Any, field: str = BODY) -> str | None:
    """The top-level field whose value (or name) holds a lone surrogate, if any:
    a pair decodes to one character and encodes; a lone one does not."""
    if isinstance(document, str):
        try:
            document.encode("utf-8")
        except UnicodeEncodeError:
            return field
        return None
    if isinstance(document, dict):
        for key, value in document.items():
            if _lone_surrogate_in(key) is not None:
                return field  # the name itself cannot be shown
            inner = key if field == BODY else field
            if _lone_surrogate_in(value, inner) is not None:
                return inner
    elif isinstance(document, list):
        for value in document:
            if _lone_surrogate_in(value, field):
                return field
    return None


# -- for the app and the views --------------------------------------------------------


def init_app(app: Flask, base: Mapping[str, Any]) -> Shapes:
    shapes = Shapes(served_document(base, app.config))
    app.extensions[EXTENSION] = shapes
    return shapes


def shapes() -> Shapes:
    return current_app.extensions[EXTENSION]


def request_errors(request: Request) -> list[tuple[str, str]]:
    """What the guard calls for every request: raw bytes, then the document."""
    return shapes().check(request)


def body() -> dict[str, Any]:
    """The checked JSON body of this request; ``{}`` when it had none."""
    return g.get("api_body") or {}


def query() -> dict[str, Any]:
    """The checked, typed query parameters of this request (absent ones None,
    or their documented default)."""
    return g.get("api_query") or {}


def seconds(value: Any) -> float | None:
    """A checked JSON number of seconds as a float (the document bounds it)."""
    return None if value is None else float(value)
