"""Dashboard pages and actions: parse the request, call the service, render.

Every page is a full page for a browser and a fragment for htmx (see ``htmx.py``);
actions answer as ``forms.py`` describes, a success back to the lock's page.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from typing import Any

from flask import (
    Response,
    abort,
    make_response,
    render_template,
    request,
    session,
    url_for,
)
from flask_login import current_user
from lockkeeper_core import validation
from lockkeeper_core.counts import OwnerCounts
from lockkeeper_core.errors import (
    HeldByHolders,
    InvalidInput,
    LockChanged,
    LockHeld,
    LockNotFound,
    ResourceFrozen,
    UnknownSession,
)
from lockkeeper_core.filters import ENTRIES_RESOURCES
from lockkeeper_core.operator import AllReleased
from lockkeeper_core.results import Lock
from lockkeeper_core.state import LockState

from app.audit.service import (
    FOLDED,
    EventFilter,
    last_run,
    list_events,
    newest_event_id,
    renewals,
    session_expiries,
    tenures,
)
from app.auth.views import login_required, operator_required
from app.dashboard import charts, forms, timeline
from app.dashboard.blueprint import bp
from app.dashboard.forms import (
    action_response,
    finished,
    reason_field,
    return_to,
    text_arg,
    text_field,
    url_with,
)
from app.dashboard.htmx import htmx_target, is_htmx, render_page_or_fragment
from app.extensions import lock_service

PAGE_SIZE = 25
# The page sizes the overview offers (``?size=``), the first the default.
PAGE_SIZES = (25, 50, 100)
MAX_PAGE = 1_000_000  # a page number past any table's last page
HISTORY_PAGE_SIZE = 20
# The timeline draws at most this many of the newest events.
TIMELINE_EVENTS = 300
POLL_SECONDS = 5
TABS = ("all", "contended", "held", "expiring", "stale")
# A sort name of the page (a column's label, or an order's) -> the service's
# sort key; the table's headers and the order links use these names.
SORTABLE = {
    "resource": "natural",
    "owner": "owner",
    "acquired": "acquired",
    "remaining": "expires",
    "waiting": "waiters",
    "urgent": "urgent",
}
PAGE_NAMES = {key: name for name, key in SORTABLE.items()}
# Contended and expiring locks first, stale ones last.
DEFAULT_SORT = "urgent"
GROUPS = ("owner", "host", "prefix")
# The version of the data a page shows; its polls send it back, and an unchanged
# version is answered 204 (htmx swaps nothing, the page keeps its place).
SHOWN_VERSION_HEADER = "Lockkeeper-Shown"
# The fragments that polls ask for; a poll never changes the remembered pause.
POLL_TARGETS = ("live", "lock-live")
PAUSED_KEY = "dashboard_paused"


def is_live() -> bool:
    """Polling on or paused: ``?live=0|1`` decides and is remembered for the
    session, so the header's links and the lock pages keep a pause."""
    raw = request.args.get("live")
    if raw in ("0", "1"):
        paused = raw == "0"
        if htmx_target() not in POLL_TARGETS and session.get(PAUSED_KEY) != paused:
            session[PAUSED_KEY] = paused
        return not paused
    return not session.get(PAUSED_KEY, False)


def shown_version(*parts: Any) -> str:
    """A short, stable digest of what a page shows (see ``_unchanged``)."""
    raw = json.dumps([*parts, current_user.role], default=str, separators=(",", ":"))
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def _unchanged(version: str) -> Response | None:
    """204 for an htmx poll whose page already shows ``version``."""
    if not is_htmx() or request.headers.get(SHOWN_VERSION_HEADER) != version:
        return None
    return _no_change()


def _shown_parts() -> list[str] | None:
    """The overview's version a poll of its live region sends back, in its
    three parts: what happened (the newest event, the counts and the waiting
    lines; ``-`` for a search), the rows shown (which, in what order, in which
    state, by whom; the counts), and when they end. A renewal moves only the
    last: the poll then gets the rows' time left, not the table (``overview``)."""
    if htmx_target() != "live":
        return None
    parts = request.headers.get(SHOWN_VERSION_HEADER, "").split(".")
    return parts if len(parts) == 3 else None


def _fragment(template: str, **context: Any) -> Response:
    """A part of a page for htmx, never cached where a page belongs."""
    response = make_response(render_template(template, **context))
    response.headers["Cache-Control"] = "no-store"
    response.vary.add("HX-Request")
    response.vary.add("HX-Target")
    return response


def _no_change() -> Response:
    """204: the poll's page already shows what there is."""
    response = make_response("", 204)
    # No body, so no type: every open page sends this every few seconds.
    del response.headers["Content-Type"]
    response.headers["Cache-Control"] = "no-store"
    response.vary.add("HX-Request")
    response.vary.add("HX-Target")
    return response


@bp.get("/")
@login_required
def overview():
    state = request.args.get("state", "all")
    prefix = text_arg("prefix")
    owner = text_arg("owner")
    cursor = text_arg("cursor")
    sort = text_arg("sort") or DEFAULT_SORT
    size, number, paging_errors = _paging()
    # The page's names are the columns' labels (``?sort=remaining``); the
    # service's own keys (``?sort=expires``) are read as those names.
    name = sort.lstrip("-")
    direction = sort[: len(sort) - len(name)]
    sort = direction + PAGE_NAMES.get(name, name)
    sort_key = direction + SORTABLE.get(name, name)
    group = text_arg("group")
    live = is_live()
    filters = {
        "state": state,
        "prefix": prefix,
        "owner": owner,
        "sort": sort,
        "size": size,
    }
    if group:
        filters["group"] = group
    service = lock_service()

    def url(**changes: Any) -> str:
        params = {**filters, **changes}
        if params.get("state") == "all":
            params["state"] = None
        if params.get("sort") == DEFAULT_SORT:
            params["sort"] = None
        if params.get("size") == PAGE_SIZES[0]:
            params["size"] = None
        if params.get("page") == 1:
            params["page"] = None
        return url_with("/", **params)

    def sort_url(column: str) -> str:
        """The header link: sort by ``column``, or reverse it if it is the order."""
        return url(sort=f"-{column}" if sort == column else column, cursor=None)

    here = url(cursor=cursor, page=number)
    # A search counts what it shows: its counters and tab counts are of the
    # matching locks, and its version is of its own rows and counts, so a quiet
    # search answers its polls 204 while locks elsewhere change.
    searched = bool(prefix or owner)
    # Everything on the page is judged at one instant, read once: on PostgreSQL
    # and MariaDB each reading of the clock is a round trip. The counts and
    # the contended count come in one statement (one pass over every lock and
    # the holder-held resources instead of two).
    at = service.now()
    # A grouped view reads its groups and its counts in one statement (the
    # counts are the groups' sums there, ``grouped_with_counts``).
    grouping = group in GROUPS and not paging_errors
    every_group = None
    owners_of: dict[str, list[str]] = {}
    last_seen: dict[str, datetime] = {}
    if grouping and not searched:
        every_group, everywhere, contended_everywhere, owners_of = grouped(
            service, group, at=at
        )
    else:
        everywhere, contended_everywhere = service.counts_and_contended(at=at)
    counts = everywhere
    # The version a poll of the live region says it shows, in its three parts
    # (``_shown_parts``): what happened, what the rows are, when they end.
    polled = _shown_parts()
    happened = "-"
    if not searched:
        # Read before the rows: a change in between makes the next poll fetch
        # again, never miss. Waiting writes no events: the lines' own version
        # shows their changes. Unchanged, the poll is a 204 without reading
        # the rows.
        happened = shown_version(
            newest_event_id(),
            [counts[s] for s in LockState],
            service.queue.version(at=at),
            here,
            live,
        )
        if polled is not None and polled[0] == happened:
            return _no_change()

    errors: list[tuple[str, str]] = []
    status = 200
    page = groups = None
    contended = state == "contended"
    contended_count = 0
    pages = 1
    try:
        if paging_errors:
            raise InvalidInput(paging_errors)
        if group is not None and group not in GROUPS:
            raise InvalidInput([("group", "must be owner, host or prefix")])
        contended_count = contended_everywhere
        if grouping and searched:
            every_group, counts, contended_count, owners_of = grouped(
                service, group, prefix=prefix, owner=owner, at=at
            )
        elif searched:
            counts, contended_count = service.counts_and_contended(
                prefix=prefix, owner_contains=owner, at=at
            )
        if every_group is not None:
            # A grouped view lists groups, not locks: one page of them (a
            # view of 500 owners rendered whole was most of its time, and
            # 160 KB a poll).
            pages = max(1, math.ceil(len(every_group) / size))
            groups = every_group[(number - 1) * size : number * size]
            if owners_of:
                last_seen = groups_last_seen(service, groups, owners_of, at)
        else:
            # Numbered pages, unless a cursor (an older link) asks for keyset pages.
            shown = {"all": sum(counts.values()), "contended": contended_count}
            pages = max(1, math.ceil(shown.get(state, counts.get(state, 0)) / size))
            page = service.list_locks(
                state=None if contended else state,
                contended=contended,
                prefix=prefix,
                owner_contains=owner,
                limit=size,
                cursor=cursor,
                offset=None if cursor else (number - 1) * size,
                sort=sort_key,
                # A resource held by holders is one row: its holders used of the
                # limit, its grant that ends first.
                entries=ENTRIES_RESOURCES,
                at=at,
            )
    except InvalidInput as exc:
        errors, status, page = exc.errors, 400, None
    rows = page.items if page else []
    layout = shown_version(
        [counts[s] for s in LockState],
        contended_count,
        [
            [lock.resource, lock.owner, lock.token, lock.fence, lock.state]
            + [lock.acquired_at, lock.waiters, lock.holders, lock.limit, lock.mode]
            + [lock.session]
            for lock in rows
        ],
        groups
        and [
            [g.name, g.held, g.expiring, g.stale, last_seen.get(g.name)] for g in groups
        ],
        errors,
        here,
        live,
    )
    ends = shown_version([lock.expires_at for lock in rows])
    version = f"{happened}.{layout}.{ends}"
    if polled is not None and polled[1] == layout:
        if polled[0] == happened and polled[2] == ends:
            return _no_change()
        # The same rows in the same order and states: a renewal moved their
        # expiries, or something changed elsewhere. Their time left (or, with
        # none moved, only the new version) instead of the table again.
        return _fragment(
            "dashboard/_live_update.html",
            moved=rows if polled[2] != ends else [],
            refreshed_at=at,
            poll_url=url(cursor=cursor, page=number, live="1" if live else "0"),
            live=live,
            poll_seconds=POLL_SECONDS,
            version=version,
        )

    return render_page_or_fragment(
        "dashboard/overview.html",
        {"locks": "dashboard/_locks.html", "live": "dashboard/_live.html"},
        status=status,
        page=page,
        counts=counts,
        contended_count=contended_count,
        total=sum(counts.values()),
        searched=searched,
        bulk_limit=forms.BULK_LIMIT,
        total_everywhere=sum(everywhere.values()),
        errors=errors,
        state=state if state in TABS else "all",
        prefix=prefix or "",
        owner=owner or "",
        live=live,
        tabs=TABS,
        url=url,
        sort=sort,
        sort_url=sort_url,
        group=group,
        groups=groups,
        last_seen=last_seen,
        here=here,
        poll_url=url(cursor=cursor, page=number, live="1" if live else "0"),
        switch_url=url(live="0" if live else "1", cursor=cursor, page=number),
        first_url=url() if cursor else None,
        next_url=url(cursor=page.next_cursor) if page and page.next_cursor else None,
        page_number=number,
        pages=pages,
        page_size=size,
        page_sizes=PAGE_SIZES,
        page_links=page_links(number, pages),
        refreshed_at=at,
        poll_seconds=POLL_SECONDS,
        version=version,
        freezes=service.list_freezes(at=at),
        banner_resource=None,
        banner_url=url_for("dashboard.freezes"),
        banner_return="/",
        activity_url=url_for("dashboard.activity", live="1" if live else "0"),
    )


def _paging() -> tuple[int, int, list[tuple[str, str]]]:
    """The page size and page number the overview asks for, and what is
    wrong with them (the defaults stand in for a bad one)."""
    errors = []
    size, number = PAGE_SIZES[0], 1
    raw_size, raw_page = text_arg("size"), text_arg("page")
    if raw_size is not None:
        asked = validation.client_integer(raw_size)
        if asked in PAGE_SIZES:
            size = asked
        else:
            sizes = ", ".join(map(str, PAGE_SIZES))
            errors.append(("size", f"must be one of {sizes}"))
    if raw_page is not None:
        asked = validation.client_integer(raw_page, minimum=1, maximum=MAX_PAGE)
        if asked is not None:
            number = asked
        else:
            errors.append(("page", "must be a page number, 1 or more"))
    return size, number, errors


def page_links(number: int, pages: int) -> list[int | None]:
    """The page numbers a pager shows: the first, the last, and two either
    side of this one; None where numbers are left out."""
    shown = sorted({1, pages, *range(max(1, number - 2), min(pages, number + 2) + 1)})
    links: list[int | None] = []
    for n in shown:
        if links and n - (links[-1] or 0) > 1:
            links.append(None)
        links.append(n)
    return links


def host_of(owner: str) -> str:
    """The host part of an owner: the client's default owners are
    ``host:pid:random``; ``name@host`` is the other common shape."""
    if ":" in owner:
        return owner.split(":", 1)[0]
    if "@" in owner:
        return owner.rsplit("@", 1)[1]
    return owner


def grouped(
    service, group: str, *, prefix: str | None = None, owner: str | None = None, at
) -> tuple[list[OwnerCounts], dict[LockState, int], int, dict[str, list[str]]]:
    """The locks matching the search counted per ``group``, most stale first,
    with their counts per state, how many are contended, and the owners of
    each owner or host group (none for prefixes)."""
    found, counts, contended = service.grouped_with_counts(
        "prefix" if group == "prefix" else "owner",
        prefix=prefix,
        owner_contains=owner,
        at=at,
    )
    if group == "prefix":
        return found, counts, contended, {}
    summed, owners_of = group_counts(found, group)
    return summed, counts, contended, owners_of


def group_counts(
    by_owner: list[OwnerCounts], group: str
) -> tuple[list[OwnerCounts], dict[str, list[str]]]:
    """Per owner (as the service counts them, an owner search applied) or
    summed per host, most stale first; and each group's owners."""
    if group == "owner":
        return by_owner, {counts.name: [counts.name] for counts in by_owner}
    hosts: dict[str, list[int]] = {}
    owners_of: dict[str, list[str]] = {}
    for counts in by_owner:
        host = host_of(counts.name)
        total = hosts.setdefault(host, [0, 0, 0])
        total[0] += counts.held
        total[1] += counts.expiring
        total[2] += counts.stale
        owners_of.setdefault(host, []).append(counts.name)
    summed = [OwnerCounts(host, *numbers) for host, numbers in hosts.items()]
    return sorted(summed, key=lambda g: (-g.stale, -g.total, g.name)), owners_of


def groups_last_seen(
    service, groups: list[OwnerCounts], owners_of: dict[str, list[str]], at
) -> dict[str, datetime]:
    """When each shown owner or host group was last seen (its owners' latest,
    ``LockService.last_seen``): a dead host is the one not seen for a while."""
    seen = service.last_seen(
        [owner for g in groups for owner in owners_of.get(g.name, ())], at=at
    )
    found = {}
    for g in groups:
        instants = [seen[o] for o in owners_of.get(g.name, ()) if o in seen]
        if instants:
            found[g.name] = max(instants)
    return found


ACTIVITY_POLL_SECONDS = 60
# While the older part of a first drawing is counted in the background (a few
# seconds at a million events), the charts poll this often: the whole range
# shows as soon as it is stored, not a minute later.
COUNTING_POLL_SECONDS = 5


@bp.get("/activity")
@login_required
def activity():
    """The last hour (or ``?range=24h`` / ``7d``) as two small charts; loaded by
    the overview after its table, and polled slowly. The charts change once a
    minute (``charts``)."""
    live = is_live()
    shown = charts.SPANS.get(request.args.get("range", charts.DEFAULT_SPAN.name))
    if shown is None:
        abort(400, description="range is one of " + ", ".join(charts.SPANS) + ".")
    service = lock_service()
    drawn = charts.cached(service.now(), service.settings.expiring_within, shown)
    # What the charts show, not when they were drawn: counts per bucket, back
    # from now, and the instants they name (the peaks', the bars' on hover).
    # Their axes say how long ago, so the same counts draw the same charts; a
    # quiet range's poll is a 204.
    version = shown_version(
        shown.name,
        [[s.held, s.expiring, s.stale] for s in drawn.samples],
        [count for _, count in drawn.per_minute],
        [sorted(counts.items()) for _, counts in drawn.refused],
        [c.peak_at for c in (drawn.states, drawn.events, drawn.refusals)],
        [bar[4] for bar in drawn.events.bars],
        drawn.uncounted,
        live,
    )
    unchanged = _unchanged(version)
    if unchanged is not None:
        return unchanged
    return render_page_or_fragment(
        "dashboard/activity.html",
        {"activity": "dashboard/_activity.html"},
        activity=drawn,
        activity_live=live,
        activity_version=version,
        activity_poll_seconds=(
            ACTIVITY_POLL_SECONDS if not drawn.uncounted else COUNTING_POLL_SECONDS
        ),
        spans=charts.SPANS.values(),
    )


def _checked_resource(resource: str) -> str:
    error = validation.resource_error(resource)
    if error:
        abort(400, description=f"{resource!r} is not a lock name: it {error}.")
    return resource


def _lock_url(resource: str) -> str:
    return url_for("dashboard.lock_page", resource=resource)


def _current_lock(resource: str) -> Lock | None:
    try:
        return lock_service().get(resource, include_stale=True)
    except LockNotFound:
        return None


@bp.get("/locks/<resource>")
@login_required
def lock_page(resource: str):
    _checked_resource(resource)
    cursor = text_arg("cursor")
    # Renewals folded into their grant unless ``?rows=all`` (as on /audit).
    every_row = text_arg("rows") == "all"
    live = is_live()
    service = lock_service()
    page_url = _lock_url(resource)
    # ``?zoom=<fence>``: the timeline drawn around that grant's tenure.
    zoom_arg = text_arg("zoom")
    zoom = None
    if zoom_arg is not None:
        zoom = validation.client_integer(
            zoom_arg, minimum=0, maximum=validation.MAX_BIGINT
        )
        if zoom is None:
            abort(400, description="zoom must be the fence of a grant to zoom to.")

    def url(**params: Any) -> str:
        kept = {"rows": "all" if every_row else None, "zoom": zoom}
        return url_with(page_url, **{**kept, **params})

    newest = newest_event_id(resource)
    lock = _current_lock(resource)
    lock_session = service.sessions.of_lock(resource) if lock is not None else None
    # Held by holders (a semaphore's, or shared grants): every one of them.
    held_by = (
        service.holders(resource)
        if lock is not None and (lock.limit > 1 or lock.mode != "exclusive")
        else None
    )
    waiting = service.queue.line(resource)
    # The live grants a set took with others: each links to its set's page.
    grant_sets = service.sets_of_grants(
        [(resource, h.fence, h.acquired_at) for h in held_by.holders]
        if held_by is not None
        else [(resource, lock.fence, lock.acquired_at)]
        if lock is not None and lock.owner
        else []
    )
    version = shown_version(
        newest,
        lock and [lock.fence, lock.owner, lock.expires_at, lock.state],
        held_by and [[h.fence, h.owner, h.expires_at] for h in held_by.holders],
        sorted(grant_sets.values()),
        lock_session and [lock_session.id, lock_session.expires_at],
        # A kept place taken back may ask for another mode under its id.
        [[waiter.id, waiter.mode, waiter.limit] for waiter in waiting],
        cursor,
        every_row,
        zoom,
        live,
    )
    unchanged = _unchanged(version)
    if unchanged is not None:
        return unchanged
    shown = EventFilter(resource=resource)
    if not every_row:
        shown = EventFilter(resource=resource, actions=FOLDED, except_actions=True)
    try:
        history = list_events(shown, limit=HISTORY_PAGE_SIZE, cursor=cursor)
    except InvalidInput as exc:
        abort(400, description=str(exc))
    folded = {} if every_row else renewals(history.items)
    now = service.now()
    recent = list_events(EventFilter(resource=resource), limit=TIMELINE_EVENTS).items
    return render_page_or_fragment(
        "dashboard/lock.html",
        {"lock-live": "dashboard/_lock_live.html"},
        resource=resource,
        lock=lock,
        lock_session=lock_session,
        held_by=held_by,
        grant_sets=sorted({f: set_id for (_, f), set_id in grant_sets.items()}.items()),
        waiting=waiting,
        last_run=last_run(resource),
        history=history,
        tenures=tenures(history.items),
        renewals=folded,
        every_row=every_row,
        every_row_url=url(rows="all"),
        changes_url=url(rows=None),
        here=url(cursor=cursor),
        poll_url=url(cursor=cursor, live="1" if live else "0"),
        switch_url=url(cursor=cursor, live="0" if live else "1"),
        live=live,
        poll_seconds=POLL_SECONDS,
        version=version,
        first_url=url() if cursor else None,
        next_url=url(cursor=history.next_cursor) if history.next_cursor else None,
        # A resource held by holders now has had holders at once, even when the
        # events read show only their renewals.
        timeline=timeline.build(
            recent,
            now,
            parallel=True if held_by is not None else None,
            sessions=session_expiries(recent),
            zoom=zoom,
        ),
        zoom_url=lambda fence: url(cursor=cursor, zoom=fence),
        unzoomed_url=url(cursor=cursor, zoom=None),
        timeline_truncated=len(recent) == TIMELINE_EVENTS,
        now=now,
        refreshed_at=now,
        freezes=service.freezes_over(resource),
        banner_resource=resource,
        banner_url=url_for("dashboard.freezes", resource=resource),
        banner_return=page_url,
    )


# -- actions ---------------------------------------------------------------------


def _confirmed_fence(errors: list[tuple[str, str]]) -> int | None:
    """The fence of the grant the operator confirmed (a hidden form field)."""
    raw = text_field("fence")
    if raw is None:
        return None
    fence = validation.client_integer(raw, minimum=0, maximum=validation.MAX_BIGINT)
    if fence is None:
        errors.append(("fence", "must be the fence of the lock you confirmed"))
    return fence


def _refusal(
    exc: InvalidInput | LockChanged, field: str, context: dict[str, Any]
) -> tuple[list[tuple[str, str]], int]:
    """The errors to show on the form and the status, for a refused action; a
    grant that changed hands is shown as it is now, under ``field``."""
    if isinstance(exc, InvalidInput):
        return exc.errors, 400
    context["lock"] = exc.holder
    if exc.holder is None:
        message = "The lock changed since you looked: nobody holds it now."
    else:
        message = (
            f"The lock changed hands since you looked: it is now held by "
            f"{exc.holder.owner} with fence {exc.holder.fence}. Confirm again to "
            f"act on this grant."
        )
    return [(field, message)], 409


@bp.route("/locks/<resource>/release", methods=["GET", "POST"])
@operator_required
def release(resource: str):
    _checked_resource(resource)
    lock = _current_lock(resource)
    context = {
        "resource": resource,
        "lock": lock,
        "next_url": return_to(_lock_url(resource)),
    }
    if lock is not None and lock.is_holder_row:
        held = lock_service().holders(resource).holders
        return _release_holders_instead(resource, held, context["next_url"])
    if lock is None:
        if request.method == "POST" and is_htmx():
            return action_response(
                "dashboard/_result.html",
                404,
                message=f"{resource} is not locked: nothing to release.",
                ok=False,
            )
        abort(404, description=f"{resource} is not locked: nothing to release.")
    if request.method == "GET":
        return action_response("dashboard/_release_form.html", **context)

    reason = reason_field()
    errors: list[tuple[str, str]] = []
    status = 400
    fence = _confirmed_fence(errors)
    if not errors:
        try:
            released = lock_service().force_release(
                resource,
                actor=current_user.username,
                reason=reason,
                expected_fence=fence,
            )
        except (InvalidInput, LockChanged) as exc:
            errors, status = _refusal(exc, "fence", context)
        except LockNotFound:
            held = lock_service().holders(resource).holders
            if held:
                return _release_holders_instead(resource, held, context["next_url"])
            return finished(f"{resource} was already released.", _lock_url(resource))
        else:
            return finished(
                f"Released {resource} (was held by {released.owner}, "
                f"fence {released.fence}).",
                _lock_url(resource),
            )
    return action_response(
        "dashboard/_release_form.html",
        status,
        errors=errors,
        reason=reason or "",
        **context,
    )


def _release_holders_instead(resource: str, held: list, next_url: str):
    """The whole-lock release of a resource held by holders (a semaphore's, or
    shared grants): its form confirms one grant, so it shows the holders' form
    instead, every grant with its fence to confirm. Asked for it, the form;
    posted (the page showed one lock, or none), nothing is released: 409 with
    the grants there now, which the operator confirms or releases one by one
    from the lock page."""
    errors = []
    status = 200
    if request.method == "POST":
        count = len(held)
        status = 409
        errors = [
            (
                "fence",
                f"{resource} is held by {count} grant{'' if count == 1 else 's'} "
                "at once (a semaphore's places or shared grants), not by the lock "
                "you confirmed: nothing was released. Confirm the grants below to "
                "release them all, or release one from the lock page's holders.",
            )
        ]
    return action_response(
        "dashboard/_release_holders_form.html",
        status,
        resource=resource,
        holders=held,
        next_url=next_url,
        errors=errors,
        reason=reason_field() or "",
    )


@bp.route("/locks/<resource>/holders/<int:fence>/release", methods=["GET", "POST"])
@operator_required
def release_holder(resource: str, fence: int):
    """Force-release the one grant of a resource held by holders that carries
    ``fence`` (the one the operator saw); the others stay."""
    _checked_resource(resource)
    held = lock_service().holders(resource).holders
    holder = next((h for h in held if h.fence == fence), None)
    context = {
        "resource": resource,
        "fence": fence,
        "holder": holder,
        "next_url": return_to(_lock_url(resource)),
    }
    if request.method == "GET":
        if holder is None:
            abort(404, description=f"No grant of {resource} carries fence {fence}.")
        return action_response("dashboard/_release_holder_form.html", **context)
    reason = reason_field()
    errors: list[tuple[str, str]] = []
    status = 400
    try:
        released = lock_service().force_release_holder(
            resource, fence, actor=current_user.username, reason=reason
        )
    except InvalidInput as exc:
        errors = exc.errors
    except LockChanged as exc:
        status, context["holder"] = 409, None
        now = (
            f"the grant that ends first is {exc.holder.owner}'s, fence "
            f"{exc.holder.fence}"
            if exc.holder is not None
            else "nobody holds it now"
        )
        errors = [
            (
                "fence",
                f"No grant of {resource} carries fence {fence} any more "
                f"(released or taken over since you looked); {now}.",
            )
        ]
    else:
        return finished(
            f"Released {released.owner}'s grant of {resource} "
            f"(fence {released.fence}); the others stay.",
            _lock_url(resource),
        )
    return action_response(
        "dashboard/_release_holder_form.html",
        status,
        errors=errors,
        reason=reason or "",
        **context,
    )


def _confirmed_fences(errors: list[tuple[str, str]]) -> list[int]:
    """The fences of the grants the confirmation showed (hidden fields)."""
    fences = []
    for raw in request.form.getlist("fence"):
        fence = validation.client_integer(raw, minimum=0, maximum=validation.MAX_BIGINT)
        if fence is None:
            errors.append(("fence", "must be the fences of the grants you confirmed"))
            return []
        fences.append(fence)
    if not fences and not errors:
        errors.append(("fence", "confirm the grants shown first"))
    return fences


@bp.route("/locks/<resource>/holders/release", methods=["GET", "POST"])
@operator_required
def release_holders(resource: str):
    """Force-release every grant of a resource (its holders, shared grants or
    exclusive grant) that the confirmation showed; one that came since (its
    fence not among those shown) is left alone and reported."""
    _checked_resource(resource)
    service = lock_service()
    context: dict[str, Any] = {
        "resource": resource,
        "holders": service.holders(resource).holders,
        "next_url": return_to(_lock_url(resource)),
    }
    if request.method == "GET":
        if not context["holders"]:
            abort(404, description=f"{resource} is not locked: nothing to release.")
        return action_response("dashboard/_release_holders_form.html", **context)
    reason = reason_field()
    errors: list[tuple[str, str]] = []
    status = 400
    fences = _confirmed_fences(errors)
    if not errors:
        try:
            done = service.force_release_all(
                resource, actor=current_user.username, reason=reason, fences=fences
            )
        except InvalidInput as exc:
            errors = exc.errors
        except LockNotFound:
            return finished(f"{resource} was already released.", _lock_url(resource))
        else:
            message = _holders_released_message(resource, done)
            if done.released:
                return finished(message, _lock_url(resource))
            # Every grant shown has ended or changed: confirm the new ones.
            status, errors = 409, [("fence", message)]
            context["holders"] = service.holders(resource).holders
    return action_response(
        "dashboard/_release_holders_form.html",
        status,
        errors=errors,
        reason=reason or "",
        **context,
    )


def _holders_released_message(resource: str, done: AllReleased) -> str:
    count = len(done.released)
    message = f"Released {count} grant{'' if count == 1 else 's'} of {resource}"
    if done.released:
        message += ": " + ", ".join(
            f"{lock.owner} (fence {lock.fence})" for lock in done.released
        )
    message += "."
    if done.left_alone:
        message += (
            " Left alone, taken since you looked: "
            + ", ".join(
                f"{lock.owner} (fence {lock.fence})" for lock in done.left_alone
            )
            + "."
        )
    if done.gone:
        fences = ", ".join(str(fence) for fence in done.gone)
        message += f" Ended already: fence {fences}."
    return message


# The most sessions the page lists (the longest overdue first).
SESSIONS_SHOWN = 200


@bp.get("/sessions")
@login_required
def sessions_page():
    """The workers' sessions, the longest overdue first: owner, token, bound
    grants, last heartbeat, how late past its ttl; "End session…" per row."""
    listed, now = lock_service().sessions.listing(SESSIONS_SHOWN)
    return render_page_or_fragment(
        "dashboard/sessions.html",
        {"sessions": "dashboard/_sessions.html"},
        listed=listed,
        now=now,
        shown_at_most=SESSIONS_SHOWN,
    )


@bp.route("/sessions/<session_id>/end", methods=["GET", "POST"])
@operator_required
def end_session(session_id: str):
    """End a worker's session: every grant bound to it force-released (one
    event each, with the reason), through ``LockService.sessions``."""
    sessions = lock_service().sessions
    resource = text_arg("resource") or text_field("resource")
    fallback = _lock_url(resource) if resource else url_for("dashboard.overview")
    try:
        found = sessions.get(session_id, token=None)
    except (UnknownSession, InvalidInput):
        if request.method == "POST" and is_htmx():
            return action_response(
                "dashboard/_result.html",
                404,
                message="That session has ended already.",
                ok=False,
            )
        abort(404, description="That session has ended already.")
    context = {
        "lock_session": found,
        "resource": resource,
        "next_url": return_to(fallback),
        "now": lock_service().now(),
    }
    if request.method == "GET":
        return action_response("dashboard/_end_session_form.html", **context)
    reason = reason_field()
    try:
        ended = sessions.end(
            session_id, token=None, actor=current_user.username, reason=reason
        )
    except InvalidInput as exc:
        return action_response(
            "dashboard/_end_session_form.html",
            400,
            errors=exc.errors,
            reason=reason or "",
            **context,
        )
    except UnknownSession:
        return finished("That session had ended already.", fallback)
    if ended.expired:
        return finished(
            f"Ended the session of {ended.owner}: it had expired, and its locks "
            "ran out with it (recorded as of its expiry); they are free now.",
            fallback,
        )
    count = len(ended.locks)
    return finished(
        f"Ended the session of {ended.owner}: released {count} "
        f"lock{'' if count == 1 else 's'}.",
        fallback,
    )


def _parse_ttl(raw: str | None, errors: list[tuple[str, str]]) -> float | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        errors.append(("ttl", "must be a number of seconds"))
        return None
    if not math.isfinite(value):
        errors.append(("ttl", "must be a finite number of seconds"))
        return None
    return value


@bp.route("/locks/<resource>/claim", methods=["GET", "POST"])
@operator_required
def claim(resource: str):
    _checked_resource(resource)
    service = lock_service()
    lock = _current_lock(resource)
    default_owner = f"operator:{current_user.username}"
    context: dict[str, Any] = {
        "resource": resource,
        "lock": lock,
        "next_url": return_to(_lock_url(resource)),
        "default_ttl": service.settings.default_ttl,
        "max_ttl": service.settings.max_ttl,
    }
    if request.method == "GET":
        return action_response(
            "dashboard/_claim_form.html",
            owner=default_owner,
            for_token="",
            ttl="",
            reason="",
            **context,
        )

    errors: list[tuple[str, str]] = []
    owner = text_field("owner") or default_owner
    for_token = text_field("for_token")
    raw_ttl = request.form.get("ttl")
    ttl = _parse_ttl(raw_ttl, errors)
    reason = text_field("reason")
    force = request.form.get("force") == "yes"
    mode = "shared" if request.form.get("mode") == "shared" else "exclusive"
    fence = _confirmed_fence(errors)
    status = 400
    if not errors:
        try:
            claimed = service.claim(
                resource,
                owner,
                ttl,
                actor=current_user.username,
                reason=reason,
                force=force,
                expected_fence=fence,
                for_token=for_token,
                mode=mode,
            )
        except (InvalidInput, LockChanged) as exc:
            errors, status = _refusal(exc, "force", context)
        except HeldByHolders as exc:
            # Held by holders: no box takes one of theirs; the reason is shown.
            context["lock"] = exc.holder
            errors.append(("mode", f"Not claimed: {exc}."))
            status = 409
        except LockHeld as exc:
            lock = exc.holder
            context["lock"] = lock
            errors.append(
                (
                    "force",
                    f"{resource} is held by {lock.owner} (fence {lock.fence}). "
                    "Tick “Take it from the holder” to claim it anyway.",
                )
            )
            status = 409
        except ResourceFrozen as exc:
            # A new grant of a frozen resource; taking it from a holder (force)
            # goes past the freeze.
            errors.append(("force", f"No claim while frozen: {exc}"))
            status = 423
        else:
            return finished(
                f"Claimed {resource} for {claimed.owner} "
                f"({f'token {claimed.token}' if claimed.token else 'no token'}, "
                f"fence {claimed.fence}, expires in {claimed.ttl_remaining:.0f} s).",
                _lock_url(resource),
            )
    return action_response(
        "dashboard/_claim_form.html",
        status,
        errors=errors,
        owner=owner,
        for_token=for_token or "",
        ttl=raw_ttl or "",
        reason=reason or "",
        force=force,
        mode=mode,
        **context,
    )
