"""Sets: several locks acquired, renewed and released as one.

A set names several resources, each with its own mode and limit (an
exclusive grant, a shared one, a semaphore's holder), under one owner and one
ttl. Its acquire is one transaction on every database: every member is
granted, each with its own fence and event, or none is, and the refusal names
the member that refused and why (``SetResult``); a refused set writes nothing
(the transaction rolls back).

The transaction keeps the lock order of ``lockkeeper_core.statements``, so two
overlapping sets (or a set and any single operation) never deadlock:

1. the members' resource rows, locked in the order of ``ORDER BY resource``
   (the order every path that locks several rows takes: a stale release, a
   session's heartbeat);
2. the clock, read once for every member, and the refusals those rows show
   already (another holder's live grant): refused before any write;
3. the API token's row, once: FOR UPDATE under a quota (the set's grants
   count one after another against it), else FOR SHARE;
4. each member's grant by the holders path (``HoldersStatements.acquire_holder``,
   which decides every mode; on PostgreSQL its one statement,
   ``lockkeeper_acquire_place``, in the set's transaction).

A member with no row yet gets a free one first, in a statement of its own
before the transaction (SQLite, one writer at a time: inside it), so every row
the transaction locks it locks in the order above; a refused set deletes the
free rows it made unless a grant has used them since. On MariaDB that
statement is an upsert, not ``INSERT IGNORE`` (``create_rows`` says why).

On PostgreSQL a set with no session is asked first in one statement,
``lockkeeper_acquire_set`` (migration 0041): the same steps in the same
order in the database. A member refused there, or with no row yet, raises:
nothing is written, and the transaction above decides the set again.

A set counts as its members against the token's quota (each grant's count
sees the set's grants before it); rights are checked by the face for every
member, freezes by each member's grant.

Renew and release take the members' rows in the same order, in one
transaction each; on PostgreSQL a release is one statement,
``lockkeeper_release_set`` (migration 0042), each member's release functions
in the database. A renewal is all or nothing (a member lost refuses the
whole renewal, naming it); a release ends every member still held and names
those that were not. An operator's release of a set (``force_release``, by
the set's id) takes them in the same order too, in one transaction.

Every event of a set names it (``lock_events.set_id``, migration 0037;
``lockkeeper_core.set_names``), by which the dashboard shows a set's members
together (``view``).

A set asked with ``wait`` waits in line: a place in every member's line at
once (``lockkeeper_core.set_waiting``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert

from lockkeeper_core import rules, validation
from lockkeeper_core.core import LockCore, check_session_id
from lockkeeper_core.errors import (
    InvalidInput,
    LockExpired,
    LockNotFound,
    NotOwner,
    QuotaExceeded,
    ResourceFrozen,
    SessionBound,
    SessionExpired,
    UnknownSession,
)
from lockkeeper_core.instrumentation import held_for
from lockkeeper_core.models import NO_TOKEN
from lockkeeper_core.queue import WaitQueue
from lockkeeper_core.results import (
    AcquireResult,
    Event,
    Lock,
    SetForceRelease,
    SetMember,
    SetRelease,
    SetResult,
    SetView,
)
from lockkeeper_core.set_names import (
    check_set_id,
    current_grants,
    grant_events,
    grants_of,
    name_sets,
    new_set_id,
    sets_of,
)
from lockkeeper_core.set_waiting import Wanted, check_kept, wait_in_line
from lockkeeper_core.state import Action, holds
from lockkeeper_core.statements.common import (
    Outcome,
    events,
    lock_rows_in_order,
    locks,
)
from lockkeeper_core.statements.postgresql import InTransaction
from lockkeeper_core.statements.sessions import SessionEnded, SessionNotFound
from lockkeeper_core.transactions import Raced
from lockkeeper_core.validation import session_ttl_error
from lockkeeper_core.values import Ask, Member

# ``Sets.forget_rows`` on MariaDB: one free row by name, through the names'
# unique index (the multi-table form takes an index hint).
_FORGET_BY_NAME = text(
    "DELETE distributed_locks FROM distributed_locks"
    " FORCE INDEX (uq_distributed_locks_resource)"
    " WHERE resource = :resource AND owner IS NULL AND fence = 0"
    " AND places_until IS NULL AND session_id IS NULL"
)

# The events a set's view shows, the newest first.
SET_EVENTS_SHOWN = 200


class _Missing(Exception):
    """Members with no row yet (a server database): made first, then the
    set's transaction again."""

    def __init__(self, asks: list[Ask]):
        super().__init__([ask.resource for ask in asks])
        self.asks = asks


class _Refused(Exception):
    """A member refused inside the set's transaction: raised to roll it back
    whole, then answered after it (``Commands.answer``)."""

    def __init__(self, ask: Ask, outcome: Outcome):
        super().__init__(ask.resource)
        self.ask = ask
        self.outcome = outcome


class Sets:
    """Handed the core, the waiting line, the worker's answer to one refused
    acquire (``Commands.answer``: the refusal, then its second look)."""

    def __init__(
        self,
        core: LockCore,
        queue: WaitQueue,
        answer: Callable[[Ask, Outcome], AcquireResult],
    ) -> None:
        self.core, self.queue, self._answer = core, queue, answer
        self._notify = queue.notify_released

    # -- checks ------------------------------------------------------------------

    def check_members(self, members: Sequence[Member]) -> None:
        """Raise ``InvalidInput`` naming every bad member: a resource named
        twice, a bad name, limit or mode, more than the set's bound."""
        bound = self.core.settings.max_set_size
        if not members:
            raise InvalidInput([("members", "must name at least one resource")])
        if len(members) > bound:
            raise InvalidInput(
                [
                    (
                        "members",
                        f"at most {bound} resources in one set "
                        f"(LOCKKEEPER_MAX_SET_SIZE); this one has {len(members)}",
                    )
                ]
            )
        errors: list[tuple[str, str]] = []
        seen: set[str] = set()
        for i, member in enumerate(members):
            field = f"members[{i}]"
            message = validation.resource_error(member.resource)
            if message:
                errors.append((f"{field}.resource", message))
            elif member.resource in seen:
                errors.append((f"{field}.resource", "names a resource already named"))
            else:
                seen.add(member.resource)
            errors.extend(
                (f"{field}.{name}", text)
                for name, text in validation.holder_errors(member.limit, member.mode)
            )
        if errors:
            raise InvalidInput(errors)

    # -- acquire -----------------------------------------------------------------

    def acquire(
        self,
        members: Sequence[Member],
        owner: str,
        ttl: float | None = None,
        actor: str | None = None,
        *,
        token: str | None = None,
        max_locks: int | None = None,
        session: str | None = None,
        wait: float | None = None,
        still_wanted: Callable[[], bool] | None = None,
        token_live: Callable[[], bool] | None = None,
        places: dict[str, int] | None = None,
        rejoin: bool = False,
    ) -> SetResult:
        """Grant every member to (``token``, ``owner``) for ``ttl`` seconds in
        one transaction, or none (``SetResult.refused`` names the member).

        ``wait``: seconds in every member's line (``set_waiting``), in one
        seat of the waiting room (``WaitersFull`` when there is none), while
        ``still_wanted()`` and ``token_live()`` hold (as a single waiter's).
        ``places`` and ``rejoin`` (with ``wait``): a single waiter's ``place``
        and ``rejoin`` for every member's line ({} asks for places to be
        kept; ``WaitersFull.places``, ``SetResult.places`` name them).

        ``session``: the id of a session of ``token`` and ``owner`` to bind
        every member to instead of a ``ttl``: their expiry is the session's,
        its heartbeat renews them and its end releases them, as a single
        grant bound to it.

        :raise ResourceFrozen, LimitMismatch, QuotaExceeded, TokenEnded,
            SessionBound, WaitersFull: as a single acquire of the member that
            refused would (each names its resource where it has one); nothing
            written.
        :raise UnknownSession: no such session of ``token``.
        :raise SessionExpired: the session ran out before the grant.
        """
        core = self.core
        core.validate(owner=owner, ttl=ttl, actor=actor, wait=wait)
        if session is not None:
            both = session_ttl_error(ttl, session)
            if both:
                raise InvalidInput([("session", both)])
            check_session_id(session)
        self.check_members(members)
        seconds = core.ttl(ttl)
        asks = {
            m.resource: Ask(
                m.resource, owner, token, seconds, actor, max_locks, m.limit, m.mode
            )
            for m in members
        }
        ordered = [asks[resource] for resource in sorted(asks)]
        set_id = new_set_id()

        def attempt(places=None) -> SetResult:
            created: list[str] = []
            try:
                outcomes = self._granted_whole(
                    ordered, token, max_locks, created, set_id, session, places
                )
            except _Refused as refused:
                # Rolled back whole, and the rows made for it gone again; the
                # refusal's answer (a second look may find the row changed:
                # ``Raced``, tried again).
                self.forget_rows(created)
                answer = self._answer(refused.ask, refused.outcome)
                return SetResult(
                    False, [], refused.ask.resource, answer.lock, answer.waiters
                )
            for resource, outcome in outcomes.items():
                core.metrics.acquired(outcome.action, resource)
            granted = [outcomes[m.resource] for m in members]
            held = [replace(core.lock(o.row, o.now), session=session) for o in granted]
            return SetResult(True, held, set_id=set_id)

        def asked(places=None) -> SetResult:
            try:
                return core.runner(lambda: attempt(places))
            except QuotaExceeded:
                core.metrics.acquire_refused("over_quota")
                raise
            except ResourceFrozen:
                core.metrics.acquire_refused("frozen")
                raise

        places = places if wait else None
        check_kept(places, ordered)
        # Kept places are asked from where they stand, in line.
        result = SetResult(False, []) if places else asked()
        if not result.acquired and wait:
            wanted = Wanted(still_wanted, token_live, token)
            result = wait_in_line(self, ordered, wait, asked, wanted, places, rejoin)
        if not result.acquired:
            core.metrics.acquire_refused()
        return result

    def _granted_whole(
        self,
        ordered: list[Ask],
        token: str | None,
        max_locks: int | None,
        created: list[str],
        set_id: str,
        session: str | None,
        places: dict[str, int] | None = None,
    ) -> dict[str, Outcome]:
        """The set's transaction (on PostgreSQL with no session, one
        statement first: ``PostgresStatements.acquire_set``); on a server
        database, first the free rows of the members that have none, each in
        a statement of its own (``created``: those this call made).

        A row inserted inside the transaction would be a lock taken out of
        the lock order: on MariaDB an insert whose resource another
        transaction meanwhile made and locked waits for that lock (its
        duplicate check) while holding the set's other rows; that other
        transaction may wait for one of them.
        """
        core = self.core
        if session is None and core.dialect == "postgresql":
            given, pg = core.given_now(), core.statements
            one = pg.acquire_set(core.driver, ordered, set_id, places, given)
            if one is not None:
                return one
        try:
            for _ in range(2):
                try:
                    with core.write_engine.connect() as conn, conn.begin():
                        granted = self._grant_all(
                            conn, ordered, token, max_locks, session, places
                        )
                        name_sets(conn, grants_of(granted, set_id))
                        return granted
                except _Missing as missing:
                    created.extend(self.create_rows(missing.asks))
            raise Raced("a set's rows kept vanishing (purged); try again")
        except _Refused:
            raise
        except BaseException:
            self.forget_rows(created)
            raise

    def create_rows(self, asks: list[Ask]) -> list[str]:
        """Insert the free row of each resource of ``asks`` that has none, one
        autocommit statement each (holding nothing else meanwhile), in the
        lock order; the names of the rows this call inserted.

        MariaDB: ``ON DUPLICATE KEY UPDATE id = id`` (which changes nothing),
        so that two of these making one name at once take turns. A deleted
        row's index entry stays until InnoDB purges it; two ``INSERT IGNORE``
        of its name at once each take a shared lock on the entry after it
        (their duplicate check), then each wait for the other's insert: a
        deadlock (certain when a third transaction holds that next row).
        The upsert's check locks exclusively: the second waits for the first,
        then finds its row. The insert id is 0 when a row was there."""
        core = self.core
        at = core.now()
        names = []
        with core.reads.connect() as conn:
            for ask in sorted(asks, key=lambda ask: ask.resource):
                values = {
                    "resource": ask.resource,
                    "owner": None,
                    "token": None,
                    "fence": 0,
                    "acquired_at": at,
                    "expires_at": at,
                    "holder_limit": ask.limit,
                }
                if core.dialect == "postgresql":
                    inserted = conn.execute(
                        pg_insert(locks)
                        .values(**values)
                        .on_conflict_do_nothing(index_elements=["resource"])
                        .returning(locks.c.id)
                    ).first()
                    made = inserted is not None
                else:
                    upserted = conn.execute(
                        mysql_insert(locks)
                        .values(**values)
                        .on_duplicate_key_update(id=locks.c.id)
                    )
                    made = bool(upserted.lastrowid)
                if made:
                    names.append(ask.resource)
        return names

    def forget_rows(self, names: list[str]) -> None:
        """Delete the free rows a refused set made, unless a grant has used
        them since (one autocommit statement each): a refused set leaves
        nothing behind.

        Found by name, through the names' unique index, as every locking read
        of a lock's row finds it: its index entry is locked first, then the
        row. A delete by primary key locks them the other way round (the row,
        then the entry it marks deleted), and deadlocked on MariaDB with a set
        that had locked the entry and waited for the row. MariaDB is told the
        index: on a table of a few rows its optimizer picks another (the one
        on ``session_id``, which the conditions name too)."""
        if not names:
            return
        mariadb = self.core.dialect not in ("postgresql", "sqlite")
        with self.core.reads.connect() as conn:
            for name in names:
                if mariadb:
                    conn.execute(_FORGET_BY_NAME, {"resource": name})
                    continue
                conn.execute(
                    delete(locks).where(
                        locks.c.resource == name,
                        locks.c.owner.is_(None),
                        locks.c.fence == 0,
                        locks.c.places_until.is_(None),
                        locks.c.session_id.is_(None),
                    )
                )

    def _grant_all(
        self,
        conn,
        ordered: list[Ask],
        token: str | None,
        max_locks: int | None,
        session: str | None,
        places: dict[str, int] | None = None,
    ) -> dict[str, Outcome]:
        """The set's transaction (see the module's docstring for its order);
        ``places``: the set's places in line, one per member."""
        core = self.core
        tx = core.transactional
        given = core.given_now()
        by_name = {ask.resource: ask for ask in ordered}
        if session is not None:
            self._lock_session(conn, session, token, ordered[0].owner)
        rows = self._lock_rows(conn, [ask.resource for ask in ordered])
        inserts_here = core.dialect == "sqlite"  # one writer: no lock order
        if not inserts_here and len(rows) < len(ordered):
            raise _Missing([ask for ask in ordered if ask.resource not in rows])
        now = tx.clock_after_lock(conn, given).now
        for resource, row in rows.items():
            refusal = _refused_by_row(by_name[resource], row, now)
            if refusal is not None:
                raise _Refused(by_name[resource], refusal)
        if token is not None and token != NO_TOKEN:
            tx._token_row(conn, token, exclusive=bool(max_locks))
        # In the order their rows were locked, then those that had none.
        had_rows = [by_name[resource] for resource in rows]
        new_rows = [ask for ask in ordered if ask.resource not in rows]
        outcomes: dict[str, Outcome] = {}
        for ask in had_rows + new_rows:
            if ask.resource not in rows:
                freeze = tx.freeze_of(conn, ask.resource, now)
                if freeze is not None:
                    raise _Refused(ask, Outcome(False, None, None, now, freeze))
                tx._insert_free_row(conn, ask.resource, now, ask.limit)
            place = (places or {}).get(ask.resource)
            outcome = self._one_grant(conn, ask, now, session, place)
            if not outcome.done:
                raise _Refused(ask, outcome)
            outcomes[ask.resource] = outcome
        return outcomes

    def _lock_session(self, conn, session: str, token, owner) -> None:
        """A session-bound set's first lock: its session's row, shared (as a
        single grant bound to it takes it, before the resource's row; a
        heartbeat or the session's end takes it exclusive, then the rows).

        :raise UnknownSession, InvalidInput: not a session of this token, or
            of another owner (nothing written)."""
        found = self.core.session_statements.lock_session(conn, session, share=True)
        if found is None or found.token != (token or NO_TOKEN):
            raise UnknownSession(session)
        if found.owner != owner:
            raise InvalidInput(
                [("owner", f"must be the session's owner, {found.owner!r}")]
            )

    def _one_grant(
        self, conn, ask: Ask, now, session: str | None, place: int | None
    ) -> Outcome:
        """One member's grant, its row (and the token's) already locked: the
        holders path, which decides every mode. On PostgreSQL its one
        statement (``lockkeeper_acquire_place``) on the set's connection, in
        its transaction; elsewhere its transaction's statements. Bound to a
        session: the session-bound path's statements (every dialect's), as a
        single grant bound to it."""
        core = self.core
        if session is not None:
            try:
                return core.session_statements.acquire(conn, ask, session, now, place)
            except SessionNotFound:
                raise UnknownSession(session) from None
            except SessionEnded:
                raise SessionExpired(session) from None
        if core.statements.autocommit:
            return core.statements.acquire_holder(InTransaction(conn), ask, now, place)
        return core.transactional.acquire_holder(conn, ask, now, place)

    def _statements_on(self, conn) -> tuple[Any, Any]:
        """The statements a renewal or release of a set sends, and what they
        run on: PostgreSQL's one-statement functions on the set's connection
        (in its transaction), elsewhere the transactional statements."""
        core = self.core
        if core.statements.autocommit:
            return core.statements, InTransaction(conn)
        return core.transactional, conn

    def _lock_rows(self, conn, resources: list[str]) -> dict[str, Any]:
        """The members' rows that exist, locked in the lock order: the order
        of ``ORDER BY resource``, which every path that locks several rows
        takes (PostgreSQL: one statement, rows locked as sorted; MariaDB,
        whose names compare byte by byte: one row at a time, in that order,
        as a scan of another index could lock them in its own; SQLite: one
        writer at a time)."""
        if self.core.dialect == "postgresql":
            found = conn.execute(
                select(locks)
                .where(locks.c.resource.in_(resources))
                .order_by(locks.c.resource)
                .with_for_update()
            ).all()
            return {row.resource: row for row in found}
        rows = {}
        for resource in sorted(resources):
            row = conn.execute(
                select(locks).where(locks.c.resource == resource).with_for_update()
            ).one_or_none()
            if row is not None:
                rows[resource] = row
        return rows

    # -- renew and release ---------------------------------------------------------

    def renew(
        self,
        resources: Sequence[str],
        owner: str,
        ttl: float | None = None,
        actor: str | None = None,
        *,
        token: str | None = None,
    ) -> list[Lock]:
        """Extend every member's grant of (``token``, ``owner``) to now +
        ``ttl``, in one transaction, or none: the first member (in the lock
        order) not validly held raises as a single renewal of it would.

        :raise LockNotFound, LockExpired, NotOwner, SessionBound.
        """
        core = self.core
        core.validate(owner=owner, ttl=ttl, actor=actor)
        self.check_members([Member(r) for r in resources])
        seconds = core.ttl(ttl)

        def work(conn) -> dict[str, Outcome]:
            renewed = {}
            statements, on = self._statements_on(conn)
            if core.dialect == "postgresql":  # its functions' order
                lock_rows_in_order(conn, resources)
            for resource in sorted(resources):
                given = core.given_now()
                outcome = statements.renew(
                    on, resource, owner, token, seconds, actor, given
                )
                if not outcome.done and _not_exclusively_held(outcome):
                    holder_outcome = statements.renew_holder(
                        on,
                        resource,
                        owner,
                        token,
                        seconds,
                        actor,
                        core.given_now(),
                    )
                    outcome = holder_outcome if holder_outcome.done else outcome
                if not outcome.done:
                    ask = Ask(resource, owner, token, seconds, actor)
                    raise _Refused(ask, outcome)
                renewed[resource] = outcome
            return renewed

        def attempt() -> list[Lock]:
            try:
                with core.write_engine.connect() as conn, conn.begin():
                    renewed = work(conn)
            except _Refused as refused:
                raise self._renewal_refused(refused) from None
            return [core.lock(renewed[r].row, renewed[r].now) for r in resources]

        renewed = core.runner(attempt)
        for _ in renewed:
            core.metrics.renewal("renewed")
        return renewed

    def _renewal_refused(self, refused: _Refused) -> Exception:
        """Why a member's renewal was refused, as a single renewal says it."""
        resource, outcome = refused.ask.resource, refused.outcome
        row, now = outcome.row, outcome.now
        metrics = self.core.metrics
        if row is None or row.owner is None:
            metrics.renewal("not_found")
            return LockNotFound(resource)
        if row.expires_at <= now:
            metrics.renewal("expired", resource)
            return LockExpired(resource, refused.ask.owner)
        if not holds(row, refused.ask.owner, refused.ask.token):
            metrics.renewal("not_owner", resource)
            return NotOwner(resource, self.core.lock(row, now))
        # Valid and ours, yet refused: bound to a session (renewed by its
        # heartbeat only), or it changed under us.
        with self.core.reads.connect() as conn:
            bound = self.core.session_statements.session_of(conn, resource)
        if bound is not None:
            metrics.renewal("session_bound")
            return SessionBound(resource, bound.id)
        return Raced(f"renewal of {resource!r} in a set kept racing; try again")

    def release(
        self,
        resources: Sequence[str],
        owner: str,
        actor: str | None = None,
        *,
        token: str | None = None,
    ) -> SetRelease:
        """End every member still validly held by (``token``, ``owner``), in
        one transaction (PostgreSQL: one statement,
        ``lockkeeper_release_set``); the others are named
        (``SetRelease.not_held``)."""
        core = self.core
        core.validate(owner=owner, actor=actor)
        self.check_members([Member(r) for r in resources])
        ordered = sorted(resources)

        def one_statement(conn) -> dict[str, Outcome]:
            return core.statements.release_set(
                conn, ordered, owner, token, actor, core.given_now()
            )

        def work(conn) -> dict[str, Outcome]:
            released = {}
            statements, on = self._statements_on(conn)
            for resource in ordered:
                outcome = statements.release(
                    on, resource, owner, token, actor, core.given_now()
                )
                if not outcome.done and _not_exclusively_held(outcome):
                    outcome = statements.release_holder(
                        on, resource, owner, token, actor, core.given_now()
                    )
                if outcome.done:
                    released[resource] = outcome
            name_sets(conn, grants_of(released))
            return released

        if core.dialect == "postgresql":
            released = core.run(one_statement, autocommit=True)
        else:
            released = core.run(work)
        ended = []
        for resource in resources:
            outcome = released.get(resource)
            if outcome is None:
                core.metrics.release("not_found")
                continue
            lock = core.lock(outcome.row, outcome.now)
            core.metrics.release("released", resource, held_for(lock, outcome.now))
            self._notify(resource, getattr(outcome.row, "waiters", 0) or 0)
            ended.append(lock)
        return SetRelease(ended, [r for r in resources if r not in released])

    # -- a set by its id: the dashboard's view and the operator's release -------

    def view(self, set_id: str) -> SetView | None:
        """The set's members (from their grant events, in the lock order),
        each with whether its grant is still held as the set's, and its
        newest events; None when no event names it (never acquired, or
        purged).

        :raise InvalidInput: not a set id."""
        check_set_id(set_id)
        core = self.core
        now = core.now()
        with core.reads.connect() as conn:
            granted = grant_events(conn, set_id)
            if not granted:
                return None
            grants = [(row.resource, row.fence) for row in granted]
            current = current_grants(conn, grants, now)
            held = set(sets_of(conn, _at(current)).get(set_id, ()))
            shown = conn.execute(
                select(events)
                .where(events.c.set_id == set_id)
                .order_by(events.c.id.desc())
                .limit(SET_EVENTS_SHOWN)
            ).all()
        return SetView(
            set_id,
            [
                SetMember(
                    row.resource,
                    row.fence,
                    row.owner,
                    row.token,
                    row.mode,
                    row.acquired_at,
                    (row.resource, row.fence) in held,
                )
                for row in granted
            ],
            [Event.from_row(row) for row in shown],
        )

    def of_grants(self, grants: Sequence[tuple[str, int, Any]]) -> dict[tuple, str]:
        """The set each (resource, fence, acquired_at) grant was made by, by
        (resource, fence), for those made by one (a lock page's holders)."""
        if not grants:
            return {}
        with self.core.reads.connect() as conn:
            found = sets_of(conn, grants)
        return {grant: set_id for set_id, named in found.items() for grant in named}

    def force_release(
        self, set_id: str, *, actor: str, reason: str | None
    ) -> SetForceRelease | None:
        """An operator ends every grant still held as the set's, whoever holds
        it, stale or not, in one transaction: the members' rows in the lock
        order (as a set's acquire takes them), each grant by its fence (a
        grant that came since, with another fence, is left alone), one
        ``force_released`` event each, naming the set. A member whose grant
        ended, or was acquired again on its own, is named in ``not_held``.

        None: no event names the set (never acquired, or purged).

        :raise InvalidInput: no reason, or not a set id."""
        check_set_id(set_id)
        core = self.core
        core.validate(actor=actor, reason=reason)
        rules.require_reason(reason, "to force-release a set")
        statements = core.transactional

        def work(conn):
            granted = grant_events(conn, set_id)
            if not granted:
                return None
            grants = sorted((row.resource, row.fence) for row in granted)
            current = current_grants(conn, grants, core.now(), stale_rows=True)
            mine = set(sets_of(conn, _at(current)).get(set_id, ()))
            if mine and core.dialect == "postgresql":  # its functions' order
                lock_rows_in_order(conn, [resource for resource, _ in mine])
            ended, now, waiters = [], None, {}
            for resource, fence in grants:
                if (resource, fence) not in mine:
                    continue
                done = statements.force_remove_all(
                    conn, resource, [fence], actor, reason, core.given_now()
                )
                now = done.now
                if done.released:
                    ended.extend(done.released)
                    waiters[resource] = done.waiters
            name_sets(conn, [(g.resource, g.fence, None, set_id) for g in ended])
            return grants, ended, now, waiters

        found = core.run(work)
        if found is None:
            return None
        grants, ended, now, waiters = found
        released = [core.lock(grant, now) for grant in ended]
        for lock in released:
            core.metrics.operator_action(Action.FORCE_RELEASED)
            self._notify(lock.resource, waiters.get(lock.resource, 0))
        gone = {lock.resource for lock in released}
        return SetForceRelease(
            released, [resource for resource, _ in grants if resource not in gone]
        )


def _at(current: dict[tuple[str, int], Any]) -> list[tuple[str, int, Any]]:
    """``current_grants``' answer as (resource, fence, acquired_at)."""
    return [(resource, fence, at) for (resource, fence), at in current.items()]


def _refused_by_row(ask: Ask, row, now) -> Outcome | None:
    """The refusal a member's locked row shows before anything is written:
    another holder's exclusive grant is live (a grant of another limit is
    left to the member's grant, which names the mismatch; so is the line)."""
    live = row.owner is not None and row.expires_at > now
    if (
        live
        and not holds(row, ask.owner, ask.token)
        and (row.holder_limit or 1) == ask.limit
    ):
        return Outcome(False, None, row, now)
    return None


def _not_exclusively_held(outcome: Outcome) -> bool:
    """A refused exclusive renewal or release whose row carries no live
    exclusive grant: the caller's holder, if any, is asked next."""
    row = outcome.row
    return row is not None and (row.owner is None or row.expires_at <= outcome.now)
