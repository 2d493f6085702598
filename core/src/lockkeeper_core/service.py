"""LockService: the lock core's parts, built as one set for every face.

The API, the dashboard and the CLI call the names here and map the exceptions
of ``lockkeeper_core.errors``; none of them touches SQL. Each changing call is one
transaction holding the change and its audit event (see ``statements``).

The set is one ``LockCore`` (``lockkeeper_core.core``) handed to each part, one room
per concept, none importing another:

- ``commands``: the worker's acquire, renew and release;
- ``operator``: force-release, claim, stale release and purge;
- ``freezes``: freeze, unfreeze and the freezes in force;
- ``reads``: one resource's lock, its live grants, a fence check;
- ``lists``: paged lists of locks; ``counts``: aggregate counts;
- ``sessions``: a worker's sessions (``LockService.sessions``);
- ``sets``: several locks acquired, renewed and released as one;

and the waiting line (``lockkeeper_core.queue``) for the parts that wake or wait.
"""

from __future__ import annotations

from sqlalchemy import Engine, event

from lockkeeper_core.clock import Clock
from lockkeeper_core.commands import Commands
from lockkeeper_core.core import LockCore, LockSettings
from lockkeeper_core.counts import Counts
from lockkeeper_core.freezes import Freezes
from lockkeeper_core.instrumentation import NO_METRICS, NoMetrics
from lockkeeper_core.lists import Lists
from lockkeeper_core.operator import Operator
from lockkeeper_core.queue import LineClock, WaitQueue
from lockkeeper_core.reads import Reads
from lockkeeper_core.sessions import SessionService
from lockkeeper_core.sets import Sets


class LockService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: LockSettings,
        metrics: NoMetrics = NO_METRICS,
    ):
        core = LockCore(engine, clock, settings, metrics)
        self.core = core
        self.engine = engine
        self.clock = clock
        self.settings = settings
        self.metrics = metrics
        self.statements = core.statements
        self.queue = WaitQueue(
            reads=core.reads,
            run=core.run,
            clock=LineClock(
                now=core.now,
                given=core.given_now,
                server_now=core.server_now() if core.has_server_clock else None,
            ),
            metrics=metrics,
            max_waiters=settings.max_waiters,
            max_waiters_per_token=settings.max_waiters_per_token,
            poll_interval=settings.wait_poll_interval,
            listen_url=settings.listen_url,
            listen=settings.listen,
        )
        self.sessions = SessionService(core, self.queue.notify_released)
        self.reads = Reads(core)
        self.commands = Commands(core, self.queue, self.reads.holders)
        self.sets = Sets(core, self.queue, self.commands.answer)
        self.operator = Operator(core, self.queue, self.sessions.purge_expired)
        self.freezes = Freezes(core)
        self.lists = Lists(core)
        self.lock_counts = Counts(core)

        # The names the faces call, each the method of its part.
        self.now = core.now
        self.validate = core.validate
        self.run_transaction = core.run
        self.acquire = self.commands.acquire
        self.renew = self.commands.renew
        self.release = self.commands.release
        self.acquire_set = self.sets.acquire
        self.renew_set = self.sets.renew
        self.release_set = self.sets.release
        self.set_view = self.sets.view
        self.sets_of_grants = self.sets.of_grants
        self.force_release_set = self.sets.force_release
        self.force_release = self.operator.force_release
        self.force_release_holder = self.operator.force_release_holder
        self.force_release_all = self.operator.force_release_all
        self.force_release_fenced = self.operator.force_release_fenced
        self.claim = self.operator.claim
        self.release_stale = self.operator.release_stale
        self.count_stale = self.operator.count_stale
        self.purge_stale = self.operator.purge_stale
        self.freeze = self.freezes.freeze
        self.unfreeze = self.freezes.unfreeze
        self.list_freezes = self.freezes.list_freezes
        self.freezes_over = self.freezes.freezes_over
        self.get = self.reads.get
        self.holders = self.reads.holders
        self.check_fence = self.reads.check_fence
        self.list_locks = self.lists.list_locks
        self.count_locks = self.lists.count_locks
        self.counts = self.lock_counts.counts
        self.counts_and_contended = self.lock_counts.counts_and_contended
        self.owner_counts = self.lock_counts.owner_counts
        self.last_seen = self.lock_counts.last_seen
        self.prefix_counts = self.lock_counts.prefix_counts
        self.grouped_with_counts = self.lock_counts.grouped_with_counts
        self.holders_counts = self.lock_counts.holders_counts

        # Disposing of the app's engine (a shutdown, a test's teardown) also ends
        # the queue's listener connection and threads.
        queue = self.queue
        event.listen(engine, "engine_disposed", lambda _engine: queue.stop())

    def close(self) -> None:
        """Stop the background threads of waiting (the LISTEN connection), and
        check in the connections the hot path keeps between statements."""
        self.queue.stop()
        self.core.close()


__all__ = ["LockService", "LockSettings"]
