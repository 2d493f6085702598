"""A worker process: takes hot locks through ``LockClient`` and writes down what it
believed, one JSON line per fact, flushed at once (a history must survive faults).

Records (``kind``):

- ``grant``: the service granted ``resource`` to ``owner`` with ``fence``,
  ``acquired_at`` and ``expires_at`` (the database's clock, as the API reported),
  its ``limit`` and ``mode`` as asked (a semaphore's place, a shared grant: the
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
from pathlib import Path

from lockkeeper_client import (
    LockClient,
    LockClientError,
    LockLost,
    ServiceUnavailable,
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

    @property
    def client(self) -> LockClient:
        return self.clients[self.current]

    def fail_over(self) -> None:
        """That instance is down (or its database is): try the next one."""
        self.current = (self.current + 1) % len(self.clients)
        time.sleep(self.rng.uniform(0.02, 0.15))

    def unknown(self, op: str, resource: str, owner: str, exc: Exception) -> None:
        self.record.count(op, "unknown")
        self.record.write(
            "unknown",
            op=op,
            resource=resource,
            owner=owner,
            status=getattr(exc, "status", None),
            error=str(exc)[:300],
        )
        self.fail_over()

    def error(self, op: str, resource: str, owner: str, exc: LockClientError) -> None:
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

    def one_job(self) -> None:
        config = self.config
        resource = self.rng.choice(config.resources)
        ttl = round(self.rng.uniform(config.min_ttl, config.max_ttl), 3)
        self.attempt += 1
        owner = f"w{config.index:02d}-{self.attempt}"
        wait = None
        if config.waits and self.rng.random() < 0.5:
            wait = round(self.rng.uniform(0.2, 2.0), 3)
        limit = (config.limits or {}).get(resource)
        shared = resource in config.shared and self.rng.random() < config.shared_share
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
        if not result.acquired:
            self.record.count("acquire", "refused")
            wait = result.retry_after if result.retry_after is not None else 0.1
            time.sleep(min(wait, self.rng.uniform(0.01, 0.2)))
            return
        lock = result.lock
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
            ttl=ttl,
            url=self.client.base_url,
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
        self.hold(resource, owner, lock.fence, ttl)

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


def worker_main(config: WorkerConfig) -> None:
    Worker(config).run()
