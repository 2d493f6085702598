"""Checks a recorded history against the audit log: the properties of a lock.

Inputs: the workers' records (see ``worker``), every row of ``lock_events``, and
the outage probe. Timestamps are the database's clock throughout: the service's
``acquired_at``/``expires_at`` and the events' ``occurred_at``.

Unknown outcomes (Jepsen's "info" operations): a request whose reply never came
may or may not have been applied. The checker never guesses:

- an event caused by an unknown request (its owner names the attempt) is allowed
  and counted as "indeterminate, took effect", never as invented;
- a worker never believes it holds a lock from an unknown acquire, so an
  indeterminate grant adds no believed interval (it cannot create an overlap in
  what workers believed; the database-side replay below still checks it);
- an unknown renew leaves the believed expiry where the last answered renew put
  it: the real expiry can only be later, so a take-over can only come later.

Session-bound grants have no expiry of their own: a worker believes one valid
until the last session expiry a heartbeat (or its grant) answered, and over
once its session's end answered. A heartbeat writes no lock event, so none is
demanded, and the audit log's grant events carry a bound grant's expiry as it
stood at its grant: the replays below extend it to the latest expiry any
answered heartbeat of its session reported (a lower bound of the real one;
an unknown heartbeat may have moved it further, so a take-over can only come
later). A session's end releases its grants (an event each), or, when the
session had expired, ends those still bound as of its expiry; a grant taken
over meanwhile is ended by that grant instead.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.faults.stall import stalled

GRANT_ACTIONS = {"acquired", "took_over", "claimed", "force_claimed"}
EXCLUSIVE, SHARED = "exclusive", "shared"

# A waiting acquire answers by its wait plus this (its last decision, leaving the
# line, a loaded machine), still under the client's timeout of 5 s + wait: a
# request that stayed in line past its wait shows up here or as an unknown
# outcome. A database that is down or changing its primary holds a waiter longer:
# see ``answer_due``.
WAIT_SLACK = 4.5

# Strict synchronous mode: a promoted primary commits only once a standby follows
# it, so recovery includes that re-attachment, not just the promotion.
FAILOVER_RECOVERY = 20.0


def ts(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


@dataclass
class Grant:
    """One grant as a worker believed it."""

    resource: str
    owner: str
    fence: int
    acquired_at: datetime
    expires_at: datetime  # extended by every answered renewal
    released: bool = False
    end: datetime | None = None  # the release's occurred_at, when released
    limit: int = 1  # a semaphore's holders above 1
    mode: str = EXCLUSIVE
    session: str | None = None  # the session it is bound to
    session_ended: bool = False  # its session's end answered 204
    taken_over: bool = False  # its session ran out and another grant took it

    @property
    def label(self) -> str:
        return f"{self.owner} (fence {self.fence})"

    @property
    def kind(self) -> str:
        """exclusive, shared, or holder (of a semaphore)."""
        return "semaphore" if self.limit > 1 else self.mode

    @property
    def until(self) -> datetime:
        return self.end if self.end is not None else self.expires_at


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def violation(self, message: str) -> None:
        self.violations.append(message)

    @property
    def ok(self) -> bool:
        return not self.violations


def check(
    records: list[dict[str, Any]],
    events: list[dict[str, Any]],
    outage: dict[str, Any] | None = None,
    *,
    max_recovery: float = 5.0,
    failovers: list[dict[str, Any]] = (),
    failover_recovery: float = FAILOVER_RECOVERY,
    limits: dict[str, int] | None = None,
    stalls: list[tuple[float, float]] = (),
) -> Report:
    """``limits``: the semaphores among the resources, by name, with their
    limits (the others allow one holder, or shared ones). ``max_recovery``:
    seconds within which every instance serves again after a database restart;
    ``failovers`` and ``failover_recovery``: the primary changes of a failover
    run and its recovery bound (see ``check_failovers``).
    A waiter in line while the database was down or the primary changed is held
    to that bound instead of its wait (``answer_due``).
    ``stalls``: when the machine itself kept a ready process from running (wall
    clock intervals, ``tests.faults.stall``); a waiter's answer and an
    instance's recovery are each given the stall inside their own interval."""
    report = Report()
    grants = _believed_grants(records, report)
    events = sorted(events, key=lambda e: e["id"])
    _match_events(records, grants, events, report)
    _check_believed_intervals(grants, report)
    heartbeats = session_expiries(records)
    _replay_audit_log(events, report, limits, heartbeats)
    for violation in grant_order_violations(events, limits, heartbeats):
        report.violation(violation)
    windows = held_windows(outage, max_recovery, failovers, failover_recovery)
    _check_responses(records, report, windows, stalls)
    if outage is not None:
        _check_outage(outage, report, max_recovery, stalls)
    report.stats.update(_stall_stats(stalls))
    report.stats.update(_stats(records, events))
    report.stats.update(_grant_stats(grants.values()))
    return report


# -- what workers believed ------------------------------------------------------


@dataclass
class SessionBelief:
    """What a worker knew of its session: the latest expiry an answer gave
    (its start, a bound grant, a heartbeat), and whether a heartbeat sent
    since may have moved it further (its reply lost)."""

    expires_at: datetime
    uncertain: bool = False


def _believed_grants(records, report) -> dict[tuple[str, str], Grant]:
    grants: dict[tuple[str, str], Grant] = {}
    sessions: dict[str, SessionBelief] = {}
    bound: dict[str, list[Grant]] = defaultdict(list)
    for record in records:
        kind = record["kind"]
        key = (record.get("resource"), record.get("owner"))
        if kind == "grant":
            if key in grants:
                report.violation(f"owner {key[1]} was granted {key[0]} twice")
            grant = grants[key] = Grant(
                record["resource"],
                record["owner"],
                int(record["fence"]),
                ts(record["acquired_at"]),
                ts(record["expires_at"]),
                limit=int(record.get("limit") or 1),
                mode=record.get("mode") or EXCLUSIVE,
                session=record.get("session"),
            )
            if grant.session is not None:
                bound[grant.session].append(grant)
                belief = sessions.get(grant.session)
                if belief is not None:
                    belief.expires_at = max(belief.expires_at, grant.expires_at)
        elif kind in ("session", "heartbeat", "session_ended") or (
            kind == "unknown" and record.get("session") is not None
        ):
            _believe_session(record, sessions, bound[record["session"]], report)
        elif kind == "renewed":
            grant = grants.get(key)
            if grant is None:
                report.violation(f"renewal of {key} without a grant")
                continue
            if int(record["fence"]) != grant.fence:
                report.violation(
                    f"renewal of {key} changed fence {grant.fence} -> {record['fence']}"
                )
            grant.expires_at = max(grant.expires_at, ts(record["expires_at"]))
        elif kind == "released" and key in grants:
            grants[key].released = True
    return grants


def _believe_session(record, sessions, grants: list[Grant], report) -> None:
    """One record of a session: its start, an answered heartbeat (which moves
    every grant bound to it, and may not revive it once it expired), an
    unknown heartbeat, or its end."""
    session, kind = record["session"], record["kind"]
    if kind == "session":
        sessions[session] = SessionBelief(ts(record["expires_at"]))
        return
    belief = sessions.get(session)
    if belief is None:
        report.violation(f"{kind} of session {session} that never started")
        return
    if kind == "unknown":
        if record["op"] == "heartbeat":
            belief.uncertain = True
        return
    if kind == "session_ended":
        for grant in grants:
            grant.session_ended = True
        return
    expires_at, beat = ts(record["expires_at"]), ts(record["last_heartbeat"])
    if beat >= belief.expires_at and not belief.uncertain:
        report.violation(
            f"session {session} of {record['owner']}: a heartbeat at "
            f"{beat.isoformat()} renewed it after it expired at "
            f"{belief.expires_at.isoformat()}"
        )
    belief.expires_at, belief.uncertain = expires_at, False
    for grant in grants:
        grant.expires_at = max(grant.expires_at, expires_at)


def session_expiries(records) -> dict[str, datetime]:
    """Per session, the latest expiry an answered heartbeat reported: every
    grant still bound to it then ran at least that long."""
    found: dict[str, datetime] = {}
    for record in records:
        if record["kind"] == "heartbeat":
            expires_at = ts(record["expires_at"])
            found[record["session"]] = max(
                found.get(record["session"], expires_at), expires_at
            )
    return found


def blockers(mode: str, limit: int, live: list) -> list:
    """Of ``live`` (grants valid at an instant, each with ``mode`` and
    ``limit``), those a new grant of ``mode`` and ``limit`` may not come beside:
    an exclusive grant of limit 1 stands alone; a shared grant only beside
    shared ones; a semaphore holder beside fewer than ``limit`` holders of that
    semaphore and nothing else."""
    if mode == SHARED:
        return [g for g in live if g.mode != SHARED]
    if limit == 1:
        return list(live)
    foreign = [g for g in live if g.mode == SHARED or g.limit != limit]
    if foreign:
        return foreign
    return list(live) if len(live) >= limit else []


def _check_believed_intervals(grants, report) -> None:
    """Per resource: at no instant more believed holders than the rules allow
    (``blockers``: one exclusive holder, or shared ones, or up to a semaphore's
    limit); fences increase in grant order."""
    by_resource: dict[str, list[Grant]] = defaultdict(list)
    for grant in grants.values():
        by_resource[grant.resource].append(grant)
    most = report.stats.setdefault("most_believed_at_once", {})
    for resource, held in by_resource.items():
        held.sort(key=lambda g: (g.acquired_at, g.fence))
        # The grants so far believed valid after the latest grant's start.
        open_: list[Grant] = []
        for before, grant in zip([None, *held], held, strict=False):
            open_ = [g for g in open_ if g.until > grant.acquired_at]
            blocking = blockers(grant.mode, grant.limit, open_)
            if blocking:
                longest = max(blocking, key=lambda g: g.until)
                kind = "" if grant.limit == 1 else f" (place of {grant.limit})"
                report.violation(
                    f"{resource}: {grant.label} granted {grant.mode}{kind} at "
                    f"{grant.acquired_at.isoformat()} while "
                    f"{', '.join(g.label for g in blocking)} held it, "
                    f"{longest.owner} (fence {longest.fence}) until "
                    f"{longest.until.isoformat()}"
                )
            if before is not None and grant.fence <= before.fence:
                report.violation(
                    f"{resource}: fence {grant.fence} of {grant.owner} does not "
                    f"exceed fence {before.fence} granted before it"
                )
            open_.append(grant)
            most[resource] = max(most.get(resource, 0), len(open_))


# -- the audit log against the history -------------------------------------------


def _match_events(records, grants, events, report) -> None:
    unknown_owners = {
        (r["resource"], r["owner"]) for r in records if r["kind"] == "unknown"
    }
    grant_events: dict[tuple[str, str], list[dict]] = defaultdict(list)
    grant_events_of: dict[str, list[dict]] = defaultdict(list)  # by resource
    by_fence: dict[int, list[dict]] = defaultdict(list)
    released: dict[tuple[str, int], dict] = {}
    renewals: set[tuple[str, int, datetime]] = set()
    reacquired: set[tuple[str, str, int, datetime]] = set()
    for event in events:
        key = (event["resource"], event["owner"])
        if event["action"] == "reacquired":
            reacquired.add((*key, event["fence"], ts(event["acquired_at"])))
        if event["action"] in GRANT_ACTIONS:
            grant_events[key].append(event)
            grant_events_of[event["resource"]].append(event)
            by_fence[event["fence"]].append(event)
        elif event["action"] == "released":
            released[(event["resource"], event["fence"])] = event
        elif event["action"] == "renewed":
            renewals.add((event["resource"], event["fence"], ts(event["expires_at"])))

    for fence, found in by_fence.items():
        if len(found) > 1:
            report.violation(f"fence {fence} was granted {len(found)} times: {found}")

    # Every believed grant: exactly one grant event, the same one.
    for key, grant in grants.items():
        found = grant_events.get(key, [])
        if len(found) != 1:
            report.violation(f"grant {key} fence {grant.fence}: {len(found)} events")
            continue
        event = found[0]
        if (
            event["fence"] == grant.fence
            and (*key, grant.fence, grant.acquired_at) in reacquired
        ):
            # The answer of the service's retry: the first try's COMMIT went
            # through and its answer was lost with its connection (a proxy
            # cutting it at a failover), and the retry found the grant made
            # and re-acquired it, answering the retry's time. Held since the
            # grant itself.
            grant.acquired_at = ts(event["acquired_at"])
        if (event["fence"], ts(event["acquired_at"])) != (
            grant.fence,
            grant.acquired_at,
        ):
            report.violation(f"grant {key} does not match its event {event}")
        release = released.get((grant.resource, grant.fence))
        if grant.released and release is None:
            report.violation(f"release of {key} answered 204 but left no event")
        if release is not None:
            grant.end = ts(release["occurred_at"])
        elif grant.session is not None:
            _check_session_grant_ended(grant, event, grant_events_of, report)
    for record in records:
        if record["kind"] == "renewed":
            renewal = (
                record["resource"],
                int(record["fence"]),
                ts(record["expires_at"]),
            )
            if renewal not in renewals:
                report.violation(f"renewal {renewal} answered 200 but left no event")

    # Every grant event: a believed grant, or an attempt whose outcome was unknown.
    indeterminate = 0
    for key, found in grant_events.items():
        if key in grants:
            continue
        if key in unknown_owners:
            indeterminate += len(found)
            continue
        for event in found:
            report.violation(f"event {event['id']} grants {key} that nobody asked for")
    report.stats["indeterminate_grants_applied"] = indeterminate


def _check_session_grant_ended(grant, event, grant_events_of, report) -> None:
    """A session-bound grant without a release event: it is over once its
    session ran out, and the grant that then took it (or, for a holder, the
    grant that cleared it away) is what ends it, at or after the last expiry
    its worker knew. Its session's answered end demands that ending."""
    taken = next(
        (
            later
            for later in grant_events_of[grant.resource]
            if later["id"] > event["id"]
            and ts(later["acquired_at"]) >= grant.expires_at
        ),
        None,
    )
    if taken is not None:
        grant.taken_over = True
    elif grant.session_ended:
        report.violation(
            f"{grant.resource}: {grant.label} of session {grant.session} has no "
            "end in the audit log, though its session's end answered 204"
        )


@dataclass
class Held:
    """A grant as the audit log tells it, while replaying it."""

    owner: str
    fence: int
    mode: str
    limit: int
    end: datetime  # its expiry, or its release's occurred_at once released
    ended_by: str = "expiry"
    session: str | None = None  # bound to it: ``end`` moved by its heartbeats

    @property
    def label(self) -> str:
        return f"{self.owner} (fence {self.fence})"


def _mode(event) -> str:
    return event.get("mode") or EXCLUSIVE


def _session(event) -> str | None:
    """The session an event's grant is bound to (its ``details`` name it)."""
    details = event.get("details")
    if not details:
        return None
    found = json.loads(details) if isinstance(details, str) else details
    return found.get("session") if isinstance(found, dict) else None


def _expiry(event, heartbeats) -> datetime:
    """The grant event's expiry, or for a session-bound grant the latest its
    session's answered heartbeats moved it to (``session_expiries``)."""
    expires_at = ts(event["expires_at"])
    session = _session(event)
    if session is not None and session in heartbeats:
        return max(expires_at, heartbeats[session])
    return expires_at


def _replaced_by(grant: Held, event) -> bool:
    """Whether the grant ``event`` makes is ``grant``'s holder asking again:
    a re-acquire (a demotion to shared included), or a promotion of its shared
    grant to an exclusive one, which ends it."""
    if grant.owner != event["owner"]:
        return False
    if event["action"] == "reacquired":
        return True
    return grant.mode == SHARED and _mode(event) == EXCLUSIVE


def _replay_audit_log(events, report, limits=None, heartbeats=None) -> None:
    """The database's own story, independent of what workers believed: replaying
    the events per resource, no grant may come beside the grants validly held
    then unless the rules allow it (``blockers``; ``limits``: the semaphores'
    limits by resource, 1 for the others), and every new grant's fence exceeds
    every earlier one. ``heartbeats``: ``session_expiries``.

    A session-bound grant left behind as run out may still be released by its
    session's end, later in the log (``lapsed``): one a shared grant or a
    holder came beside at any time (a heartbeat whose reply was lost may have
    moved it further than ``heartbeats`` know), one an exclusive grant
    followed only as of an instant up to that grant (an expired session's end
    records its grants' end at its expiry; the exclusive path leaves an
    expired holder's row behind)."""
    limits = limits or {}
    heartbeats = heartbeats or {}
    held: dict[str, dict[int, Held]] = defaultdict(dict)
    # resource -> fence -> the latest end its release may record (None: any)
    lapsed: dict[str, dict[int, datetime | None]] = defaultdict(dict)
    highest: dict[str, int] = defaultdict(int)
    for event in events:
        resource, action = event["resource"], event["action"]
        grants = held[resource]
        if action in GRANT_ACTIONS or action == "reacquired":
            at = ts(event["acquired_at"])
            live = [
                g for g in grants.values() if g.end > at and not _replaced_by(g, event)
            ]
            limit = limits.get(resource, 1)
            blocking = blockers(_mode(event), limit, live)
            if blocking and action != "force_claimed":
                first = blocking[0]
                report.violation(
                    f"event {event['id']}: {resource} {action} by {event['owner']} at "
                    f"{at.isoformat()} while {first.owner} held it until "
                    f"{first.end.isoformat()}"
                )
            if action == "reacquired":
                mine = grants.get(event["fence"])
                if mine is None or mine.owner != event["owner"]:
                    report.violation(f"event {event['id']}: reacquire changed fence")
            elif event["fence"] <= highest[resource]:
                report.violation(
                    f"event {event['id']}: fence {event['fence']} on {resource} "
                    f"after fence {highest[resource]}"
                )
            highest[resource] = max(highest[resource], event["fence"])
            gone = [g for g in grants.values() if g.session and g not in live]
            if action == "force_claimed" or (_mode(event) == EXCLUSIVE and limit == 1):
                live = []  # an exclusive grant ends all others (a claim, too)
                lapsed[resource] = {
                    fence: min(at, until or at)
                    for fence, until in lapsed[resource].items()
                }
                lapsed[resource].update((g.fence, at) for g in gone)
            else:
                lapsed[resource].update((g.fence, None) for g in gone)
            held[resource] = {g.fence: g for g in live}
            held[resource][event["fence"]] = Held(
                event["owner"],
                event["fence"],
                _mode(event),
                limit,
                _expiry(event, heartbeats),
                session=_session(event),
            )
        elif action == "renewed":
            grant = grants.get(event["fence"])
            if grant is None or grant.owner != event["owner"]:
                report.violation(f"event {event['id']}: renewal by a non-holder")
            elif grant.end <= ts(event["occurred_at"]):
                report.violation(f"event {event['id']}: renewal of an expired lock")
            else:
                grant.end = ts(event["expires_at"])
        elif action in ("released", "force_released"):
            ended = ts(event["occurred_at"])
            if event["fence"] in lapsed[resource]:
                until = lapsed[resource].pop(event["fence"])
                if until is not None and ended > until:
                    report.violation(
                        f"event {event['id']}: {resource} fence {event['fence']} "
                        f"released at {ended.isoformat()}, after an exclusive "
                        f"grant at {until.isoformat()} followed it"
                    )
            elif event["fence"] not in grants:
                report.violation(f"event {event['id']}: release of a lock not held")
            grants.pop(event["fence"], None)


def grant_order_violations(events, limits=None, heartbeats=None) -> list[str]:
    """The audit log ordered like the grants themselves: no grant's recorded
    ``acquired_at`` may precede the recorded end of a grant before it on the
    same resource that it may not come beside (``blockers``: for an exclusive
    lock, the grant before it): its release or force-release ``occurred_at``,
    or, when it ran out, its last ``expires_at``; a claim that takes it ends it
    there. Exact comparison, no tolerance: every timestamp is the database's
    own clock. ``limits``: the semaphores' limits by resource, 1 for the others.

    ``events``: every event of the resources concerned, in id order (a resource's
    events are written under its row lock, so their ids follow the changes).
    ``heartbeats``: ``session_expiries``, which a session-bound grant ran to.
    """
    limits = limits or {}
    heartbeats = heartbeats or {}
    violations: list[str] = []
    # resource -> fence -> the grant with what ended it (so far) and when
    previous: dict[str, dict[int, Held]] = defaultdict(dict)
    for event in sorted(events, key=lambda e: e["id"]):
        resource, action = event["resource"], event["action"]
        grants = previous[resource]
        limit = limits.get(resource, 1)
        if action in GRANT_ACTIONS:
            at = ts(event["acquired_at"])
            # A force-claim, or a claim for the holder itself, ends a valid grant.
            ends_it = action == "force_claimed" or (
                action == "claimed" and event["previous_owner"] == event["owner"]
            )
            later = [
                g for g in grants.values() if g.end > at and not _replaced_by(g, event)
            ]
            blocking = [] if ends_it else blockers(_mode(event), limit, later)
            if blocking:
                ended = max(blocking, key=lambda g: g.end)
                violations.append(
                    f"event {event['id']}: {resource} {action} (fence "
                    f"{event['fence']}) recorded at {at.isoformat()}, before the "
                    f"{ended.ended_by} of fence {ended.fence} at "
                    f"{ended.end.isoformat()}"
                )
            if ends_it or (_mode(event) == EXCLUSIVE and limit == 1):
                grants.clear()
            else:
                for fence in [f for f, g in grants.items() if g.end <= at]:
                    del grants[fence]
        if action in GRANT_ACTIONS or action in ("reacquired", "renewed"):
            grant = grants.get(event["fence"])
            if grant is None:
                grant = grants[event["fence"]] = Held(
                    event["owner"], event["fence"], _mode(event), limit, at_min()
                )
            grant.mode = _mode(event)
            grant.end, grant.ended_by = _expiry(event, heartbeats), "expiry"
        elif action in ("released", "force_released") and event["fence"] in grants:
            grant = grants[event["fence"]]
            grant.end, grant.ended_by = ts(event["occurred_at"]), action
    return violations


def at_min() -> datetime:
    return datetime.min.replace(tzinfo=UTC)


# -- responses and the outage ----------------------------------------------------


def held_windows(
    outage: dict[str, Any] | None = None,
    max_recovery: float = 5.0,
    failovers: list[dict[str, Any]] = (),
    failover_recovery: float = FAILOVER_RECOVERY,
) -> list[tuple[float, float]]:
    """When the database could hold a statement (wall clock): from each crash
    until the recovery bound after it came back (``restarts`` of the outage,
    ``max_recovery``), and from each primary's kill until ``failover_recovery``
    after the promotion (strict synchronous mode holds a commit until the new
    primary has a standby)."""
    windows = [
        (restart["down_at"], restart["up_at"] + max_recovery)
        for restart in (outage or {}).get("restarts", [])
        if "up_at" in restart  # never back: the run fails on its own
    ]
    windows += [
        (failover["killed_at"], failover["promoted_at"] + failover_recovery)
        for failover in failovers
    ]
    return windows


def answer_due(
    record: dict[str, Any], windows: list[tuple[float, float]] = ()
) -> float:
    """Seconds after it was sent by which a waiting acquire must have answered:
    its wait plus ``WAIT_SLACK``, or, for a waiter in line during one of the
    ``held_windows``, ``WAIT_SLACK`` after that window closes if that is later."""
    due = record["wait"] + WAIT_SLACK
    if "t" not in record:
        return due
    sent = record["t"] - record["elapsed"]
    for start, end in windows:
        if start <= sent + due and sent <= end:
            due = max(due, end + WAIT_SLACK - sent)
    return due


def stall_note(credit: float) -> str:
    return f" + {credit:.3f} s the machine stalled" if credit else ""


def _check_responses(records, report, windows=(), stalls=()) -> None:
    credited = report.stats.setdefault("waits_past_due_in_stalls", [])
    for record in records:
        if record["kind"] == "waited":
            due = answer_due(record, windows)
            credit = 0.0
            if "t" in record and record["elapsed"] > due:
                credit = stalled(stalls, record["t"] - record["elapsed"], record["t"])
            if record["elapsed"] > due + credit:
                report.violation(
                    f"{record['owner']} waited {record['elapsed']} s for "
                    f"{record['resource']} with wait={record['wait']} "
                    f"({record['outcome']}; due within {due:.1f} s"
                    f"{stall_note(credit)})"
                )
            elif record["elapsed"] > due:
                credited.append(
                    f"{record['owner']}: {record['elapsed']} s, due {due:.1f} s"
                    f"{stall_note(credit)}"
                )
        if record["kind"] == "error":
            report.violation(
                f"{record['op']} {record['resource']} by {record['owner']}: "
                f"HTTP {record.get('status')} {record.get('error')}"
            )
        elif record["kind"] == "unknown" and (record.get("status") or 0) == 500:
            report.violation(f"a 500 answered {record}")


def _check_outage(outage, report, max_recovery, stalls=()) -> None:
    probes = outage.get("probes", [])
    if not probes:
        report.violation("the database outage was never probed")
    for probe in probes:
        if probe["status"] != 503:
            report.violation(f"during the outage {probe['url']} answered {probe}")
        elif probe["content_type"] != "application/problem+json":
            report.violation(f"the outage 503 of {probe['url']} is not problem+json")
    restarts = outage.get("restarts", [])
    credited = report.stats.setdefault("recoveries_past_limit_in_stalls", [])
    for name, seconds in outage.get("recovery", {}).items():
        # "app0#2": app0 after the second restart, timed from its up_at.
        number = name.rpartition("#")[2]
        credit = 0.0
        if seconds is not None and seconds > max_recovery and number.isdigit():
            up_at = restarts[int(number) - 1].get("up_at")
            if up_at is not None:
                credit = stalled(stalls, up_at, up_at + seconds)
        if seconds is None or seconds > max_recovery + credit:
            report.violation(
                f"{name} took {seconds} s to serve again after the database came "
                f"back (limit {max_recovery} s{stall_note(credit)})"
            )
        elif seconds > max_recovery:
            credited.append(f"{name}: {seconds} s{stall_note(credit)}")


def _stall_stats(stalls) -> dict[str, Any]:
    """How long the machine kept the canary from running: in all, and at once."""
    lengths = [end - start for start, end in stalls]
    return {
        "machine_stalls": len(lengths),
        "machine_stall_s": round(sum(lengths), 3),
        "machine_worst_stall_s": round(max(lengths, default=0.0), 3),
    }


def _grant_stats(grants) -> dict[str, Any]:
    """The believed grants by kind, and those bound to a session: by kind, and
    how they ended (released with their session, or run out and taken)."""
    by_kind: dict[str, int] = defaultdict(int)
    bound: dict[str, int] = defaultdict(int)
    for grant in grants:
        by_kind[grant.kind] += 1
        if grant.session is not None:
            bound[grant.kind] += 1
    bound_grants = [g for g in grants if g.session is not None]
    return {
        "grants_by_kind": dict(by_kind),
        "session_grants": len(bound_grants),
        "session_grants_by_kind": dict(bound),
        "session_grants_released": sum(1 for g in bound_grants if g.end is not None),
        "session_grants_taken_over": sum(1 for g in bound_grants if g.taken_over),
    }


def _stats(records, events) -> dict[str, Any]:
    kinds: dict[str, int] = defaultdict(int)
    operations = 0
    for record in records:
        kinds[record["kind"]] += 1
        if record["kind"] == "summary":
            operations += sum(
                n for op, n in record["counts"].items() if not op.startswith("pause")
            )
    actions: dict[str, int] = defaultdict(int)
    modes: dict[str, int] = defaultdict(int)
    for event in events:
        actions[event["action"]] += 1
        if event["action"] in GRANT_ACTIONS:
            modes[_mode(event)] += 1
    return {
        "operations": operations,
        "grants_believed": kinds["grant"],
        "renewals": kinds["renewed"],
        "releases": kinds["released"],
        "losses_learned": kinds["lost"],
        "unknown_outcomes": kinds["unknown"],
        "events": len(events),
        "events_by_action": dict(actions),
        "events_by_mode": dict(modes),
        "take_overs": actions["took_over"],
        "waits": kinds["waited"],
        "waits_granted": sum(
            1
            for r in records
            if r["kind"] == "waited" and r.get("outcome") == "granted"
        ),
        "sessions": kinds["session"],
        "heartbeats": kinds["heartbeat"],
        "sessions_lost": kinds["session_lost"],
        "sessions_ended": kinds["session_ended"],
    }


# -- across a primary failover (Patroni) -------------------------------------------


def check_failovers(
    records: list[dict[str, Any]],
    events: list[dict[str, Any]],
    final_locks: list[dict[str, Any]],
    failovers: list[dict[str, Any]],
    report: Report,
    *,
    max_recovery: float = FAILOVER_RECOVERY,
    stalls: list[tuple[float, float]] = (),
) -> None:
    """What a promotion must not change, judged against the final database.

    ``failovers``: one entry per primary change, with ``kind`` ("failover" for a
    killed primary, "switchover"), ``killed_at``/``promoted_at`` (wall clock),
    ``old``/``new`` member, the ``probes`` answered in between and ``recovery``
    (seconds from the promotion until each instance served again).

    - every grant, renewal and release acknowledged before a promotion is still in
      the final audit log, and an acknowledged release never comes back as held;
    - no grant acknowledged after a promotion reuses a fence (a fence sequence
      replayed from a standby that was behind would);
    - while no primary was reachable every answer was a 503 problem, never a 500;
    - every instance served again within ``max_recovery`` of the promotion
      (plus the time the machine stalled meanwhile: ``stalls``, as in ``check``).
    """
    grant_events = {
        (e["resource"], e["owner"], e["fence"])
        for e in events
        if e["action"] in GRANT_ACTIONS
    }
    release_events = {
        (e["resource"], e["fence"]) for e in events if e["action"] == "released"
    }
    renewal_events = {
        (e["resource"], e["fence"], ts(e["expires_at"]))
        for e in events
        if e["action"] == "renewed"
    }
    acknowledged = [r for r in records if r["kind"] in ("grant", "renewed", "released")]
    for number, failover in enumerate(failovers, 1):
        name = f"{failover['kind']} #{number} ({failover['old']} -> {failover['new']})"
        if failover["new"] is None or failover["new"] == failover["old"]:
            report.violation(f"{name}: no other member was promoted")
            continue
        before = [r for r in acknowledged if r["t"] < failover["killed_at"]]
        for record in before:
            resource, fence = record["resource"], int(record["fence"])
            if record["kind"] == "grant":
                lost = (resource, record["owner"], fence) not in grant_events
            elif record["kind"] == "released":
                lost = (resource, fence) not in release_events
            else:
                lost = (resource, fence, ts(record["expires_at"])) not in renewal_events
            if lost:
                report.violation(
                    f"{name}: acknowledged {record['kind']} of {resource} by "
                    f"{record['owner']} (fence {fence}) is not in the final database"
                )
        highest_before = max(
            (int(r["fence"]) for r in before if r["kind"] == "grant"), default=0
        )
        for record in acknowledged:
            if (
                record["kind"] == "grant"
                and record["t"] > failover["promoted_at"]
                and int(record["fence"]) <= highest_before
            ):
                report.violation(
                    f"{name}: fence {record['fence']} granted to {record['owner']} "
                    f"after the promotion, but fence {highest_before} had been "
                    "acknowledged before it (the sequence went back)"
                )
        _check_failover_probes(name, failover, report)
        for instance, seconds in failover.get("recovery", {}).items():
            credit = 0.0
            if seconds is not None and seconds > max_recovery:
                promoted = failover["promoted_at"]
                credit = stalled(stalls, promoted, promoted + seconds)
            if seconds is None or seconds > max_recovery + credit:
                report.violation(
                    f"{name}: {instance} took {seconds} s after the promotion to "
                    f"serve again (limit {max_recovery} s{stall_note(credit)})"
                )
    _check_releases_stay_released(records, final_locks, report)


def _check_failover_probes(name, failover, report) -> None:
    for probe in failover.get("probes", []):
        status = probe["status"]
        if status is None:  # the instance killed with the primary: no answer
            continue
        if status == 503:
            if probe["content_type"] != "application/problem+json":
                report.violation(f"{name}: a 503 of {probe['url']} is no problem+json")
        elif status not in (200, 204, 409):
            report.violation(f"{name}: {probe['method']} {probe['url']} -> {probe}")


def _check_releases_stay_released(records, final_locks, report) -> None:
    """An acknowledged release must not come back as held in the final rows, and
    a lock still held by a grant whose renewal was acknowledged keeps that expiry."""
    released = {
        (r["resource"], int(r["fence"])) for r in records if r["kind"] == "released"
    }
    renewed: dict[tuple[str, int], datetime] = {}
    for record in records:
        if record["kind"] == "renewed":
            key = (record["resource"], int(record["fence"]))
            renewed[key] = max(
                renewed.get(key, ts(record["expires_at"])), ts(record["expires_at"])
            )
    for row in final_locks:
        if row["owner"] is None:
            continue
        key = (row["resource"], int(row["fence"]))
        if key in released:
            report.violation(
                f"{row['resource']}: released fence {row['fence']} is held again by "
                f"{row['owner']} in the final database"
            )
        if key in renewed and ts(row["expires_at"]) < renewed[key]:
            report.violation(
                f"{row['resource']}: fence {row['fence']} expires at "
                f"{ts(row['expires_at']).isoformat()}, before its acknowledged "
                f"renewal to {renewed[key].isoformat()}"
            )
