"""Security headers for every response, a strict policy for HTML pages, and no
state-changing dashboard request from another site.

The dashboard loads only its own files: no inline script or style, no CDN, no
frames. htmx 4 needs no ``unsafe-inline`` (its indicator CSS is a constructable
stylesheet) and we use no ``hx-on`` or trigger filters, which would need
``unsafe-eval``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Flask, Response, abort, request
from werkzeug.middleware.proxy_fix import ProxyFix

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; "
    "img-src 'self' data:; "
    "object-src 'none'; "
    "base-uri 'self'; "
    "form-action 'self'; "
    "frame-ancestors 'none'"
)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Fetch Metadata values a browser sends for a request this site itself made (or
# one the user typed): anything else (cross-site, same-site) is another origin.
OWN_SITE = frozenset({"same-origin", "none"})
CROSS_SITE_REFUSED = (
    "This request came from another site. Changes can only be made from "
    "Lockkeeper's own pages: reload the page and try again."
)


def refuse_cross_site_changes() -> None:
    """403 for a state-changing dashboard request sent from another origin.

    In addition to the CSRF token: a browser's ``Sec-Fetch-Site`` says who made
    the request and cannot be set by a page. Browsers without Fetch Metadata are
    judged by ``Origin`` (its host must be the one the request was sent to; the
    proxy passes ``Host`` through). A request with neither is no browser's
    cross-site request: curl and scripts still need the session and the CSRF
    token. The API takes bearer tokens only, which no other site can send.
    """
    if request.method in SAFE_METHODS or request.blueprint == "api":
        return
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        if site not in OWN_SITE:
            abort(403, description=CROSS_SITE_REFUSED)
        return
    origin = request.headers.get("Origin")
    if origin is not None and (
        origin == "null" or urlsplit(origin).netloc != request.host
    ):
        abort(403, description=CROSS_SITE_REFUSED)


# (lower-case name, name, value); a header a view set itself is kept.
_EVERY_RESPONSE = (
    ("x-content-type-options", "X-Content-Type-Options", "nosniff"),
    ("referrer-policy", "Referrer-Policy", "same-origin"),
)
_HTML_PAGES = _EVERY_RESPONSE + (
    ("content-security-policy", "Content-Security-Policy", CONTENT_SECURITY_POLICY),
    # For browsers that predate frame-ancestors.
    ("x-frame-options", "X-Frame-Options", "DENY"),
)


def add_security_headers(response: Response) -> Response:
    # One pass over the headers and no Content-Type parsing: this runs on every
    # response, and setdefault() per header plus ``response.mimetype`` cost a
    # request more than the rest of its after-request hooks together.
    headers = response.headers
    present = {name.lower() for name, _ in headers}
    content_type = headers.get("Content-Type")
    is_html = (
        content_type is not None
        and content_type.partition(";")[0].strip().lower() == "text/html"
    )
    for key, name, value in _HTML_PAGES if is_html else _EVERY_RESPONSE:
        if key not in present:
            headers.add(name, value)
    return response


def init_app(app: Flask) -> None:
    # Ahead of the CSRF check, so a cross-site post is told why rather than
    # "CSRF token missing"; after the request log's start, so it is logged.
    hooks = app.before_request_funcs.setdefault(None, [])
    csrf_at = next(
        (n for n, f in enumerate(hooks) if f.__module__.startswith("flask_wtf")),
        len(hooks),
    )
    hooks.insert(csrf_at, refuse_cross_site_changes)
    app.after_request(add_security_headers)
    proxies = int(app.config["LOCKKEEPER_PROXY_COUNT"])
    if proxies:
        # The client address (login limits, request log) and scheme from the
        # X-Forwarded-* entries the last ``proxies`` hops added; more entries
        # than that were written by the client and are ignored.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)
