"""Prometheus metrics, in two scrape targets.

``/metrics``: what this instance did. Counters and histograms (HTTP requests, lock
operations by outcome, hold times and lost locks by prefix family, waits) live on
a registry per app; under several gunicorn workers ``PROMETHEUS_MULTIPROC_DIR``
must be set before ``prometheus_client`` is first imported
(``app.ops.gunicorn_conf`` does it), each worker writes its values to files there
and ``/metrics`` adds up every worker's files, whichever worker answers. Scrape
every instance; ``sum()`` over instances is the fleet's.

``/metrics/fleet``: what the database holds (locks by state, waiters, sessions,
holders, shared grants, its schema revision), counted at scrape time. Every
instance answers it with the same numbers, so it is scraped once per fleet (one
target: the load balancer's address, or any one instance), not per instance:
summed over instances these gauges counted each lock once per instance. A
separate target rather than one instance elected to export them: the service
has no leader of its own to elect, a target behind the load balancer survives
the loss of any instance, and it needs no coordination. Each gauge reads 0
rather than vanishing (no stale locks is a 0 on the graph; during a database
outage the counts read 0 and ``lockkeeper_database_up`` reads 0, which is what
the alerts look at).

Label values are bounded: a route template, an outcome from a fixed list, and a
prefix family from ``LOCKKEEPER_METRICS_PREFIXES`` (at most
``app.config.MAX_PREFIX_FAMILIES``; every other resource is ``other``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from flask import Flask, current_app
from lockkeeper_core.errors import LockError
from lockkeeper_core.instrumentation import NoMetrics
from lockkeeper_core.state import Action, LockState
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from app.config import OTHER_FAMILY, prefix_families

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED_ROUTE = "<unmatched>"
WAIT_OUTCOMES = ("granted", "timeout", "gone")
WAIT_REFUSALS = ("worker_full", "token_share")
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HANDOVER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# From a sub-second critical section to a day-long job.
HOLD_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
# A renewal that finds its lock gone: it ran out (expired), or another holder has
# it since (taken_over).
LOST_HOW = {"expired": "expired", "not_owner": "taken_over"}

# Outcomes of a renewal or release. "expired" and "not_owner" are late calls from a
# worker that lost its lock (it ran out, or another owner took it over): the signal
# that a worker's ttl is too short for its work.
RENEWAL_OUTCOMES = ("renewed", "expired", "not_owner", "not_found", "session_bound")
RELEASE_OUTCOMES = ("released", "expired", "not_owner", "not_found")
SESSION_OUTCOMES = (
    "created",
    "refused_quota",
    "heartbeat",
    "heartbeat_expired",
    "heartbeat_unknown",
    "ended",
)
ACQUIRE_GRANTS = (Action.ACQUIRED, Action.REACQUIRED, Action.TOOK_OVER)
OPERATOR_ACTIONS = (Action.FORCE_RELEASED, Action.CLAIMED, Action.FORCE_CLAIMED)


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class PrefixFamilies:
    """A resource's family: the longest configured prefix it starts with."""

    def __init__(self, prefixes: tuple[str, ...]):
        # Longest first, so "job:billing:" wins over "job:".
        self.prefixes = tuple(sorted(prefixes, key=len, reverse=True))
        self.names = (*prefixes, OTHER_FAMILY)

    def of(self, resource: str) -> str:
        for prefix in self.prefixes:
            if resource.startswith(prefix):
                return prefix
        return OTHER_FAMILY


class LockMetrics(NoMetrics):
    """The service's counters, with every label child bound up front.

    The hot path is a dict lookup and an ``inc()``; an unknown outcome is a
    programming error and raises ``KeyError``.
    """

    def __init__(
        self, registry: CollectorRegistry, families: PrefixFamilies | None = None
    ):
        self.families = families or PrefixFamilies(())
        acquisitions = Counter(
            "lockkeeper_acquisitions",
            "Acquire calls by outcome: acquired, reacquired, took_over, or held "
            "(refused: another owner holds it).",
            ["outcome"],
            registry=registry,
        )
        renewals = Counter(
            "lockkeeper_renewals",
            "Renew calls by outcome; expired and not_owner are late renewals of a "
            "lost lock.",
            ["outcome"],
            registry=registry,
        )
        releases = Counter(
            "lockkeeper_releases",
            "Release calls by outcome; expired and not_owner are late releases of "
            "a lost lock.",
            ["outcome"],
            registry=registry,
        )
        operator = Counter(
            "lockkeeper_operator_actions",
            "Force-releases and claims carried out by operators.",
            ["action"],
            registry=registry,
        )
        self._granted = {a: acquisitions.labels(a.value) for a in ACQUIRE_GRANTS}
        # Refused acquires per minute for the overview's chart
        # (``app.audit.refusals``), set once the app has its database.
        self.refusals = None
        self._refused = acquisitions.labels("held")
        self._renewals = {o: renewals.labels(o) for o in RENEWAL_OUTCOMES}
        self._releases = {o: releases.labels(o) for o in RELEASE_OUTCOMES}
        self._operator = {a: operator.labels(a.value) for a in OPERATOR_ACTIONS}
        self._waiting = Gauge(
            "lockkeeper_waiting_requests",
            "Acquires waiting in line in this server's workers right now.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        waited = Histogram(
            "lockkeeper_wait_seconds",
            "How long waiting acquires waited, by outcome: granted, timeout (the "
            "wait ran out), gone (the client hung up).",
            ["outcome"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self._waited = {o: waited.labels(o) for o in WAIT_OUTCOMES}
        refused = Counter(
            "lockkeeper_wait_refused",
            "Waiting acquires answered 503 for want of room, by reason: "
            "worker_full (LOCKKEEPER_MAX_WAITERS) or token_share "
            "(LOCKKEEPER_MAX_WAITERS_PER_TOKEN).",
            ["reason"],
            registry=registry,
        )
        self._wait_refused = {r: refused.labels(r) for r in WAIT_REFUSALS}
        sessions = Counter(
            "lockkeeper_sessions",
            "Session calls by outcome: created, refused_quota (the token's share, "
            "LOCKKEEPER_MAX_SESSIONS_PER_TOKEN), heartbeat (renewed the session and "
            "every grant bound to it), heartbeat_expired and heartbeat_unknown "
            "(refused), ended.",
            ["outcome"],
            registry=registry,
        )
        self._sessions = {o: sessions.labels(o) for o in SESSION_OUTCOMES}
        held = Histogram(
            "lockkeeper_hold_seconds",
            "How long released grants were held, from their grant to their "
            "release, by prefix family (LOCKKEEPER_METRICS_PREFIXES; the rest "
            "other).",
            ["family"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        lost = Counter(
            "lockkeeper_lost_locks",
            "Holders whose renewal found their lock lost, by prefix family and "
            "how: expired (it ran out) or taken_over (another holder has it).",
            ["family", "how"],
            registry=registry,
        )
        took_over = Counter(
            "lockkeeper_took_over",
            "Grants that took a lock whose holder had lapsed (a new fence), by "
            "prefix family: a leadership changing hands, or workers dying.",
            ["family"],
            registry=registry,
        )
        self._took_over = {f: took_over.labels(f) for f in self.families.names}
        # Every series exists from the start: a family with no loss reads 0.
        self._held = {f: held.labels(f) for f in self.families.names}
        self._lost = {
            (f, how): lost.labels(f, how)
            for f in self.families.names
            for how in LOST_HOW.values()
        }
        self._handover = Histogram(
            "lockkeeper_handover_seconds",
            "From the moment a waiter is woken (NOTIFY, its poll, or the holder's "
            "expiry) to its grant.",
            buckets=HANDOVER_BUCKETS,
            registry=registry,
        )

    def wait_started(self) -> None:
        self._waiting.inc()

    def wait_ended(self, outcome: str, seconds: float) -> None:
        self._waiting.dec()
        self._waited[outcome].observe(seconds)

    def wait_refused(self, reason: str) -> None:
        self._wait_refused[reason].inc()

    def handed_over(self, seconds: float) -> None:
        self._handover.observe(seconds)

    def acquired(self, action: Action, resource: str | None = None) -> None:
        self._granted[action].inc()
        if action is Action.TOOK_OVER and resource is not None:
            self._took_over[self.families.of(resource)].inc()

    def acquire_refused(self, outcome: str = "held") -> None:
        self._refused.inc()
        if self.refusals is not None:
            self.refusals.count(outcome)

    def renewal(self, outcome: str, resource: str | None = None) -> None:
        self._renewals[outcome].inc()
        how = LOST_HOW.get(outcome)
        if how is not None and resource is not None:
            self._lost[self.families.of(resource), how].inc()

    def release(
        self, outcome: str, resource: str | None = None, held_for: float | None = None
    ) -> None:
        self._releases[outcome].inc()
        if held_for is not None and resource is not None:
            self._held[self.families.of(resource)].observe(max(0.0, held_for))

    def operator_action(self, action: Action) -> None:
        self._operator[action].inc()

    def session(self, outcome: str) -> None:
        self._sessions[outcome].inc()


class FleetCollector(Collector):
    """The database's gauges (``/metrics/fleet``), counted at scrape time; 0,
    not absent, when a count is 0 or the database does not answer."""

    def __init__(self, app: Flask):
        self.app = app

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Describing must not query: registering the collector would hit the database.
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # The revision is read on its own: code newer than the database's schema
        # cannot count on it (its queries name columns not there yet), and the
        # revision is then what tells that apart from a database that is down.
        try:
            revision = self._revision()
        except SQLAlchemyError:
            revision = None
        try:
            service = self.app.extensions["lockkeeper.locks"]
            counts = service.counts()
            queued = service.queue.queued()
            live_sessions = service.sessions.live()
            holders = service.holders_counts()
        except (SQLAlchemyError, LockError):
            counts = queued = live_sessions = holders = None
        yield from self._families(counts, queued, live_sessions, holders, revision)

    def _revision(self) -> str:
        from lockkeeper_core.schema import database_revisions, shown_revisions

        from app.extensions import db

        with self.app.app_context(), db.engine.connect() as conn:
            return shown_revisions(database_revisions(conn))

    @staticmethod
    def _families(
        counts: dict[LockState, int] | None = None,
        queued: int | None = None,
        live_sessions: int | None = None,
        holders=None,
        revision: str | None = None,
    ):
        locks = GaugeMetricFamily(
            "lockkeeper_locks",
            "Locks by state (held, expiring, stale), one per resource, at scrape time.",
            labels=["state"],
        )
        for state in LockState:
            locks.add_metric([state.value], 0 if counts is None else counts[state])
        up = GaugeMetricFamily(
            "lockkeeper_database_up",
            "1 when the lock database answered the scrape's count, else 0 (the "
            "other gauges then read 0): not answering, or at a schema older than "
            "this instance's code (lockkeeper_database_schema_info names it).",
            value=0 if counts is None else 1,
        )
        schema = GaugeMetricFamily(
            "lockkeeper_database_schema_info",
            "1, labelled with the database's schema revision (none: empty or "
            "not answering).",
            labels=["revision"],
        )
        schema.add_metric([revision or "none"], 1)
        waiters = GaugeMetricFamily(
            "lockkeeper_queued_waiters",
            "Acquires waiting in line, every instance, counted at scrape time.",
        )
        waiters.add_metric([], queued or 0)
        sessions = GaugeMetricFamily(
            "lockkeeper_live_sessions",
            "Sessions not yet expired, every instance, counted at scrape time.",
        )
        sessions.add_metric([], live_sessions or 0)
        # The metrics keep the old name of holders, "places": dashboards query them.
        used = GaugeMetricFamily(
            "lockkeeper_places_used",
            "Live places of counting semaphores, every resource, at scrape time.",
        )
        limit = GaugeMetricFamily(
            "lockkeeper_places_limit",
            "Places in all of the semaphores with a live place, at scrape time.",
        )
        shared = GaugeMetricFamily(
            "lockkeeper_shared_grants",
            "Live shared grants, every resource, at scrape time.",
        )
        used.add_metric([], holders.used if holders else 0)
        limit.add_metric([], holders.limit if holders else 0)
        shared.add_metric([], holders.shared if holders else 0)
        return locks, up, schema, waiters, sessions, used, limit, shared


class BuildInfoCollector(Collector):
    """``lockkeeper_build_info{version,schema}``: this instance's code, by its
    release and the schema revision it needs (its migrations' head)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self.collect()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from lockkeeper_core.schema import required_revisions, shown_revisions

        from app.ops.version import RELEASE

        info = GaugeMetricFamily(
            "lockkeeper_build_info",
            "1, labelled with this instance's version and the schema revision its "
            "code needs.",
            labels=["version", "schema"],
        )
        info.add_metric([RELEASE, shown_revisions(required_revisions())], 1)
        yield info


class AppMetrics:
    """Everything ``/metrics`` serves for one app."""

    def __init__(self, app: Flask):
        self.app = app
        self.multiprocess_dir = multiprocess_dir()
        if self.multiprocess_dir:
            # Each metric child opens its file there as soon as it is created.
            os.makedirs(self.multiprocess_dir, exist_ok=True)
        self.registry = CollectorRegistry()
        families = PrefixFamilies(
            prefix_families(app.config.get("LOCKKEEPER_METRICS_PREFIXES") or "")
        )
        self.locks = LockMetrics(self.registry, families)
        self._requests = Counter(
            "lockkeeper_http_requests",
            "HTTP requests by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "lockkeeper_http_request_duration_seconds",
            "Time from the start of a request to its response, by method and route.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._streams = Gauge(
            "lockkeeper_open_streams",
            "Event streams (GET /api/v1/events?follow=true) open in this server's "
            "workers right now.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        if not self.multiprocess_dir:
            self.registry.register(BuildInfoCollector())
        self.fleet = CollectorRegistry()
        self.fleet.register(FleetCollector(app))
        # (method, route, status) -> its counter and histogram children: labels()
        # validates, locks and hashes its values on every call.
        self._children: dict[tuple[str, str | None, int], tuple] = {}

    def observe_request(
        self, method: str, route: str | None, status: int, seconds: float
    ) -> None:
        # Label values are bounded: a route template, never the raw path.
        method = method if method in HTTP_METHODS else "OTHER"
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            route = route or UNMATCHED_ROUTE
            children = self._children[key] = (
                self._requests.labels(method, route, str(status)),
                self._latency.labels(method, route),
            )
        children[0].inc()
        children[1].observe(seconds)

    def stream_opened(self) -> None:
        self._streams.inc()

    def stream_closed(self) -> None:
        self._streams.dec()

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)
            registry.register(BuildInfoCollector())
        else:
            registry = self.registry
        return generate_latest(registry), CONTENT_TYPE_LATEST

    def render_fleet(self) -> tuple[bytes, str]:
        """The database's gauges, for the fleet's one scrape."""
        return generate_latest(self.fleet), CONTENT_TYPE_LATEST


def init_app(app: Flask) -> LockMetrics:
    """Create the app's metrics; returns the recorder the LockService bumps."""
    metrics = AppMetrics(app)
    app.extensions["lockkeeper.metrics"] = metrics
    return metrics.locks


def app_metrics() -> AppMetrics:
    return current_app.extensions["lockkeeper.metrics"]
