"""Static files with versioned URLs and long cache lifetimes.

``url_for('static', filename=...)`` gains ``?v=<content hash>``: a browser keeps the
file for a year without revalidating, and a changed file gets a new URL, so a
deploy is picked up on the next page view. A request without the current hash
(an old page, a hand-typed URL) still gets the file, with a short lifetime.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from flask import Flask, request

YEAR = 365 * 24 * 3600
UNVERSIONED_MAX_AGE = 300


class StaticVersions:
    """Content hashes of the files under the static folder, computed once each."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder).resolve()
        self._hashes: dict[str, str | None] = {}

    def version(self, filename: str) -> str | None:
        if filename not in self._hashes:
            path = (self.folder / filename).resolve()
            if not path.is_relative_to(self.folder) or not path.is_file():
                return None
            self._hashes[filename] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        return self._hashes[filename]


def init_app(app: Flask) -> None:
    versions = StaticVersions(app.static_folder)

    @app.url_defaults
    def add_static_version(endpoint: str, values: dict) -> None:
        if endpoint == "static" and "filename" in values and "v" not in values:
            version = versions.version(values["filename"])
            if version:
                values["v"] = version

    def static_max_age(filename: str | None) -> int:
        if filename and request.args.get("v") == versions.version(filename):
            return YEAR
        return UNVERSIONED_MAX_AGE

    app.get_send_file_max_age = static_max_age

    @app.after_request
    def immutable_static(response):
        if (
            request.endpoint == "static"
            and response.status_code == 200
            and response.cache_control.max_age == YEAR
        ):
            response.cache_control.immutable = True
            response.cache_control.public = True
        return response
