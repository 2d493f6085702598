"""Security headers for every response, and a strict policy for HTML pages.

The dashboard loads only its own files: no inline script or style, no CDN, no
frames. htmx 4 needs no ``unsafe-inline`` (its indicator CSS is a constructable
stylesheet) and we use no ``hx-on`` or trigger filters, which would need
``unsafe-eval``.
"""

from __future__ import annotations

from flask import Flask, Response
from werkzeug.middleware.proxy_fix import ProxyFix

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; "
    "img-src 'self' data:; "
    "object-src 'none'; "
    "base-uri 'self'; "
    "form-action 'self'; "
    "frame-ancestors 'none'"
)


def add_security_headers(response: Response) -> Response:
    headers = response.headers
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("Referrer-Policy", "same-origin")
    if response.mimetype == "text/html":
        headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        # For browsers that predate frame-ancestors.
        headers.setdefault("X-Frame-Options", "DENY")
    return response


def init_app(app: Flask) -> None:
    app.after_request(add_security_headers)
    proxies = int(app.config["LOCKKEEPER_PROXY_COUNT"])
    if proxies:
        # The client address (login limits, request log) and scheme from the
        # X-Forwarded-* entries the last ``proxies`` hops added; more entries
        # than that were written by the client and are ignored.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)
