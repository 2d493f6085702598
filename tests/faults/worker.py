"""A worker process: takes hot locks through ``LockClient`` and writes down what it
believed, one JSON line per fact, flushed at once (a history must survive faults).

Records (``kind``):

- ``grant``: the service granted ``resource`` to ``owner`` with ``fence``,
  ``acquired_at`` and ``expires_at`` (the database's clock, as the API reported),
  its ``limit`` and ``mode`` as asked (a semaphore's holder, a shared grant: the
  worker's ``limits`` and ``shared_share``); a grant of another kind is also an
  ``error``.
- ``renewed``: a renewal answered 200 with a new ``expires_at``.
- ``released``: a release answered 204.
- ``lost``: a renew or release said the lock was gone (the worker learned of the
  loss; ``status`` is the API's answer).
- ``unknown``: a request whose outcome the worker cannot know (connection refused
  or reset, timeout, 502-504 from a killed instance or a database outage). Like a
  Jepsen "info" operation it may or may not have taken effect.
- ``error``: an answer outside the contract (a 500, a 400 to a valid request).
- ``waited``: an acquire that waited in the server's line (``wait`` seconds asked,
  ``elapsed`` until its answer, ``outcome``): the checker holds it to its wait.
- ``session``: a session was started (``session`` its id, ``owner``, ``ttl``,
  ``expires_at``). Its grants are ``grant`` records naming it (``session``):
  they have no expiry of their own and are never renewed one by one.
- ``heartbeat``: the session's heartbeat answered 200 with a new ``expires_at``
  (and ``last_heartbeat``, the database's clock when it renewed): every grant
  bound to it is believed valid until then. A heartbeat writes no lock event.
- ``session_lost``: a heartbeat (or a bound acquire, or the end) said the
  session had expired or was gone (``op``, ``status``).
- ``session_ended``: ending the session answered 204: its grants are over.
- ``summary``: counts, written last.

Each grant attempt uses a fresh owner (``w07-123``), so any event in the audit
log names the one attempt that caused it. The client is used with ``retries=0``:
a retry inside the client would turn "maybe applied" into a plain answer and
hide from the checker that an earlier attempt may have taken the lock; the worker
retries itself, as a new attempt, on the next instance.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from lockkeeper_client import (
    LockClient,
    LockClientError,
    LockLost,
    ServiceUnavailable,
    SessionLost,
)


@dataclass(frozen=True)
class WorkerConfig:
    index: int
    urls: list[str]
    token: str
    resources: list[str]
    start_at: float  # wall clock: all workers begin together
    deadline: float
    history: str
    seed: int
    min_ttl: float = 0.2
    max_ttl: float = 2.0
    pause_probability: float = 0.1
    # This worker's acquires wait in the server's line (up to 2 s) half the time.
    waits: bool = False
    # Resources taken as a counting semaphore: resource -> its limit.
    limits: dict[str, int] | None = None
    # Resources read and written: this share of their acquires asks shared.
    shared: tuple[str, ...] = ()
    shared_share: float = 0.75
    # This share of the jobs opens a session, binds one grant or more to it
    # (of the worker's resources, each as it would take it alone, and of
    # ``session_resources``, exclusive), keeps them by the session's heartbeat
    # and ends the session.
    session_share: float = 0.0
    session_resources: tuple[str, ...] = ()
    # A session lives longer than a plain grant: its job binds several grants
    # (the first waiting in line) before its first heartbeat, which at a load
    # average of 30 took longer than a plain grant's ttl, so no heartbeat was
    # ever answered. Its first heartbeat is prompt; each later one is late past
    # the ttl with this probability, which is how sessions are lost.
    session_min_ttl: float = 2.0
    session_max_ttl: float = 4.0
    session_pause_probability: float = 0.35


class Recorder:
    def __init__(self, path: Path):
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.counts: Counter[str] = Counter()

    def write(self, kind: str, **fields) -> None:
        fields = {"kind": kind, "t": time.time(), **fields}
        self._file.write(json.dumps(fields, default=str) + "\n")
        self._file.flush()

    def count(self, op: str, outcome: str) -> None:
        self.counts[f"{op}:{outcome}"] += 1

    def close(self) -> None:
        self.write("summary", counts=dict(self.counts))
        self._file.close()


class Worker:
    def __init__(self, config: WorkerConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self.clients = [
            LockClient(url, config.token, timeout=5.0, retries=0) for url in config.urls
        ]
        self.current = config.index % len(self.clients)
        self.record = Recorder(Path(config.history))
        self.attempt = 0
        self.sessions_led = 0

    @property
    def client(self) -> LockClient:
        return self.clients[self.current]

    def fail_over(self) -> None:
        """That instance is down (or its database is): try the next one."""
        self.current = (self.current + 1) % len(self.clients)
        time.sleep(self.rng.uniform(0.02, 0.15))

    def unknown(
        self, op: str, resource: str | None, owner: str, exc: Exception, **more
    ) -> None:
        self.record.count(op, "unknown")
        self.record.write(
            "unknown",
            op=op,
            resource=resource,
            owner=owner,
            status=getattr(exc, "status", None),
            error=str(exc)[:300],
            **more,
        )
        self.fail_over()

    def error(
        self, op: str, resource: str | None, owner: str, exc: LockClientError
    ) -> None:
        self.record.count(op, "error")
        self.record.write(
            "error",
            op=op,
            resource=resource,
            owner=owner,
            status=exc.status,
            type=type(exc).__name__,
            error=str(exc)[:500],
        )

    def run(self) -> None:
        config = self.config
        time.sleep(max(0.0, config.start_at - time.time()))
        try:
            while time.time() < config.deadline:
                self.one_job()
        finally:
            self.record.close()
            for client in self.clients:
                client.close()

    def kind_of(self, resource: str) -> tuple[int | None, bool]:
        """How this job takes ``resource``: its semaphore limit (None: not a
        semaphore) and whether shared."""
        config = self.config
        limit = (config.limits or {}).get(resource)
        shared = resource in config.shared and self.rng.random() < config.shared_share
        return limit, shared

    def one_job(self) -> None:
        config = self.config
        if self.rng.random() < config.session_share:
            self.session_job()
            return
        resource = self.rng.choice(config.resources)
        ttl = round(self.rng.uniform(config.min_ttl, config.max_ttl), 3)
        self.attempt += 1
        owner = f"w{config.index:02d}-{self.attempt}"
        wait = None
        if config.waits and self.rng.random() < 0.5:
            wait = round(self.rng.uniform(0.2, 2.0), 3)
        limit, shared = self.kind_of(resource)
        sent = time.monotonic()
        try:
            result = self.client.acquire(
                resource, owner, ttl, wait=wait, limit=limit, shared=shared
            )
        except ServiceUnavailable as exc:
            self.unknown("acquire", resource, owner, exc)
            return
        except LockClientError as exc:
            self.error("acquire", resource, owner, exc)
            return
        if wait is not None:
            self.waited(resource, owner, wait, sent, result)
        if not result.acquired:
            self.record.count("acquire", "refused")
            wait = result.retry_after if result.retry_after is not None else 0.1
            time.sleep(min(wait, self.rng.uniform(0.01, 0.2)))
            return
        lock = result.lock
        self.granted(resource, owner, lock, limit, shared, ttl=ttl)
        self.hold(resource, owner, lock.fence, ttl)

    def waited(self, resource, owner, wait, sent, result) -> None:
        """Write down a waiting acquire's answer and how long it took (the
        checker holds it to its wait)."""
        outcome = "granted" if result.acquired else "refused"
        if result.waiting_room_full:
            outcome = "full"
        self.record.count("wait", outcome)
        self.record.write(
            "waited",
            resource=resource,
            owner=owner,
            wait=wait,
            elapsed=round(time.monotonic() - sent, 4),
            outcome=outcome,
        )

    def granted(self, resource, owner, lock, limit, shared, **more) -> None:
        """Write down a grant as believed: the kind asked for (``limit``,
        ``shared``), with ``more`` (its ``ttl``, or its ``session``)."""
        asked = (limit or 1, "shared" if shared else "exclusive")
        self.record.count("acquire", "granted")
        self.record.write(
            "grant",
            resource=resource,
            owner=owner,
            fence=lock.fence,
            acquired_at=lock.acquired_at.isoformat(),
            expires_at=lock.expires_at.isoformat(),
            limit=asked[0],
            mode=asked[1],
            url=self.client.base_url,
            **more,
        )
        if (lock.limit, lock.mode) != asked:
            # Believed as asked; a grant of another kind is outside the contract.
            self.record.count("acquire", "error")
            self.record.write(
                "error",
                op="acquire",
                resource=resource,
                owner=owner,
                status=200,
                error=f"asked {asked}, granted {(lock.limit, lock.mode)}",
            )

    def hold(self, resource: str, owner: str, fence: int, ttl: float) -> None:
        for _ in range(self.rng.randint(1, 4)):
            if self.rng.random() < self.config.pause_probability:
                # A simulated GC pause: the lock runs out while we are away.
                self.record.count("pause", "taken")
                time.sleep(ttl * self.rng.uniform(1.2, 2.5))
            else:
                time.sleep(ttl * self.rng.uniform(0.1, 0.45))
            try:
                lock = self.client.renew(resource, owner, ttl)
            except LockLost as exc:
                self.record.count("renew", "lost")
                self.record.write(
                    "lost",
                    op="renew",
                    resource=resource,
                    owner=owner,
                    fence=fence,
                    status=exc.status,
                )
                return
            except ServiceUnavailable as exc:
                self.unknown("renew", resource, owner, exc)
                continue
            except LockClientError as exc:
                self.error("renew", resource, owner, exc)
                return
            self.record.count("renew", "renewed")
            self.record.write(
                "renewed",
                resource=resource,
                owner=owner,
                fence=lock.fence,
                expires_at=lock.expires_at.isoformat(),
            )
        try:
            self.client.release(resource, owner)
        except LockLost as exc:
            self.record.count("release", "lost")
            self.record.write(
                "lost",
                op="release",
                resource=resource,
                owner=owner,
                fence=fence,
                status=exc.status,
            )
        except ServiceUnavailable as exc:
            self.unknown("release", resource, owner, exc)
        except LockClientError as exc:
            self.error("release", resource, owner, exc)
        else:
            self.record.count("release", "released")
            self.record.write("released", resource=resource, owner=owner, fence=fence)

    # -- a session -------------------------------------------------------------

    def session_job(self) -> None:
        """Start a session, bind grants to it (never waiting: a bound grant
        held while waiting for another would only stall the others), keep
        them by heartbeats alone (a pause past the session's ttl lets another
        worker take them over), then end it. Its owner names the attempt, as a
        plain grant's does: every event of its grants names the session too."""
        config = self.config
        self.attempt += 1
        owner = f"w{config.index:02d}-s{self.attempt}"
        ttl = round(self.rng.uniform(config.session_min_ttl, config.session_max_ttl), 3)
        try:
            info = self.client.create_session(owner, ttl)
        except ServiceUnavailable as exc:
            self.unknown("session", None, owner, exc)
            return
        except LockClientError as exc:
            self.error("session", None, owner, exc)
            return
        session = info.id
        self.record.count("session", "started")
        self.record.write(
            "session",
            session=session,
            owner=owner,
            ttl=info.ttl,
            expires_at=info.expires_at.isoformat(),
        )
        choices = [*config.resources, *config.session_resources]
        # Each resource leads a session in turn: the first acquire waits in
        # line for a share of the session's ttl (the others hold the hot
        # resource and the semaphore most of the time), and nothing is bound
        # yet, so the session holds nothing while it waits. Drawn first at
        # random, a loaded run once bound no semaphore place in 7 sessions.
        first = choices[(config.index + self.sessions_led) % len(choices)]
        self.sessions_led += 1
        rest = [name for name in choices if name != first]
        wanted = [first, *self.rng.sample(rest, self.rng.randint(0, len(rest)))]
        bound, lost = 0, False
        for resource in wanted:
            if self.past_deadline():
                break
            limit, shared = self.kind_of(resource)
            wait = None
            if not bound:
                wait = round(info.ttl * 0.25, 3)
            sent = time.monotonic()
            try:
                result = self.client.acquire(
                    resource,
                    owner,
                    session=session,
                    limit=limit,
                    shared=shared,
                    wait=wait,
                )
            except SessionLost as exc:
                self.session_lost("acquire", session, owner, exc)
                lost = True
                break
            except ServiceUnavailable as exc:
                self.unknown("acquire", resource, owner, exc)
                continue
            except LockClientError as exc:
                self.error("acquire", resource, owner, exc)
                continue
            if wait is not None:
                self.waited(resource, owner, wait, sent, result)
            if not result.acquired:
                self.record.count("acquire", "refused")
                continue
            bound += 1
            self.granted(resource, owner, result.lock, limit, shared, session=session)
        if bound and not lost:
            self.keep_alive(session, owner, info.ttl)
        # Ended even when lost: an expired session keeps its row until a
        # purge, and its end records its grants' end (at its expiry).
        self.end_session(session, owner)

    def keep_alive(self, session: str, owner: str, ttl: float) -> None:
        """Heartbeat the session a few times, unless it is lost meanwhile or
        the run is over; a heartbeat after the first may come too late."""
        for beat in range(self.rng.randint(1, 4)):
            if self.past_deadline():
                return
            if beat and self.rng.random() < self.config.session_pause_probability:
                self.record.count("pause", "taken")
                time.sleep(ttl * self.rng.uniform(1.2, 2.5))
            else:
                time.sleep(ttl * self.rng.uniform(0.1, 0.45))
            try:
                info = self.client.heartbeat(session)
            except SessionLost as exc:
                self.session_lost("heartbeat", session, owner, exc)
                return
            except ServiceUnavailable as exc:
                self.unknown("heartbeat", None, owner, exc, session=session)
                continue
            except LockClientError as exc:
                self.error("heartbeat", None, owner, exc)
                return
            self.record.count("heartbeat", "renewed")
            self.record.write(
                "heartbeat",
                session=session,
                owner=owner,
                expires_at=info.expires_at.isoformat(),
                last_heartbeat=(
                    info.expires_at - timedelta(seconds=info.ttl)
                ).isoformat(),
            )

    def end_session(self, session: str, owner: str) -> None:
        try:
            self.client.end_session(session)
        except SessionLost as exc:
            self.session_lost("end", session, owner, exc)
        except ServiceUnavailable as exc:
            self.unknown("end", None, owner, exc, session=session)
        except LockClientError as exc:
            self.error("end", None, owner, exc)
        else:
            self.record.count("session", "ended")
            self.record.write("session_ended", session=session, owner=owner)

    def past_deadline(self) -> bool:
        """A session's job is several requests: past the run's end it sends
        no more than its end, so the run's wait for its workers stays bound."""
        return time.time() >= self.config.deadline

    def session_lost(self, op: str, session: str, owner: str, exc) -> None:
        self.record.count(op, "session_lost")
        self.record.write(
            "session_lost", op=op, session=session, owner=owner, status=exc.status
        )


def worker_main(config: WorkerConfig) -> None:
    Worker(config).run()
