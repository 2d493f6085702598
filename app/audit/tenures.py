"""Tenures: who held a lock when, derived from its audit events by one set of rules.

A *tenure* is one grant of ownership. The rules, used by the audit page (from
three probes per page, ``app.audit.service.tenures``) and by the lock page's
timeline (from a run of events, ``derive``):

- ``acquired``, ``took_over``, ``claimed`` and ``force_claimed`` start a tenure
  (a new fence); ``renewed`` and ``reacquired`` of the same fence continue it
  and move its expiry.
- The next release, force-release or grant on the resource is its *boundary*.
  The tenure lasted until the boundary or until the expiry its newest event
  promised, whichever came first; ``ended_by`` is the boundary's action, or
  ``expired`` when the expiry came first (a lock that ran out and was then taken
  over, force-released or purged was held only until it ran out). With no
  boundary yet it is ``held`` until now, or ``expired`` once past its expiry.
  (``unrecorded``: a continuation of another fence shows a grant whose events
  are missing; the tenure before it ended by then.)
- A boundary *records* the end (``end_id``) when it removed or replaced the
  grant: a release, a force-release, or a grant with a previous owner. A grant
  that found no row (no previous owner) records none: the row had been purged.
- Events are ordered by id: ids grow with every insert, and a resource's events
  are inserted under its row lock, so id order is the order things happened in
  even when clocks disagree about ``occurred_at``.

A resource with several holders at once (a semaphore's holders, shared grants)
follows the same rules per grant (``ends``): a tenure is its fence's, ended by
an ending naming its fence, or by a grant that replaced it (its holder's own
new grant, as a promotion: the holder is the owner and the token; an
operator's claim naming it as the previous owner) or that came once it had
run out. One holder's history gets the same boundaries by either
reading; the audit page reads every resource so (``ends_condition`` is the rule
in SQL), the timeline only those that show holders at once.

A grant bound to a session (its event's ``details`` name the session) is
renewed by the session's heartbeat, which writes no event: it does not run
out at the expiry its events recorded but at its session's (``tenure``, given
the sessions' expiries), and only an event naming it ends it earlier. When an
expired session's row is deleted (a late end, a purge), a ``released`` event
at its expiry records that each grant still bound to it ran out then
(``records_a_session_expiry``): the tenure is ``expired`` at that instant.
An event that replaced or removed a session-bound grant earlier (a take-over,
an operator's force-release or claim) records the expiry that grant had then
(``previous_expiry``): the tenure ran out then at the latest, whether or not
its session's row is still there. (An event written before it recorded that
reads as before: ``expired_unknown`` once the session's row is gone.)

Pure: no Flask, no database (``ends_condition`` builds an expression only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from lockkeeper_core.results import Event
from lockkeeper_core.state import (
    PREVIOUS_EXPIRES_AT,
    PREVIOUS_TOKEN,
    SESSION_EXPIRED,
    Action,
)
from sqlalchemy import ColumnElement, String, and_, func, or_
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

GRANTS = (Action.ACQUIRED, Action.TOOK_OVER, Action.CLAIMED, Action.FORCE_CLAIMED)
EXTENSIONS = (Action.RENEWED, Action.REACQUIRED)
ENDINGS = (Action.RELEASED, Action.FORCE_RELEASED)
BOUNDARIES = (*ENDINGS, *GRANTS)
# The events of a tenure itself: its grant and its continuations.
HOLDING = (*GRANTS, *EXTENSIONS)
EXPIRED = "expired"
# A session-bound grant whose session's row is gone ran out, but when is
# recorded nowhere (its heartbeats write no event; it was taken over, or its
# session's row deleted before its expiry was recorded on deletion).
EXPIRED_UNKNOWN = "expired_unknown"
HELD = "held"
UNRECORDED = "unrecorded"


@dataclass(frozen=True, slots=True)
class Tenure:
    """One grant of ownership.

    ``grant_id`` is None when the grant is older than the events read (a window
    that starts mid-tenure, or pruned events); ``end_id`` is the event that
    recorded the end, None when none did (purged, or not ended yet).
    """

    owner: str | None
    fence: int | None
    held_from: datetime
    held_until: datetime
    ended_by: str
    grant_id: int | None = None
    end_id: int | None = None
    forced: bool = False
    # With ``owner``, the holder: one owner may be a holder under two tokens.
    token: str | None = None

    @property
    def held_for(self) -> timedelta:
        return self.held_until - self.held_from


def records_an_end(event: Event) -> bool:
    """``event`` removed or replaced a grant, and says whose (``previous_owner``)."""
    if event.action in ENDINGS:
        return True
    return event.action in GRANTS and event.previous_owner is not None


def records_the_end_of(event: Event, owner: str | None, token: str | None) -> bool:
    """``event`` recorded the end of the tenure of (``owner``, ``token``) it
    ended: an ending (it names the fence), or a grant naming that holder as
    the one it replaced (``names_previous_holder``). A grant that ended a
    tenure otherwise (its own holder's, as a promotion; one that had run out)
    recorded no end of it."""
    if event.action in ENDINGS:
        return True
    return event.action in GRANTS and names_previous_holder(event, owner, token)


def previous_token(event: Event) -> str | None:
    """The token of the grant a take-over took ("" for none), recorded in its
    ``details``; None when its event does not say (one written before
    migration 0025, or not a take-over)."""
    found = (event.details or {}).get(PREVIOUS_TOKEN)
    return found if isinstance(found, str) else None


def previous_expiry(event: Event) -> datetime | None:
    """The expiry the session-bound grant ``event`` replaced or removed had
    then, recorded in its ``details`` (``PREVIOUS_EXPIRES_AT``); None when its
    event does not say (an unbound grant, or an event written before it was
    recorded)."""
    found = (event.details or {}).get(PREVIOUS_EXPIRES_AT)
    if not isinstance(found, str):
        return None
    try:
        return datetime.fromisoformat(found)
    except ValueError:
        return None


def names_previous_holder(event: Event, owner: str | None, token: str | None) -> bool:
    """``event`` (a grant) names (``owner``, ``token``) as the holder whose
    grant it replaced: its previous owner, and for a take-over that recorded
    it the token too (an older take-over names the owner alone)."""
    if owner is None or event.previous_owner != owner:
        return False
    taken = previous_token(event) if event.action is Action.TOOK_OVER else None
    return taken is None or taken == (token or "")


def ends(first: Event, last: Event, event: Event) -> bool:
    """Whether ``event``, later on the resource, ends the tenure whose first
    event is ``first`` (its grant, or its first continuation when the grant is
    unknown) and newest ``last``: an ending of its fence; a grant by its holder
    (the same owner and token: a promotion replaces the holder's grant); a
    claim naming its owner as the previous owner (an operator's claim or
    force-claim replaces the one grant of an exclusive lock); any grant once
    it had run out by ``last``'s expiry (a take-over takes only what ran out,
    a new grant clears expired holders, and one holder's expired row was
    purged before a grant found none).

    A take-over names the holder it took, its previous owner and (in its
    ``details``, since migration 0025) that owner's token: it ends that
    holder's tenure, which had run out, never another of that owner's (one
    owner may hold several holders under several tokens). An older take-over,
    which names the owner alone, ends only a tenure that had run out.

    ``ends_condition`` is this rule in SQL: change both together."""
    if replaces(first, last, event):
        return True
    if event.action not in GRANTS or bound_session(last) is not None:
        # A session-bound grant's expiry moved with its session's heartbeats
        # (which write no event): it did not run out at the one its events
        # recorded. ``tenure`` ends it at its session's expiry instead.
        return False
    return last.expires_at is not None and event.occurred_at >= last.expires_at


def replaces(first: Event, last: Event, event: Event) -> bool:
    """``ends`` by what ``event`` names: an ending of the tenure's fence, a
    grant by its holder, a claim naming its owner as the previous owner, a
    take-over naming its holder (owner and token) as the one it took."""
    if event.action in ENDINGS:
        return event.fence == last.fence
    if event.action not in GRANTS:
        return False
    owner = first.owner
    if owner is None:
        return False
    if event.owner == owner and event.token == first.token:
        return True
    if event.action is Action.TOOK_OVER and previous_token(event) is None:
        return False
    return names_previous_holder(event, owner, first.token)


def bound_session(event: Event) -> str | None:
    """The id of the session ``event``'s grant is bound to (its expiry is the
    session's), recorded in its ``details``; None when unbound."""
    found = (event.details or {}).get("session")
    return found if isinstance(found, str) else None


def records_a_session_expiry(event: Event) -> bool:
    """``event`` is the ``released`` event written as an expired session's row
    was deleted, for a grant still bound to it: the grant ran out at the
    session's expiry (the event's time); nobody released it."""
    return event.action is Action.RELEASED and bool(
        (event.details or {}).get(SESSION_EXPIRED)
    )


def ends_condition(later, fence, owner, token, expires_at) -> ColumnElement[bool]:
    """``ends`` in SQL: whether the event ``later`` (a table or alias of
    ``lock_events``, later on the resource) ends the tenure of ``fence``,
    held by (``token``, ``owner``) and running out at ``expires_at`` (columns
    or values; ``expires_at`` None: by what names it only, not by running
    out). An event without a token matches a holder without one.

    A session-bound tenure ends by what names it only (``ends``): the events
    this finds with ``expires_at`` given are then more than its ending, and
    the rule in Python picks among them."""
    grant_ends = [
        and_(later.c.owner == owner, later.c.token.is_not_distinct_from(token)),
        and_(
            later.c.action != Action.TOOK_OVER.value,
            later.c.previous_owner == owner,
        ),
        and_(
            later.c.action == Action.TOOK_OVER.value,
            later.c.previous_owner == owner,
            previous_token_sql(later) == func.coalesce(token, ""),
        ),
    ]
    if expires_at is not None:
        grant_ends.append(later.c.occurred_at >= expires_at)
    return or_(
        and_(later.c.action.in_([a.value for a in ENDINGS]), later.c.fence == fence),
        and_(later.c.action.in_([a.value for a in GRANTS]), or_(*grant_ends)),
    )


class PreviousTokenOf(FunctionElement):
    """``previous_token`` in SQL: the text of that key of an event's
    ``details`` (JSON text), NULL when absent. Its key is a constant, written
    into the statement."""

    type = String()
    inherit_cache = True


@compiles(PreviousTokenOf)
def _previous_token_sqlite(element, compiler, **kw) -> str:
    details = compiler.process(element.clauses, **kw)
    return f"json_extract({details}, '$.{PREVIOUS_TOKEN}')"


@compiles(PreviousTokenOf, "postgresql")
def _previous_token_postgresql(element, compiler, **kw) -> str:
    details = compiler.process(element.clauses, **kw)
    return f"(CAST({details} AS jsonb) ->> '{PREVIOUS_TOKEN}')"


@compiles(PreviousTokenOf, "mysql")
@compiles(PreviousTokenOf, "mariadb")
def _previous_token_mariadb(element, compiler, **kw) -> str:
    details = compiler.process(element.clauses, **kw)
    return f"JSON_VALUE({details}, '$.{PREVIOUS_TOKEN}')"


def previous_token_sql(event) -> ColumnElement[str]:
    """``previous_token`` of the event ``event`` (a table or alias of
    ``lock_events``) in SQL."""
    return PreviousTokenOf(event.c.details)


def continues(last: Event, event: Event) -> bool:
    """``event`` extends the tenure whose newest event is ``last``."""
    return event.action in EXTENSIONS and event.fence == last.fence


def tenure(
    grant: Event | None,
    last: Event,
    boundary: Event | None,
    now: datetime | None = None,
    sessions: Mapping[str, datetime] | None = None,
) -> Tenure:
    """The tenure whose newest event is ``last`` (its grant, or a continuation),
    ended by ``boundary`` (None: nothing has ended it yet, judged at ``now``).

    ``grant``: its grant event when known; it must carry ``last``'s fence.

    ``sessions``: the expiry of each session whose row exists, by id
    (``app.audit.service.session_expiries``). A session-bound grant runs out
    at its session's expiry, not at the one its event recorded: at the one
    ``boundary`` recorded when it replaced or removed the grant
    (``previous_expiry``), else its session's; held while the session
    lives; once its session's row is gone (purged, or ended after it had run
    out), ``expired_unknown`` from the last instant its events vouch for,
    unless an event naming it ended it.
    """
    if grant is not None and grant.fence != last.fence:
        grant = None
    first = grant or last
    owner = first.owner or first.previous_owner
    held_from = first.acquired_at or first.occurred_at
    session = bound_session(last)
    recorded = (
        previous_expiry(boundary)
        if boundary is not None and records_the_end_of(boundary, owner, first.token)
        else None
    )
    if session is None:
        expires = last.expires_at
    elif recorded is not None:
        expires = recorded
    else:
        expires = (sessions or {}).get(session)
    if boundary is None:
        if now is None:
            raise ValueError("an open tenure is judged at a given now")
        held_until, ended_by = now, HELD
    elif records_a_session_expiry(boundary):
        held_until, ended_by = boundary.occurred_at, EXPIRED
    else:
        held_until, ended_by = boundary.occurred_at, boundary.action.value
    if (
        session is not None
        and expires is None
        and not (
            boundary is not None
            # A take-over names the grant it took, which had run out before.
            and boundary.action is not Action.TOOK_OVER
            and replaces(first, last, boundary)
        )
    ):
        vouched = last.expires_at or held_until
        held_until, ended_by = min(vouched, held_until), EXPIRED_UNKNOWN
    elif expires is not None and expires < held_until:
        held_until, ended_by = expires, EXPIRED
    return Tenure(
        owner=owner,
        fence=last.fence,
        held_from=held_from,
        held_until=max(held_until, held_from),
        ended_by=ended_by,
        grant_id=grant.id if grant is not None else None,
        end_id=boundary.id
        if boundary is not None and records_the_end_of(boundary, owner, first.token)
        else None,
        forced=grant is not None and grant.action is Action.FORCE_CLAIMED,
        token=first.token,
    )


def derive(
    events: Iterable[Event],
    now: datetime,
    *,
    parallel: bool | None = None,
    sessions: Mapping[str, datetime] | None = None,
) -> list[Tenure]:
    """Every tenure in ``events`` (one resource's, any order), oldest first.

    A run that starts mid-tenure still shows it: from its first continuation, or
    from a release that ended it (which records the holder and fence).

    ``parallel``: whether the resource had several holders at once (a
    semaphore's holders, shared grants); None tells it from the events
    (``shows_parallel_holders``). Their tenures follow ``derive_parallel``.

    ``sessions``: the expiries of the sessions the grants are bound to, as
    ``tenure`` takes them.
    """
    ordered = sorted(events, key=lambda e: e.id)
    if parallel is None:
        parallel = shows_parallel_holders(ordered)
    if parallel:
        return derive_parallel(ordered, now, sessions)
    result: list[Tenure] = []
    grant: Event | None = None
    last: Event | None = None
    for event in ordered:
        if event.action in EXTENSIONS:
            if last is not None and continues(last, event):
                last = event
                continue
            if last is not None:
                # Another fence: a grant whose events are missing ended ours by
                # the time the new fence was granted.
                cut = tenure(
                    grant,
                    last,
                    None,
                    event.acquired_at or event.occurred_at,
                    sessions,
                )
                if cut.ended_by != EXPIRED:
                    cut = replace(cut, ended_by=UNRECORDED)
                result.append(cut)
            grant, last = None, event
            continue
        if event.action not in BOUNDARIES:
            continue
        if last is not None:
            result.append(tenure(grant, last, event, sessions=sessions))
        elif event.action in ENDINGS:
            result.append(tenure(None, event, event))
        grant, last = (event, event) if event.action in GRANTS else (None, None)
    if last is not None:
        result.append(tenure(grant, last, None, now, sessions))
    return result


def shows_parallel_holders(ordered: Iterable[Event]) -> bool:
    """Whether events (in id order) show grants held at once, which one
    exclusive holder never gives: a shared grant, or a grant that took no one's
    holder while another grant was live."""
    live_until: dict[int | None, datetime | None] = {}
    for event in ordered:
        if event.mode == "shared":
            return True
        if event.action in GRANTS and event.previous_owner is None:
            at = event.occurred_at
            if any(
                fence != event.fence and until is not None and until > at
                for fence, until in live_until.items()
            ):
                return True
        if event.action in ENDINGS:
            live_until.pop(event.fence, None)
        else:
            live_until[event.fence] = event.expires_at
    return False


def derive_parallel(
    ordered: Iterable[Event],
    now: datetime,
    sessions: Mapping[str, datetime] | None = None,
) -> list[Tenure]:
    """The tenures of a resource with several holders at once, from events in id
    order, by the same rules per grant (``ends``): a grant's tenure is its
    fence's, so a release, force-release, renewal or re-acquire acts on the
    tenure of the fence it names; a grant ends only the tenures it replaced
    (the same holder's earlier grant, as a promotion does, or the one an
    operator claimed or force-claimed: its previous owner's) or that had run
    out (as every take-over's had), and
    every tenure ends at its expiry at the latest. Oldest grant first."""
    result: list[Tenure] = []
    open_tenures: dict[int | None, tuple[Event | None, Event]] = {}
    for event in ordered:
        if event.action in EXTENSIONS:
            grant, last = open_tenures.get(event.fence, (None, event))
            open_tenures[event.fence] = (grant, event)
            continue
        if event.action in ENDINGS:
            if event.fence in open_tenures:
                grant, last = open_tenures.pop(event.fence)
                result.append(tenure(grant, last, event, sessions=sessions))
            else:
                result.append(tenure(None, event, event))
            continue
        if event.action not in GRANTS:
            continue
        for fence, (grant, last) in list(open_tenures.items()):
            if ends(grant or last, last, event):
                del open_tenures[fence]
                result.append(tenure(grant, last, event, sessions=sessions))
        open_tenures[event.fence] = (event, event)
    for grant, last in open_tenures.values():
        result.append(tenure(grant, last, None, now, sessions))
    return sorted(result, key=lambda t: (t.held_from, t.fence or 0))
