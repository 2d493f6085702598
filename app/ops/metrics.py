"""Prometheus metrics: HTTP requests, lock operations by outcome, lock-state gauges.

Counters and histograms live on a registry per app. Under several gunicorn workers
``PROMETHEUS_MULTIPROC_DIR`` must be set before ``prometheus_client`` is first
imported (``app.ops.gunicorn_conf`` does it); each worker then writes its values to
files there and ``/metrics`` adds up every worker's files, whichever worker answers.

The held/expiring/stale gauges are not kept in any process: a collector asks the
database at scrape time, so they are right whichever worker is scraped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from flask import Flask, current_app
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

from app.locks.errors import LockError
from app.locks.instrumentation import NoMetrics
from app.locks.state import Action, LockState

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED_ROUTE = "<unmatched>"
WAIT_OUTCOMES = ("granted", "timeout", "gone")
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HANDOVER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Outcomes of a renewal or release. "expired" and "not_owner" are late calls from a
# worker that lost its lock (it ran out, or another owner took it over): the signal
# that a worker's ttl is too short for its work.
RENEWAL_OUTCOMES = ("renewed", "expired", "not_owner", "not_found", "session_bound")
RELEASE_OUTCOMES = ("released", "expired", "not_owner", "not_found")
SESSION_OUTCOMES = (
    "created",
    "heartbeat",
    "heartbeat_expired",
    "heartbeat_unknown",
    "ended",
)
ACQUIRE_GRANTS = (Action.ACQUIRED, Action.REACQUIRED, Action.TOOK_OVER)
OPERATOR_ACTIONS = (Action.FORCE_RELEASED, Action.CLAIMED, Action.FORCE_CLAIMED)


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class LockMetrics(NoMetrics):
    """The service's counters, with every label child bound up front.

    The hot path is a dict lookup and an ``inc()``; an unknown outcome is a
    programming error and raises ``KeyError``.
    """

    def __init__(self, registry: CollectorRegistry):
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
        self._held = acquisitions.labels("held")
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
        sessions = Counter(
            "lockkeeper_sessions",
            "Session calls by outcome: created, heartbeat (renewed the session and "
            "every grant bound to it), heartbeat_expired and heartbeat_unknown "
            "(refused), ended.",
            ["outcome"],
            registry=registry,
        )
        self._sessions = {o: sessions.labels(o) for o in SESSION_OUTCOMES}
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

    def handed_over(self, seconds: float) -> None:
        self._handover.observe(seconds)

    def acquired(self, action: Action) -> None:
        self._granted[action].inc()

    def acquire_refused(self, outcome: str = "held") -> None:
        self._held.inc()
        if self.refusals is not None:
            self.refusals.count(outcome)

    def renewal(self, outcome: str) -> None:
        self._renewals[outcome].inc()

    def release(self, outcome: str) -> None:
        self._releases[outcome].inc()

    def operator_action(self, action: Action) -> None:
        self._operator[action].inc()

    def session(self, outcome: str) -> None:
        self._sessions[outcome].inc()


class LockStateCollector(Collector):
    """Gauges of lock rows per state, counted in the database at scrape time."""

    def __init__(self, app: Flask):
        self.app = app

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Describing must not query: registering the collector would hit the database.
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            service = self.app.extensions["lockkeeper.locks"]
            counts = service.counts()
            queued = service.queue.queued()
            live_sessions = service.sessions.live()
            places = service.places_counts()
        except (SQLAlchemyError, LockError):
            counts = queued = live_sessions = places = None
        yield from self._families(counts, queued, live_sessions, places)

    @staticmethod
    def _families(
        counts: dict[LockState, int] | None = None,
        queued: int | None = None,
        live_sessions: int | None = None,
        places=None,
    ):
        locks = GaugeMetricFamily(
            "lockkeeper_locks",
            "Locks by state (held, expiring, stale), one per resource, at scrape time.",
            labels=["state"],
        )
        for state in LockState:
            if counts is not None:
                locks.add_metric([state.value], counts[state])
        up = GaugeMetricFamily(
            "lockkeeper_database_up",
            "1 when the lock database answered the scrape's count, else 0.",
            value=0 if counts is None else 1,
        )
        waiters = GaugeMetricFamily(
            "lockkeeper_queued_waiters",
            "Acquires waiting in line, every instance, counted at scrape time.",
        )
        if queued is not None:
            waiters.add_metric([], queued)
        sessions = GaugeMetricFamily(
            "lockkeeper_live_sessions",
            "Sessions not yet expired, every instance, counted at scrape time.",
        )
        if live_sessions is not None:
            sessions.add_metric([], live_sessions)
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
        if places is not None:
            used.add_metric([], places.used)
            limit.add_metric([], places.limit)
            shared.add_metric([], places.shared)
        return locks, up, waiters, sessions, used, limit, shared


class AppMetrics:
    """Everything ``/metrics`` serves for one app."""

    def __init__(self, app: Flask):
        self.app = app
        self.multiprocess_dir = multiprocess_dir()
        if self.multiprocess_dir:
            # Each metric child opens its file there as soon as it is created.
            os.makedirs(self.multiprocess_dir, exist_ok=True)
        self.registry = CollectorRegistry()
        self.locks = LockMetrics(self.registry)
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
            self.registry.register(LockStateCollector(app))
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
            registry.register(LockStateCollector(self.app))
        else:
            registry = self.registry
        return generate_latest(registry), CONTENT_TYPE_LATEST


def init_app(app: Flask) -> LockMetrics:
    """Create the app's metrics; returns the recorder the LockService bumps."""
    metrics = AppMetrics(app)
    app.extensions["lockkeeper.metrics"] = metrics
    return metrics.locks


def app_metrics() -> AppMetrics:
    return current_app.extensions["lockkeeper.metrics"]
