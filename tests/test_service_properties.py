"""LockService against a model, driven by Hypothesis, on a fake clock.

A rule-based state machine runs any sequence of acquire / renew / release / get /
force-release / claim / purge / clock moves, with valid and hostile input (NUL
bytes, huge strings, odd Unicode, numbers at the float limits, wrong types), on
every database. After every step the database must equal the model: the same rows,
the same number of audit events, fences only ever growing, and a rejected request
must have changed nothing at all.

A second machine does the same for more than one holder: acquires of any limit
and mode on a few resources (semaphore holders, shared grants, exclusive locks,
their promotions and demotions), renewals and releases of a holder, expiry by the
fake clock. After every step no more than ``limit`` grants are live, an exclusive
grant has no one beside it, every new grant's fence exceeds every earlier one, a
re-acquire keeps its fence, and the service's holders equal the model's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from lockkeeper_core.errors import (
    InvalidInput,
    LimitMismatch,
    LockExpired,
    LockHeld,
    LockNotFound,
    NotOwner,
    QuotaExceeded,
)
from lockkeeper_core.models import (
    EXCLUSIVE,
    NO_TOKEN,
    SHARED,
    DistributedLock,
    LockEvent,
    LockHolder,
)
from lockkeeper_core.pagination import encode_cursor
from lockkeeper_core.state import Action, LockState, classify
from lockkeeper_core.validation import MAX_HOLDER_LIMIT, MIN_TTL
from sqlalchemy import delete, func, select

from app.auth.service import create_token
from app.extensions import db, lock_service
from tests.clock import FakeClock

pytestmark = pytest.mark.usefixtures("backend")

START = FakeClock().now()
MAX_TTL = 86400.0
DEFAULT_TTL = 30.0
EXPIRING_WITHIN = 15.0
# Server databases cost a round trip per statement; SQLite explores more.
# The whole-model checker (test_whole_model.py) holds every kind of grant at once;
# these two machines go deeper into the exclusive lock and into holders alone.
EXAMPLES = {"sqlite": 30, "postgresql": 12, "mariadb": 12}

# Few names, so that steps collide on the same lock. Owners differ only by case,
# a trailing space, combining marks or astral characters: each is its own owner.
RESOURCES = ["job:42", "Job:42", "a", "r.e_s:o@u=r+c-e", "x" * 255]
OWNERS = ["w-1", "W-1", "w-1 ", "ünïcødé", "e\u0301", "👾 worker", "שלום", "y" * 255]
# The holder is (token, owner). None: a caller with no token, which holds only
# locks with no token recorded (as granted before tokens were recorded).
TOKENS = [None, "t-1", "t-2"]
QUOTAS = st.sampled_from([None, None, 1, 2])

BAD_RESOURCES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "job:42\x00",
            "\x00",
            "job 42",
            "jöb:42",
            "job/42",
            "job:42\n",
            "\u202ejob",
            "x" * 256,
            None,
            42,
            b"job:42",
        ]
    ),
    st.text(min_size=256, max_size=5000),
    st.text(max_size=20).map(lambda s: s + "\x00"),
)
BAD_NAMES = st.one_of(
    st.sampled_from(
        ["", "w\x00", "\x00", "\x7f", "w\n", "\t", "\u0085", "\u2028", "z" * 256]
    ),
    st.just(None),
    st.integers(),
    st.binary(max_size=10),
    st.text(min_size=256, max_size=5000),
    st.text(max_size=20).map(lambda s: "\x00" + s),
)
BAD_TTLS = st.one_of(
    st.sampled_from(
        [
            0,
            0.0,
            -0.0,
            -1,
            -sys.float_info.max,
            float("inf"),
            float("-inf"),
            float("nan"),
            MAX_TTL + 1e-6,
            sys.float_info.max,
            # Shorter than a microsecond timestamp can hold: stale when granted.
            5e-324,
            sys.float_info.min,
            MIN_TTL / 2,
            10**400,
            -(10**400),
            True,
            False,
            "30",
            [30],
        ]
    ),
    st.floats(max_value=0.0),
    st.floats(min_value=MAX_TTL, exclude_min=True),
)
GOOD_TTLS = st.one_of(
    st.none(),
    st.sampled_from([MAX_TTL, 86400, 1, MIN_TTL, 30]),
    st.floats(min_value=MIN_TTL, max_value=120.0),
    st.floats(min_value=MIN_TTL, max_value=MAX_TTL),
)
ADVANCES = st.one_of(
    st.sampled_from([0.0, 0.001, 1.0, 15.0, 30.0, 120.0]),
    st.floats(min_value=0.0, max_value=200.0),
)
ACTORS = st.sampled_from(["op:alice", "cli:root", "Ω-operator"])
# An operator action always names its actor: None is no actor at all.
BAD_ACTORS = BAD_NAMES.filter(lambda value: value is not None)
# Cursors that decode, but to positions no page ever handed out.
FORGED_CURSORS = st.sampled_from(
    [
        encode_cursor({}),
        encode_cursor({"resource": 5}),
        encode_cursor({"resource": None}),
        encode_cursor({"resource": ["a"]}),
        encode_cursor({"resource": "job\x00"}),
        encode_cursor({"resource": "x" * 5000}),
    ]
)


@dataclass
class Row:
    owner: str
    fence: int
    acquired_at: datetime
    expires_at: datetime
    token: str | None = None
    # The ttl it was last granted or renewed for, as stored (its expiry less
    # the instant of that grant): what its state is judged against.
    ttl: float = 0.0

    def held_by(self, owner, token) -> bool:
        return self.owner == owner and (self.token is None or self.token == token)

    def shown(self) -> tuple:
        """What a Lock shows of the row (no token and NO_TOKEN both as None)."""
        return (
            self.owner,
            self.token or None,
            self.fence,
            self.acquired_at,
            self.expires_at,
        )


class ServiceMachine(RuleBasedStateMachine):
    """The model: a dict of rows, the event count, the highest fence handed out."""

    service = None  # set by the test before running
    clock: FakeClock = None

    def __init__(self):
        super().__init__()
        with db.engine.begin() as conn:
            conn.execute(delete(LockEvent))
            conn.execute(delete(DistributedLock))
        self.clock.current = START
        self.rows: dict[str, Row] = {}
        self.events = 0
        self.highest_fence = 0

    # -- helpers -----------------------------------------------------------

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def _valid(self, resource: str) -> Row | None:
        row = self.rows.get(resource)
        return row if row is not None and row.expires_at > self.now else None

    def _check_expiry(self, got: datetime, ttl) -> None:
        # The database rounds ``now + ttl`` to the microsecond its own way (PostgreSQL
        # adds an interval); from then on the model uses the stored value exactly.
        expected = self.now + timedelta(seconds=DEFAULT_TTL if ttl is None else ttl)
        assert abs(got - expected) <= timedelta(microseconds=1), (got, expected)

    def _granted(
        self, resource, lock, owner, ttl, *, new_fence: bool, token=None
    ) -> None:
        assert (lock.resource, lock.owner) == (resource, owner)
        assert lock.token == (token or None)
        assert lock.acquired_at == self.now
        self._check_expiry(lock.expires_at, ttl)
        if new_fence:
            assert lock.fence > self.highest_fence
            self.highest_fence = lock.fence
        else:
            assert lock.fence == self.rows[resource].fence
        self.rows[resource] = Row(
            owner,
            lock.fence,
            lock.acquired_at,
            lock.expires_at,
            token,
            (lock.expires_at - self.now).total_seconds(),
        )
        self.events += 1

    def _last_event(self):
        with db.engine.connect() as conn:
            return conn.execute(
                select(LockEvent.__table__).order_by(LockEvent.id.desc()).limit(1)
            ).one()

    def _snapshot(self):
        with db.engine.connect() as conn:
            rows = conn.execute(
                select(DistributedLock.__table__).order_by(DistributedLock.resource)
            ).all()
            events = conn.execute(
                select(func.count(), func.max(LockEvent.id)).select_from(LockEvent)
            ).one()
        return [tuple(r) for r in rows], tuple(events)

    def _rejected(self, call, field: str) -> None:
        before = self._snapshot()
        with pytest.raises(InvalidInput) as refused:
            call()
        assert field in [f for f, _ in refused.value.errors]
        assert self._snapshot() == before

    # -- the worker's operations ---------------------------------------------

    def _live_locks_of(self, token) -> int:
        return sum(
            1
            for row in self.rows.values()
            if row.token == token and row.expires_at > self.now
        )

    @rule(
        resource=st.sampled_from(RESOURCES),
        owner=st.sampled_from(OWNERS),
        token=st.sampled_from(TOKENS),
        ttl=GOOD_TTLS,
        max_locks=QUOTAS,
    )
    def acquire(self, resource, owner, token, ttl, max_locks):
        held = self._valid(resource)
        call = lambda: self.service.acquire(  # noqa: E731
            resource, owner, ttl=ttl, actor="api:test", token=token, max_locks=max_locks
        )
        if held is not None and not held.held_by(owner, token):
            result = call()
            assert not result.acquired
            assert (result.lock.owner, result.lock.fence) == (held.owner, held.fence)
            return
        if (
            held is None
            and token is not None
            and max_locks
            and self._live_locks_of(token) >= max_locks
        ):
            before = self._snapshot()
            with pytest.raises(QuotaExceeded):
                call()
            assert self._snapshot() == before
            return
        result = call()
        assert result.acquired
        if held is not None:
            assert result.action is Action.REACQUIRED
        elif resource in self.rows:
            assert result.action is Action.TOOK_OVER
        else:
            assert result.action is Action.ACQUIRED
        self._granted(
            resource,
            result.lock,
            owner,
            ttl,
            new_fence=result.action != "reacquired",
            token=token,
        )
        event = self._last_event()
        assert (event.action, event.owner, event.fence, event.token) == (
            result.action.value,
            owner,
            result.lock.fence,
            token,
        )

    @rule(
        resource=st.sampled_from(RESOURCES),
        owner=st.sampled_from(OWNERS),
        token=st.sampled_from(TOKENS),
        ttl=GOOD_TTLS,
    )
    def renew(self, resource, owner, token, ttl):
        row = self.rows.get(resource)
        if row is None:
            with pytest.raises(LockNotFound):
                self.service.renew(resource, owner, ttl=ttl, token=token)
        elif row.expires_at <= self.now:
            with pytest.raises(LockExpired):
                self.service.renew(resource, owner, ttl=ttl, token=token)
        elif not row.held_by(owner, token):
            with pytest.raises(NotOwner):
                self.service.renew(resource, owner, ttl=ttl, token=token)
        else:
            lock = self.service.renew(resource, owner, ttl=ttl, token=token)
            assert (lock.fence, lock.acquired_at) == (row.fence, row.acquired_at)
            self._check_expiry(lock.expires_at, ttl)
            row.expires_at = lock.expires_at
            row.ttl = (lock.expires_at - self.now).total_seconds()
            self.events += 1
            assert self._last_event().action == "renewed"

    @rule(
        resource=st.sampled_from(RESOURCES),
        owner=st.sampled_from(OWNERS),
        token=st.sampled_from(TOKENS),
    )
    def release(self, resource, owner, token):
        held = self._valid(resource)
        if held is None:
            with pytest.raises(LockNotFound):
                self.service.release(resource, owner, token=token)
        elif not held.held_by(owner, token):
            with pytest.raises(NotOwner):
                self.service.release(resource, owner, token=token)
        else:
            lock = self.service.release(resource, owner, token=token)
            assert lock.fence == held.fence
            del self.rows[resource]
            self.events += 1
            assert self._last_event().action == "released"

    @rule(resource=st.sampled_from(RESOURCES), include_stale=st.booleans())
    def get(self, resource, include_stale):
        row = self.rows.get(resource) if include_stale else self._valid(resource)
        if row is None:
            with pytest.raises(LockNotFound):
                self.service.get(resource, include_stale=include_stale)
            return
        lock = self.service.get(resource, include_stale=include_stale)
        assert (lock.owner, lock.token, lock.fence, lock.expires_at) == (
            row.owner,
            row.token or None,
            row.fence,
            row.expires_at,
        )
        remaining = (row.expires_at - self.now).total_seconds()
        assert lock.state is classify(remaining, EXPIRING_WITHIN, row.ttl)
        assert lock.ttl_remaining == pytest.approx(max(remaining, 0.0))

    # -- the operator's actions ----------------------------------------------

    @rule(resource=st.sampled_from(RESOURCES), actor=ACTORS)
    def force_release(self, resource, actor):
        row = self.rows.get(resource)
        if row is None:
            with pytest.raises(LockNotFound):
                self.service.force_release(resource, actor=actor, reason="stuck")
            return
        lock = self.service.force_release(resource, actor=actor, reason="stuck")
        assert (lock.owner, lock.fence) == (row.owner, row.fence)
        del self.rows[resource]
        self.events += 1
        event = self._last_event()
        assert (event.action, event.actor) == ("force_released", actor)

    @rule(
        resource=st.sampled_from(RESOURCES),
        owner=st.sampled_from(OWNERS),
        ttl=GOOD_TTLS,
        force=st.booleans(),
        actor=ACTORS,
        for_token=st.sampled_from([None, "t-1"]),
    )
    def claim(self, resource, owner, ttl, force, actor, for_token):
        held = self._valid(resource)
        token = NO_TOKEN if for_token is None else for_token
        held_by_other = held is not None and (held.owner, held.token) != (owner, token)
        if held_by_other and not force:
            with pytest.raises(LockHeld) as refused:
                self.service.claim(
                    resource, owner, ttl, actor=actor, force=False, for_token=for_token
                )
            assert refused.value.holder.fence == held.fence
            return
        lock = self.service.claim(
            resource,
            owner,
            ttl,
            actor=actor,
            reason="stuck",
            force=force,
            for_token=for_token,
        )
        self._granted(resource, lock, owner, ttl, new_fence=True, token=token)
        expected = Action.FORCE_CLAIMED if held_by_other else Action.CLAIMED
        assert self._last_event().action == expected.value

    @rule(days=st.sampled_from([0, 1]), seconds=st.sampled_from([0, 10, 60]))
    def purge_stale(self, days, seconds):
        older_than = timedelta(days=days, seconds=seconds)
        if older_than < timedelta(minutes=1):
            self._rejected(lambda: self.service.purge_stale(older_than), "older_than")
            return
        cutoff = self.now - older_than
        expected = sorted(r for r, row in self.rows.items() if row.expires_at <= cutoff)
        assert sorted(self.service.purge_stale(older_than)) == expected
        for resource in expected:
            del self.rows[resource]

    @rule(seconds=ADVANCES)
    def advance_clock(self, seconds):
        self.clock.advance(seconds)

    @rule(resource=st.sampled_from(RESOURCES), seconds=st.sampled_from([0, 1e-6]))
    def advance_to_expiry(self, resource, seconds):
        """Land exactly on (or a microsecond past) an expiry: the boundary case."""
        row = self.rows.get(resource)
        if row is not None and row.expires_at >= self.now:
            self.clock.current = row.expires_at + timedelta(seconds=seconds)

    # -- hostile input: refused, and nothing changes ---------------------------

    @rule(resource=BAD_RESOURCES, owner=st.sampled_from(OWNERS))
    def acquire_bad_resource(self, resource, owner):
        self._rejected(lambda: self.service.acquire(resource, owner), "resource")

    @rule(resource=st.sampled_from(RESOURCES), owner=BAD_NAMES)
    def acquire_bad_owner(self, resource, owner):
        self._rejected(lambda: self.service.acquire(resource, owner), "owner")

    @rule(
        resource=st.sampled_from(RESOURCES), owner=st.sampled_from(OWNERS), ttl=BAD_TTLS
    )
    def acquire_or_renew_bad_ttl(self, resource, owner, ttl):
        self._rejected(lambda: self.service.acquire(resource, owner, ttl=ttl), "ttl")
        self._rejected(lambda: self.service.renew(resource, owner, ttl=ttl), "ttl")
        self._rejected(
            lambda: self.service.claim(resource, owner, ttl, actor="op"), "ttl"
        )

    @rule(resource=BAD_RESOURCES, owner=BAD_NAMES)
    def release_bad_input(self, resource, owner):
        self._rejected(lambda: self.service.release(resource, owner), "resource")
        self._rejected(lambda: self.service.renew(resource, owner), "owner")

    @rule(resource=st.sampled_from(RESOURCES), actor=BAD_ACTORS)
    def operator_action_with_bad_actor(self, resource, actor):
        self._rejected(
            lambda: self.service.force_release(resource, actor=actor), "actor"
        )
        self._rejected(lambda: self.service.claim(resource, "w", actor=actor), "actor")

    @rule(
        resource=st.sampled_from(RESOURCES),
        reason=st.one_of(
            st.text(min_size=1001, max_size=3000),
            st.sampled_from(["stuck\x00", "\x1b[31mred", 7]),
        ),
    )
    def operator_action_with_bad_reason(self, resource, reason):
        self._rejected(
            lambda: self.service.force_release(resource, actor="op", reason=reason),
            "reason",
        )

    @rule(
        prefix=st.one_of(st.text(min_size=256, max_size=600), st.just("job\x00")),
        owner=BAD_NAMES,
        limit=st.sampled_from([0, -1, 501, 10**400, 1.5, True, "10", None]),
        cursor=st.one_of(st.text(max_size=40), FORGED_CURSORS, st.just("x" * 2000)),
    )
    def list_with_bad_filters(self, prefix, owner, limit, cursor):
        with pytest.raises(InvalidInput):
            self.service.list_locks(prefix=prefix)
        if owner is not None:
            with pytest.raises(InvalidInput):
                self.service.list_locks(owner=owner)
        with pytest.raises(InvalidInput):
            self.service.list_locks(limit=limit)
        try:
            page = self.service.list_locks(cursor=cursor)
        except InvalidInput:
            pass
        else:
            # A cursor that decodes is a position; it must never invent rows.
            assert {lock.resource for lock in page.items} <= set(self.rows)

    # -- after every step ----------------------------------------------------

    @invariant()
    def database_equals_model(self):
        page = self.service.list_locks(limit=500)
        assert page.next_cursor is None
        got = {
            lock.resource: (
                lock.owner,
                lock.token,
                lock.fence,
                lock.acquired_at,
                lock.expires_at,
            )
            for lock in page.items
        }
        assert got == {resource: row.shown() for resource, row in self.rows.items()}
        for lock in page.items:
            remaining = (lock.expires_at - self.now).total_seconds()
            ttl = self.rows[lock.resource].ttl
            assert lock.state is classify(remaining, EXPIRING_WITHIN, ttl)

    @invariant()
    def every_change_has_one_event(self):
        with db.engine.connect() as conn:
            count = conn.scalar(select(func.count()).select_from(LockEvent))
        assert count == self.events

    @invariant()
    def counts_and_owner_filter_agree_with_model(self):
        expected = dict.fromkeys(LockState, 0)
        for row in self.rows.values():
            remaining = (row.expires_at - self.now).total_seconds()
            expected[classify(remaining, EXPIRING_WITHIN, row.ttl)] += 1
        assert self.service.counts() == expected
        for owner in {row.owner for row in self.rows.values()}:
            listed = self.service.list_locks(owner=owner, limit=500).items
            assert sorted(lock.resource for lock in listed) == sorted(
                r for r, row in self.rows.items() if row.owner == owner
            )


@pytest.mark.slow
def test_service_matches_its_model_under_any_sequence(backend, make_app):
    clock = FakeClock()
    app = make_app(
        LOCKKEEPER_CLOCK=clock,
        LOCKKEEPER_MAX_TTL=MAX_TTL,
        LOCKKEEPER_EXPIRING_WITHIN=EXPIRING_WITHIN,
    )
    with app.app_context():
        for token in TOKENS:
            if token is not None:
                create_token(token)
        ServiceMachine.service = lock_service()
        ServiceMachine.clock = clock
        run_state_machine_as_test(
            ServiceMachine,
            settings=settings(
                max_examples=EXAMPLES[backend],
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


# -- more than one holder: semaphores and shared grants ------------------------

# Each resource has the kinds it is mostly asked as, (limit, mode): its
# semaphore holders fill, its readers share. Now and then any kind is asked of
# any resource, so that kinds collide: another limit (a mismatch), shared
# against exclusive (a promotion, a demotion), an exclusive lock against holders.
NATURAL_KINDS = {
    "sem:2": [(2, EXCLUSIVE)],
    "sem:3": [(3, EXCLUSIVE)],
    "rw:a": [(1, SHARED), (1, SHARED), (1, EXCLUSIVE)],
}
HOLDER_RESOURCES = list(NATURAL_KINDS)
# Each step reads every resource's holders and both tables: fewer sequences on
# the server databases, which cost a round trip per statement.
HOLDER_EXAMPLES = {"sqlite": 25, "postgresql": 8, "mariadb": 8}
HOLDER_OWNERS = ["h-1", "h-2", "h-3", "h-4"]
# Two real tokens: a holder is (token, owner) exactly, on the row and in holders.
HOLDER_TOKENS = ["t-1", "t-2"]
HOLDER_TTLS = st.sampled_from([0.5, 5.0, 30.0, 30.0])
HOLDER_ADVANCES = st.sampled_from([0.25, 1.0, 5.0, 31.0])
ANY_KIND = st.sampled_from(
    [(1, EXCLUSIVE), (1, SHARED), (2, EXCLUSIVE), (3, EXCLUSIVE)]
)
# None: one of the resource's natural kinds (``pick``), most of the time.
KINDS = st.one_of(
    st.tuples(st.none(), st.integers(0, 2)), st.tuples(ANY_KIND, st.just(0))
)
BAD_KINDS = st.sampled_from(
    [
        (2, SHARED),
        (0, EXCLUSIVE),
        (-1, EXCLUSIVE),
        (MAX_HOLDER_LIMIT + 1, EXCLUSIVE),
        (True, EXCLUSIVE),
        (1.5, EXCLUSIVE),
        ("2", EXCLUSIVE),
        (None, EXCLUSIVE),
        (1, "read"),
        (1, None),
        (1, "SHARED"),
    ]
)


@dataclass
class Grant:
    """One grant of the model: an exclusive lock, a semaphore holder or a shared
    grant, as the service must show it."""

    owner: str
    token: str
    mode: str
    fence: int
    acquired_at: datetime
    expires_at: datetime

    def shown(self) -> tuple:
        return (self.owner, self.token, self.mode, self.fence, self.expires_at)


class HoldersMachine(RuleBasedStateMachine):
    """The model: per resource, its grants by holder (live and expired, until
    released) and the limit of its live grants; the event count; the highest
    fence handed out. After every step, no more than ``limit`` live grants, an
    exclusive grant (limit 1) with no one beside it, shared grants with no
    exclusive one, and the service's holders equal to the model's."""

    service = None  # set by the test before running
    clock: FakeClock = None
    # Across all examples, the most live grants seen at once per kind ("shared",
    # "limit 3"): the test checks the sequences did fill holders.
    most_seen: dict[str, int] = {}

    def __init__(self):
        super().__init__()
        with db.engine.begin() as conn:
            conn.execute(delete(LockEvent))
            conn.execute(delete(LockHolder))
            conn.execute(delete(DistributedLock))
        self.clock.current = START
        self.grants: dict[str, dict[tuple[str, str], Grant]] = {
            resource: {} for resource in HOLDER_RESOURCES
        }
        self.limits: dict[str, int] = {}
        self.events = 0
        self.highest_fence = 0

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def _live(self, resource: str) -> list[Grant]:
        return [g for g in self.grants[resource].values() if g.expires_at > self.now]

    def _snapshot(self):
        with db.engine.connect() as conn:
            tables = [
                sorted(tuple(r) for r in conn.execute(select(table.__table__)).all())
                for table in (DistributedLock, LockHolder)
            ]
            events = conn.execute(
                select(func.count(), func.max(LockEvent.id)).select_from(LockEvent)
            ).one()
        return tables, tuple(events)

    def _last_event(self):
        with db.engine.connect() as conn:
            return conn.execute(
                select(LockEvent.__table__).order_by(LockEvent.id.desc()).limit(1)
            ).one()

    def _expected(self, resource, holder, limit, mode):
        """What the service must answer: ("mismatch", limit in force),
        ("refused", None), ("reacquired", the grant kept) or ("new", None)."""
        live = self._live(resource)
        mine = next((g for g in live if (g.token, g.owner) == holder), None)
        if live and self.limits[resource] != limit:
            return "mismatch", self.limits[resource]
        if mine is not None and (mine.mode == SHARED) == (mode == SHARED):
            return "reacquired", mine
        if mine is not None and mode == SHARED:
            return "reacquired", mine  # exclusive -> shared: the fence stays
        if mine is not None:
            # shared -> exclusive: as the sole holder only, with a new fence.
            return ("new", None) if len(live) == 1 else ("refused", None)
        if mode == SHARED:
            exclusive = any(g.mode == EXCLUSIVE for g in live)
            return ("refused", None) if exclusive else ("new", None)
        return ("refused", None) if len(live) >= limit else ("new", None)

    @rule(
        resource=st.sampled_from(HOLDER_RESOURCES),
        owner=st.sampled_from(HOLDER_OWNERS),
        token=st.sampled_from(HOLDER_TOKENS),
        ttl=HOLDER_TTLS,
        kind=KINDS,
    )
    def acquire(self, resource, owner, token, ttl, kind):
        asked, pick = kind
        natural = NATURAL_KINDS[resource]
        limit, mode = asked or natural[pick % len(natural)]
        self._acquire(resource, owner, token, ttl, limit, mode)

    @rule(
        resource=st.sampled_from(HOLDER_RESOURCES),
        token=st.sampled_from(HOLDER_TOKENS),
        ttl=HOLDER_TTLS,
    )
    def crowd(self, resource, token, ttl):
        """Every owner asks in turn, as the resource's first kind: a full
        semaphore, its refusals, readers side by side; sequences of single
        acquires reach them too seldom."""
        limit, mode = NATURAL_KINDS[resource][0]
        for owner in HOLDER_OWNERS:
            self._acquire(resource, owner, token, ttl, limit, mode)

    def _acquire(self, resource, owner, token, ttl, limit, mode):
        holder = (token, owner)
        expected, detail = self._expected(resource, holder, limit, mode)
        before = self._snapshot()
        call = lambda: self.service.acquire(  # noqa: E731
            resource, owner, ttl=ttl, token=token, limit=limit, mode=mode
        )
        if expected == "mismatch":
            with pytest.raises(LimitMismatch) as refused:
                call()
            assert refused.value.limit == detail
            assert self._snapshot() == before
            return
        result = call()
        if expected == "refused":
            assert not result.acquired
            # The refusal names the live grant that ends first, of those in the
            # way (a refused promotion: not the caller's own shared grant).
            first = min(
                g.expires_at
                for g in self._live(resource)
                if (g.token, g.owner) != holder
            )
            assert result.lock.expires_at == first
            assert self._snapshot() == before
            return
        assert result.acquired, (expected, result)
        lock = result.lock
        assert (lock.owner, lock.token, lock.mode) == (owner, token, mode)
        assert lock.acquired_at == self.now
        expected_expiry = self.now + timedelta(seconds=ttl)
        assert abs(lock.expires_at - expected_expiry) <= timedelta(microseconds=1)
        if expected == "reacquired":
            assert result.action is Action.REACQUIRED
            assert lock.fence == detail.fence
        else:
            assert result.action in (Action.ACQUIRED, Action.TOOK_OVER)
            if result.action is Action.TOOK_OVER:
                # Taken over from an expired grant, never from nothing.
                assert any(
                    g.expires_at <= self.now for g in self.grants[resource].values()
                )
            assert lock.fence > self.highest_fence
            self.highest_fence = lock.fence
        if not self._live(resource):
            self.limits[resource] = limit
        # A promotion or a demotion replaces the holder's own grant: no other
        # is live (expired ones stay in the model: taken over later, or not).
        self.grants[resource][holder] = Grant(
            owner, token, mode, lock.fence, lock.acquired_at, lock.expires_at
        )
        self.events += 1
        event = self._last_event()
        assert (event.action, event.owner, event.fence, event.mode) == (
            result.action.value,
            owner,
            lock.fence,
            mode,
        )

    @rule(
        resource=st.sampled_from(HOLDER_RESOURCES),
        owner=st.sampled_from(HOLDER_OWNERS),
        token=st.sampled_from(HOLDER_TOKENS),
        kind=BAD_KINDS,
    )
    def acquire_bad_kind(self, resource, owner, token, kind):
        limit, mode = kind
        before = self._snapshot()
        with pytest.raises(InvalidInput) as refused:
            self.service.acquire(
                resource, owner, ttl=5, token=token, limit=limit, mode=mode
            )
        assert {f for f, _ in refused.value.errors} <= {"limit", "mode"}
        assert self._snapshot() == before

    def _mine(self, resource, owner, token) -> Grant | None:
        return next(
            (g for g in self._live(resource) if (g.token, g.owner) == (token, owner)),
            None,
        )

    @rule(
        resource=st.sampled_from(HOLDER_RESOURCES),
        owner=st.sampled_from(HOLDER_OWNERS),
        token=st.sampled_from(HOLDER_TOKENS),
        ttl=HOLDER_TTLS,
    )
    def renew(self, resource, owner, token, ttl):
        mine = self._mine(resource, owner, token)
        if mine is None:
            before = self._snapshot()
            with pytest.raises((LockNotFound, LockExpired, NotOwner)):
                self.service.renew(resource, owner, ttl=ttl, token=token)
            assert self._snapshot() == before
            return
        lock = self.service.renew(resource, owner, ttl=ttl, token=token)
        assert (lock.fence, lock.mode, lock.acquired_at) == (
            mine.fence,
            mine.mode,
            mine.acquired_at,
        )
        expected_expiry = self.now + timedelta(seconds=ttl)
        assert abs(lock.expires_at - expected_expiry) <= timedelta(microseconds=1)
        mine.expires_at = lock.expires_at
        self.events += 1
        assert self._last_event().action == "renewed"

    @rule(
        resource=st.sampled_from(HOLDER_RESOURCES),
        owner=st.sampled_from(HOLDER_OWNERS),
        token=st.sampled_from(HOLDER_TOKENS),
    )
    def release(self, resource, owner, token):
        mine = self._mine(resource, owner, token)
        if mine is None:
            before = self._snapshot()
            with pytest.raises((LockNotFound, NotOwner)):
                self.service.release(resource, owner, token=token)
            assert self._snapshot() == before
            return
        lock = self.service.release(resource, owner, token=token)
        assert lock.fence == mine.fence
        del self.grants[resource][(token, owner)]
        self.events += 1
        event = self._last_event()
        assert (event.action, event.fence, event.mode) == (
            "released",
            mine.fence,
            mine.mode,
        )

    @rule(seconds=HOLDER_ADVANCES)
    def advance_clock(self, seconds):
        self.clock.advance(seconds)

    @rule(
        resource=st.sampled_from(HOLDER_RESOURCES), seconds=st.sampled_from([0, 1e-6])
    )
    def advance_to_expiry(self, resource, seconds):
        """Land exactly on (or a microsecond past) the soonest live expiry."""
        live = self._live(resource)
        if live:
            soonest = min(g.expires_at for g in live)
            self.clock.current = soonest + timedelta(seconds=seconds)

    @invariant()
    def holders_equal_model_and_keep_the_rules(self):
        for resource in HOLDER_RESOURCES:
            found = self.service.holders(resource)
            got = sorted(
                (g.owner, g.token, g.mode, g.fence, g.expires_at) for g in found.holders
            )
            live = self._live(resource)
            assert got == sorted(g.shown() for g in live), resource
            if not live:
                continue
            limit = self.limits[resource]
            assert found.limit == limit
            # The rules themselves, on what the database answered: exclusive
            # grants (a semaphore's holders) no more than the limit, shared ones
            # (limit 1, any number) never beside an exclusive one.
            modes = {g.mode for g in found.holders}
            assert len(modes) == 1, f"shared and exclusive together: {found}"
            if modes == {EXCLUSIVE}:
                assert len(found.holders) <= limit
            else:
                assert limit == 1
            fences = [g.fence for g in found.holders]
            assert len(set(fences)) == len(fences)
            kind = SHARED if modes == {SHARED} else f"limit {limit}"
            seen = HoldersMachine.most_seen
            seen[kind] = max(seen.get(kind, 0), len(found.holders))

    @invariant()
    def every_change_has_one_event(self):
        with db.engine.connect() as conn:
            count = conn.scalar(select(func.count()).select_from(LockEvent))
        assert count == self.events


@pytest.mark.slow
def test_holders_match_their_model_under_any_sequence(backend, make_app):
    clock = FakeClock()
    app = make_app(LOCKKEEPER_CLOCK=clock, LOCKKEEPER_MAX_TTL=MAX_TTL)
    with app.app_context():
        for token in HOLDER_TOKENS:
            create_token(token)
        HoldersMachine.service = lock_service()
        HoldersMachine.clock = clock
        HoldersMachine.most_seen = {}
        run_state_machine_as_test(
            HoldersMachine,
            settings=settings(
                max_examples=HOLDER_EXAMPLES[backend],
                stateful_step_count=40,
                # The same sequences every run: the check below that they
                # reached shared grants side by side and full semaphores must
                # not depend on the luck of a draw (it failed once in a few
                # runs when drawn at random).
                derandomize=True,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    # The sequences reached the interesting states: shared grants side by side,
    # a semaphore with every holder taken.
    seen = HoldersMachine.most_seen
    assert seen.get(SHARED, 0) >= 2, seen
    assert seen.get("limit 2", 0) == 2, seen
    assert seen.get("limit 3", 0) == 3, seen
