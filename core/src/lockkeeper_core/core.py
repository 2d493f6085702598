"""The lock core every part of the service is handed: engines, statements,
settings, metrics, the deciding clock, and ``run`` (one retried transaction).

The parts (``commands``, ``operator``, ``freezes``, ``reads``, ``lists``,
``counts``, ``sessions``) each hold a ``LockCore`` and import no other part;
``lockkeeper_core.service`` builds the set. Nothing here knows Flask: a worker's own
process builds a core on its own engine (the embedded mode).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from lockkeeper_core import validation
from lockkeeper_core.clock import Clock, DatabaseClock, SystemClock
from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.driver import DriverConnection
from lockkeeper_core.engine import SERVER_CLOCK_DIALECTS, autocommit
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.instrumentation import NO_METRICS, NoMetrics
from lockkeeper_core.results import Lock
from lockkeeper_core.statements import statements_for
from lockkeeper_core.statements.sessions import SessionStatements
from lockkeeper_core.transactions import TransactionRunner

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class LockSettings:
    default_ttl: float = 30.0
    max_ttl: float = 86400.0
    expiring_within: float = 15.0
    retries: int = 5
    max_wait: float = 30.0
    max_waiters: int = 16
    max_waiters_per_token: int = 8
    max_sessions_per_token: int = 0
    # How many resources one set may name (``lockkeeper_core.sets``).
    max_set_size: int = 16
    wait_poll_interval: float = 0.05
    listen_url: str | None = None
    listen: bool = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LockSettings:
        return cls(
            default_ttl=float(config["LOCKKEEPER_DEFAULT_TTL"]),
            max_ttl=float(config["LOCKKEEPER_MAX_TTL"]),
            expiring_within=float(config["LOCKKEEPER_EXPIRING_WITHIN"]),
            retries=int(config["LOCKKEEPER_DEADLOCK_RETRIES"]),
            max_wait=float(config["LOCKKEEPER_MAX_WAIT"]),
            max_waiters=int(config["LOCKKEEPER_MAX_WAITERS"]),
            max_waiters_per_token=int(config["LOCKKEEPER_MAX_WAITERS_PER_TOKEN"]),
            max_sessions_per_token=int(config["LOCKKEEPER_MAX_SESSIONS_PER_TOKEN"]),
            max_set_size=int(config.get("LOCKKEEPER_MAX_SET_SIZE", 16)),
            wait_poll_interval=float(config["LOCKKEEPER_WAIT_POLL_INTERVAL"]),
            listen_url=config.get("LOCKKEEPER_LISTEN_DATABASE_URL") or None,
            # LISTEN through a transaction-pooling PgBouncer hears nothing: without
            # a direct URL for it, waiters poll instead.
            listen=bool(
                config.get("LOCKKEEPER_LISTEN_DATABASE_URL")
                or not config.get("LOCKKEEPER_PGBOUNCER")
            ),
        )


class LockCore:
    """What every part uses, and nothing that one part alone needs."""

    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: LockSettings,
        metrics: NoMetrics = NO_METRICS,
    ):
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self.settings = settings
        self.dialect = engine.dialect.name
        self.statements = statements_for(self.dialect)
        self.transactional = self.statements.transactional
        self.session_statements = SessionStatements(self.transactional)
        # Where a holder is acquired, renewed or released: the statements where
        # those are one statement each (PostgreSQL), else the transactional ones.
        self.holder_statements = (
            self.statements if self.statements.autocommit else self.transactional
        )
        self.has_server_clock = self.dialect in SERVER_CLOCK_DIALECTS
        # Single-statement reads: no BEGIN/COMMIT round trips.
        self.reads = autocommit(engine)
        self.write_engine = engine.execution_options(sqlite_immediate=True)
        # The hot path's one-statement connection (its own pooled one kept
        # between statements): ``run(autocommit=True)``, a set's statements.
        self.driver = DriverConnection(self.reads)
        # SQLite's hot path: its transaction on the driver's connection.
        self._driver_begin = self.statements.driver_transaction
        self._write_driver = DriverConnection(self.write_engine)
        self.runner = TransactionRunner(settings.retries)

    def close(self) -> None:
        """Check in the connections kept between statements
        (``lockkeeper_core.driver.KeptConnection``)."""
        self.driver.close()
        self._write_driver.close()

    def given_now(self) -> datetime | None:
        """The caller-side clock reading, or None for "the server's, in SQL"."""
        now = self.clock.now()
        if now is None and not self.has_server_clock:
            return datetime.now(UTC)
        return now

    def now(self) -> datetime:
        """The deciding clock's current reading."""
        now = self.given_now()
        if now is not None:
            return now
        with self.reads.connect() as conn:
            return self.transactional.read_now(conn)

    def read_at(self, at: datetime | None) -> datetime:
        """``at``, the instant a page's reads are all judged at (one reading of
        the clock per page: on PostgreSQL and MariaDB each is a round trip),
        or the clock's reading now when a caller gives none."""
        return at if at is not None else self.now()

    def clock_in(self, conn) -> datetime:
        """The deciding clock, inside ``conn``'s transaction (after its locks)."""
        now = self.given_now()
        return now if now is not None else self.transactional.read_now(conn)

    def server_now(self):
        """The server's clock as a SQL expression (PostgreSQL, MariaDB)."""
        return self.transactional._server_now().cast(UTCDateTime())

    def run(
        self,
        work: Callable[[Connection], T],
        *,
        autocommit: bool = False,
        driver: bool = False,
        decide: Callable[[T], R] | None = None,
    ) -> R:
        """Run ``work`` in its own transaction and ``decide`` on its result, the
        pair retried by ``lockkeeper_core.transactions`` (deadlocks, lost first
        inserts, a row that changed before the decision: ``decide`` raises
        ``Raced``).

        ``autocommit``: ``work`` is one statement and gets the ``DriverConnection``.
        ``driver`` (and a statements class with ``driver_transaction``: SQLite,
        MariaDB):
        ``work`` gets a ``DriverTransaction`` instead of a SQLAlchemy connection.
        """

        def attempt():
            if autocommit:
                result = work(self.driver)
            elif driver and self._driver_begin is not None:
                with self._write_driver.transaction(self._driver_begin) as transaction:
                    result = work(transaction)
            else:
                with self.write_engine.connect() as conn, conn.begin():
                    result = work(conn)
            return result if decide is None else decide(result)

        return self.runner(attempt)

    def lock(self, row, now: datetime) -> Lock:
        return Lock.from_row(row, now, self.settings.expiring_within)

    def ttl(self, ttl: Any) -> float:
        return self.settings.default_ttl if ttl is None else ttl

    def validate(
        self,
        *,
        resource: Any = ...,
        owner: Any = ...,
        ttl: Any = ...,
        reason: Any = ...,
        actor: Any = ...,
        wait: Any = ...,
        run: Any = ...,
    ) -> None:
        """Raise ``InvalidInput`` naming every bad field among those given.
        Each check written out: a table of checks (closures over the settings)
        built on every call cost more than the checks themselves."""
        errors: list[tuple[str, str]] = []
        if resource is not ... and (message := validation.resource_error(resource)):
            errors.append(("resource", message))
        if owner is not ... and (message := validation.name_error(owner)):
            errors.append(("owner", message))
        if actor is not ... and actor is not None:
            if message := validation.name_error(actor):
                errors.append(("actor", message))
        if reason is not ... and (message := validation.reason_error(reason)):
            errors.append(("reason", message))
        if ttl is not ... and ttl is not None:
            if message := validation.ttl_error(ttl, self.settings.max_ttl):
                errors.append(("ttl", message))
        if wait is not ... and wait is not None:
            if message := validation.wait_error(wait, self.settings.max_wait):
                errors.append(("wait", message))
        if run is not ...:
            errors.extend(validation.run_errors(run))
        if errors:
            raise InvalidInput(errors)


def validate_fence(fence: Any) -> None:
    """A fence the caller names: None (none named), or a positive integer."""
    if fence is None:
        return
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 1:
        raise InvalidInput([("fence", "must be a positive integer")])


def check_session_id(session_id: Any) -> None:
    error = validation.session_id_error(session_id)
    if error:
        raise InvalidInput([("session", error)])


def clock_for(engine: Engine, configured: Clock | None) -> Clock:
    if configured is not None:
        return configured
    if engine.dialect.name in SERVER_CLOCK_DIALECTS:
        return DatabaseClock()
    return SystemClock()
