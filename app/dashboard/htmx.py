"""Rendering one template as a whole page or as the fragment htmx asked for.

A URL that htmx swaps a part of must still render the whole page when a browser
loads it (links, Back, no JavaScript), so both come from the same URL and the
response says ``Vary: HX-Request``. History restores (htmx 4 re-requests the page
on Back) and ``HX-Request-Type: full`` always get the whole page.
"""

from __future__ import annotations

from collections.abc import Mapping

from flask import Response, make_response, render_template, request


def is_htmx() -> bool:
    """An htmx request that wants a part of the page swapped."""
    headers = request.headers
    return (
        headers.get("HX-Request") == "true"
        and headers.get("HX-History-Restore-Request") != "true"
        and headers.get("HX-Request-Type", "partial") != "full"
    )


def htmx_target() -> str | None:
    """The id of the element htmx swaps into (``HX-Target`` is ``tag#id``)."""
    if not is_htmx():
        return None
    target = request.headers.get("HX-Target", "")
    return target.rpartition("#")[2] or None


def render_page_or_fragment(
    page_template: str,
    fragments: Mapping[str, str],
    status: int = 200,
    **context,
) -> Response:
    """Render ``page_template``, or ``fragments[target id]`` for htmx aiming there.

    An htmx request for a target we do not know gets the whole page, which is
    always correct, only larger.
    """
    target = htmx_target()
    template = fragments.get(target, page_template) if target else page_template
    response = make_response(render_template(template, **context), status)
    response.vary.add("HX-Request")
    response.vary.add("HX-Target")
    if template != page_template:
        # Fragments are polled and swapped; never cache one where a page belongs.
        response.headers["Cache-Control"] = "no-store"
    return response
