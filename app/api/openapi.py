"""``GET /api/v1/openapi.json``: the hand-written ``openapi.yaml``, served as JSON."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

import yaml
from flask import jsonify

from app.api.blueprint import bp


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document, parsed once per process."""
    text = files("app.api").joinpath("openapi.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


@bp.get("/openapi.json")
def openapi_json():
    return jsonify(openapi_document())
