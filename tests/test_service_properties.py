"""LockService against a model, driven by Hypothesis, on a fake clock.

A rule-based state machine runs any sequence of acquire / renew / release / get /
force-release / claim / purge / clock moves, with valid and hostile input (NUL
bytes, huge strings, odd Unicode, numbers at the float limits, wrong types), on
every database. After every step the database must equal the model: the same rows,
the same number of audit events, fences only ever growing, and a rejected request
must have changed nothing at all.
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
from sqlalchemy import delete, func, select

from app.auth.service import create_token
from app.extensions import db
from app.locks.errors import (
    InvalidInput,
    LockExpired,
    LockHeld,
    LockNotFound,
    NotOwner,
    QuotaExceeded,
)
from app.locks.models import NO_TOKEN, DistributedLock, LockEvent
from app.locks.pagination import encode_cursor
from app.locks.service import lock_service
from app.locks.state import Action, LockState, classify
from app.locks.validation import MIN_TTL
from tests.clock import FakeClock

pytestmark = pytest.mark.usefixtures("backend")

START = FakeClock().now()
MAX_TTL = 86400.0
DEFAULT_TTL = 30.0
EXPIRING_WITHIN = 15.0
# Server databases cost a round trip per statement; SQLite explores more.
EXAMPLES = {"sqlite": 50, "postgresql": 20, "mariadb": 20}

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
            owner, lock.fence, lock.acquired_at, lock.expires_at, token
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
        assert lock.state is classify(remaining, EXPIRING_WITHIN)
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
            assert lock.state is classify(remaining, EXPIRING_WITHIN)

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
            expected[classify(remaining, EXPIRING_WITHIN)] += 1
        assert self.service.counts() == expected
        for owner in {row.owner for row in self.rows.values()}:
            listed = self.service.list_locks(owner=owner, limit=500).items
            assert sorted(lock.resource for lock in listed) == sorted(
                r for r, row in self.rows.items() if row.owner == owner
            )


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
