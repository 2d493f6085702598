"""Sets: several locks acquired, renewed and released as one, on every database.

A set is granted whole in one transaction or refused whole (naming the member
that refused) with nothing written; each member has its own fence and event;
a set counts as its members against a quota; freezes and limits are decided
for every member.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from lockkeeper_core.errors import (
    InvalidInput,
    LimitMismatch,
    LockExpired,
    NotOwner,
    QuotaExceeded,
    ResourceFrozen,
    SessionBound,
    SessionExpired,
    UnknownSession,
)
from lockkeeper_core.models import (
    EXCLUSIVE,
    SHARED,
    DistributedLock,
    LockEvent,
    LockHolder,
)
from lockkeeper_core.state import Action
from lockkeeper_core.values import Ask, Member
from sqlalchemy import create_engine, select, text

from app.auth.service import create_token
from app.extensions import db, lock_service
from tests.row_waits import DEADLINE, RowHolder, lock_waits

pytestmark = pytest.mark.usefixtures("backend")


def snapshot():
    """Every row a grant writes (locks, holders, events)."""
    db.session.expire_all()
    with db.engine.connect() as conn:
        return [
            sorted(tuple(row) for row in conn.execute(select(table.__table__)).all())
            for table in (DistributedLock, LockHolder, LockEvent)
        ]


def events_of(resource: str) -> list[LockEvent]:
    # A new read: a transaction left open by an earlier call would keep its
    # snapshot (SQLite, MariaDB) and miss the events written since.
    db.session.rollback()
    db.session.expire_all()
    return list(
        db.session.scalars(
            select(LockEvent)
            .where(LockEvent.resource == resource)
            .order_by(LockEvent.id)
        )
    )


MIXED = [
    Member("set:b", 1, EXCLUSIVE),
    Member("set:a", 1, SHARED),
    Member("set:c", 3, EXCLUSIVE),
]


def test_a_set_is_granted_whole_each_member_with_its_fence_and_event(service, clock):
    result = service.acquire_set(MIXED, "w-1", ttl=30, token="t")
    assert result.acquired
    # In the order asked, each as asked.
    assert [lock.resource for lock in result.locks] == ["set:b", "set:a", "set:c"]
    assert [(lock.limit, lock.mode) for lock in result.locks] == [
        (1, EXCLUSIVE),
        (1, SHARED),
        (3, EXCLUSIVE),
    ]
    fences = [lock.fence for lock in result.locks]
    assert len(set(fences)) == 3
    for lock in result.locks:
        assert lock.owner == "w-1"
        assert lock.expires_at == clock.now() + timedelta(seconds=30)
        (event,) = events_of(lock.resource)
        assert (event.action, event.fence, event.mode) == (
            Action.ACQUIRED.value,
            lock.fence,
            lock.mode,
        )
    # Each member is a grant like any other: its holders, its fence check.
    for lock in result.locks:
        (holder,) = service.holders(lock.resource).holders
        assert holder.fence == lock.fence
        assert service.check_fence(lock.resource, lock.fence).fence == lock.fence


def test_a_set_is_refused_whole_naming_the_member_and_writes_nothing(service):
    held = service.acquire("set:c", "w-2", ttl=30).lock
    before = snapshot()
    result = service.acquire_set(
        [Member("set:a"), Member("set:new"), Member("set:c")], "w-1", ttl=30
    )
    assert not result.acquired
    assert result.locks == []
    assert result.refused == "set:c"
    assert (result.lock.owner, result.lock.fence) == ("w-2", held.fence)
    # Not even the free row of the member that had none.
    assert snapshot() == before


def test_overlapping_sets_in_either_order_meet_on_their_first_shared_member(service):
    first = service.acquire_set([Member("set:a"), Member("set:b")], "w-1", ttl=30)
    second = service.acquire_set([Member("set:b"), Member("set:a")], "w-2", ttl=30)
    assert first.acquired
    assert not second.acquired
    assert second.refused == "set:a"  # the lock order's first, whatever the order asked


def test_a_set_again_by_its_holder_keeps_its_fences(service):
    first = service.acquire_set(MIXED, "w-1", ttl=30)
    again = service.acquire_set(MIXED, "w-1", ttl=60)
    assert again.acquired
    assert [lock.fence for lock in again.locks] == [lock.fence for lock in first.locks]
    assert events_of("set:b")[-1].action == Action.REACQUIRED.value


def test_a_frozen_member_refuses_the_set(service):
    service.freeze("set:c", actor="op", reason="maintenance")
    before = snapshot()
    with pytest.raises(ResourceFrozen) as refused:
        service.acquire_set(MIXED, "w-1", ttl=30)
    assert refused.value.resource == "set:c"
    assert snapshot() == before


def test_a_member_in_use_with_another_limit_refuses_the_set(service):
    service.acquire("set:c", "w-2", ttl=30, limit=2)
    before = snapshot()
    with pytest.raises(LimitMismatch) as refused:
        service.acquire_set(MIXED, "w-1", ttl=30)
    assert (refused.value.resource, refused.value.limit) == ("set:c", 2)
    assert snapshot() == before


def test_a_set_counts_as_its_members_against_the_quota(service):
    create_token("quota-2", max_locks=2)
    before = snapshot()
    with pytest.raises(QuotaExceeded):
        service.acquire_set(MIXED, "w-1", ttl=30, token="quota-2", max_locks=2)
    assert snapshot() == before
    two = [Member("set:a"), Member("set:b")]
    granted = service.acquire_set(two, "w-1", ttl=30, token="quota-2", max_locks=2)
    assert granted.acquired


@pytest.mark.backends("mariadb")
def test_two_sets_making_a_deleted_row_again_at_once_take_turns(service):
    """A refused set deletes the free row it made (``forget_rows``); two sets
    then make it again at once (``create_rows``), while a third holds the
    row after it in the name's index. The deleted row's index entry stays
    until InnoDB purges it (here an older read view keeps it): two ``INSERT
    IGNORE`` each took a shared lock on the next entry and each waited for
    the other's to insert before it, a deadlock. The second must wait for the
    first and find its row."""
    sets = service.sets

    def ask(resource: str) -> Ask:
        return Ask(resource, "w-1", None, 30.0)

    made = sets.create_rows([ask("set:f3"), ask("set:f4")])
    assert len(made) == 2
    keeper = create_engine(db.engine.url, isolation_level="REPEATABLE READ")
    pool = ThreadPoolExecutor(2)
    try:
        with keeper.connect() as view:
            view.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            sets.forget_rows([made[0]])  # deleted, its entry not purged
            with RowHolder(service, "set:f4") as held:
                again = [
                    pool.submit(sets.create_rows, [ask("set:f3")]) for _ in range(2)
                ]
                deadline = time.monotonic() + DEADLINE
                while True:
                    with db.engine.connect() as conn:
                        if lock_waits(conn) >= 2:
                            break
                    if any(future.done() for future in again):
                        [future.result(timeout=0) for future in again]
                        raise AssertionError("a maker did not wait for the row")
                    assert time.monotonic() < deadline, "the makers never waited"
                    time.sleep(0.01)
                held.finish(lambda conn: None)
                remade = [future.result(timeout=DEADLINE) for future in again]
            view.rollback()
    finally:
        pool.shutdown(wait=False)
        keeper.dispose()
    # One made it, the other found it.
    assert sorted(len(ids) for ids in remade) == [0, 1]
    with db.engine.connect() as conn:
        names = conn.scalars(select(DistributedLock.resource)).all()
    assert sorted(names) == ["set:f3", "set:f4"]


@pytest.mark.backends("mariadb")
def test_a_refused_sets_row_is_deleted_in_the_lock_order(service):
    """The delete of a free row a refused set made (``forget_rows``) and
    another set's locking read of it (``_lock_rows``) meet. Queued in that
    order behind a transaction holding the row alone (by its primary key),
    a delete by primary key took the row, then waited for its name's index
    entry, which the read had locked and waited for the row with: a
    deadlock. Found by name, the delete locks the entry first; the read
    waits for it and finds no row."""
    sets = service.sets
    (made,) = sets.create_rows([Ask("set:d", "w-1", None, 30.0)])
    pool = ThreadPoolExecutor(2)

    def read_locked():
        core = service.core
        with core.write_engine.connect() as conn, conn.begin():
            return core.transactional.lock_row(conn, made, core.given_now())

    def waits(count: int, futures) -> None:
        deadline = time.monotonic() + DEADLINE
        while True:
            with db.engine.connect() as conn:
                if lock_waits(conn) >= count:
                    return
            if any(future.done() for future in futures):
                [future.result(timeout=0) for future in futures]
                raise AssertionError("a call did not wait for the row")
            assert time.monotonic() < deadline, "the calls never waited"
            time.sleep(0.01)

    try:
        with db.engine.connect() as conn:
            row_id = conn.scalar(
                select(DistributedLock.id).where(DistributedLock.resource == made)
            )
        with db.engine.connect() as holder, holder.begin():
            holder.execute(
                select(DistributedLock.id)
                .where(DistributedLock.id == row_id)
                .with_for_update()
            )
            forgotten = pool.submit(sets.forget_rows, [made])
            waits(1, [forgotten])
            read = pool.submit(read_locked)
            waits(2, [forgotten, read])
        assert forgotten.result(timeout=DEADLINE) is None
        assert read.result(timeout=DEADLINE) is None
    finally:
        pool.shutdown(wait=False)
    with db.engine.connect() as conn:
        assert conn.scalars(select(DistributedLock.resource)).all() == []


def test_a_set_waits_for_no_one_but_respects_the_line(service):
    """A set does not wait, and does not pass others in line either: a
    member with a live waiter refuses it."""
    service.acquire("set:a", "w-2", ttl=30)
    result = service.acquire_set([Member("set:a"), Member("set:b")], "w-1", ttl=30)
    assert (result.acquired, result.refused) == (False, "set:a")


def test_a_set_is_renewed_as_one(service, clock):
    service.acquire_set(MIXED, "w-1", ttl=30)
    clock.advance(10)
    renewed = service.renew_set(["set:b", "set:a", "set:c"], "w-1", ttl=60)
    assert [lock.resource for lock in renewed] == ["set:b", "set:a", "set:c"]
    for lock in renewed:
        assert lock.expires_at == clock.now() + timedelta(seconds=60)
        assert events_of(lock.resource)[-1].action == Action.RENEWED.value


def test_a_renewal_of_a_set_with_a_lost_member_renews_nothing(service, clock):
    service.acquire_set([Member("set:a"), Member("set:b", 2)], "w-1", ttl=30)
    service.acquire_set([Member("set:c")], "w-1", ttl=5)
    clock.advance(10)
    before = snapshot()
    with pytest.raises(LockExpired) as refused:
        service.renew_set(["set:a", "set:b", "set:c"], "w-1", ttl=60)
    assert refused.value.resource == "set:c"
    assert snapshot() == before


def test_a_renewal_of_a_set_partly_anothers_is_refused(service):
    service.acquire_set([Member("set:a")], "w-1", ttl=30)
    service.acquire("set:b", "w-2", ttl=30)
    with pytest.raises(NotOwner):
        service.renew_set(["set:a", "set:b"], "w-1", ttl=60)


def test_a_set_is_released_as_one_naming_what_it_no_longer_held(service, clock):
    service.acquire_set(MIXED, "w-1", ttl=30)
    service.acquire("set:lost", "w-1", ttl=1)
    clock.advance(2)
    released = service.release_set(
        ["set:b", "set:a", "set:c", "set:lost"], "w-1", token=None
    )
    assert [lock.resource for lock in released.released] == ["set:b", "set:a", "set:c"]
    assert released.not_held == ["set:lost"]
    for resource in ("set:a", "set:b", "set:c"):
        assert service.holders(resource).holders == []
        assert events_of(resource)[-1].action == Action.RELEASED.value


def test_every_event_of_a_set_names_it_and_no_other_event_does(service, clock):
    """The grant, renewal and release events of each member name the set its
    grant was made by; a single grant's, before and after, name none."""
    service.acquire("set:a", "w-1", ttl=30)
    service.release("set:a", "w-1")
    first = service.acquire_set(MIXED, "w-1", ttl=30, token="t")
    other = service.acquire_set([Member("set:d")], "w-1", ttl=30, token="t")
    assert first.set_id
    assert other.set_id
    assert first.set_id != other.set_id
    clock.advance(5)
    service.renew_set(["set:a", "set:b", "set:c"], "w-1", ttl=60, token="t")
    # One release naming members of two sets: each event names its own.
    service.release_set(["set:b", "set:d"], "w-1", token="t")
    service.release_set(["set:a", "set:c"], "w-1", token="t")
    service.acquire("set:a", "w-2", ttl=30)
    named = {
        resource: [(e.action, e.set_id) for e in events_of(resource)]
        for resource in ("set:a", "set:b", "set:c", "set:d")
    }
    in_first = [
        (Action.ACQUIRED.value, first.set_id),
        (Action.RENEWED.value, None),  # renewals are not named
        (Action.RELEASED.value, first.set_id),
    ]
    assert named == {
        "set:a": [
            (Action.ACQUIRED.value, None),
            (Action.RELEASED.value, None),
            *in_first,
            (Action.ACQUIRED.value, None),
        ],
        "set:b": in_first,
        "set:c": in_first,
        "set:d": [
            (Action.ACQUIRED.value, other.set_id),
            (Action.RELEASED.value, other.set_id),
        ],
    }


def test_a_member_acquired_again_on_its_own_leaves_the_set(service):
    """Its newest grant event is its own: its release names no set."""
    held = service.acquire_set([Member("set:a"), Member("set:b")], "w-1", ttl=30)
    service.acquire("set:a", "w-1", ttl=30)
    service.release_set(["set:a", "set:b"], "w-1")
    assert [e.set_id for e in events_of("set:a")] == [held.set_id, None, None]
    assert [e.set_id for e in events_of("set:b")] == [held.set_id, held.set_id]


def test_a_refused_set_names_no_event(service):
    service.acquire("set:c", "w-2", ttl=30)
    result = service.acquire_set([Member("set:a"), Member("set:c")], "w-1", ttl=30)
    assert not result.acquired
    assert result.set_id is None
    assert all(e.set_id is None for e in events_of("set:c"))


def test_a_set_is_seen_by_its_id_each_member_held_or_not(service, clock):
    held = service.acquire_set(MIXED, "w-1", ttl=30, token="t")
    service.release("set:b", "w-1", token="t")
    service.acquire("set:a", "w-1", ttl=30, token="t")  # again, on its own
    found = service.set_view(held.set_id)
    assert [(m.resource, m.held) for m in found.members] == [
        ("set:a", False),  # acquired again on its own: no longer the set's
        ("set:b", False),  # released
        ("set:c", True),
    ]
    fences = {lock.resource: lock.fence for lock in held.locks}
    assert {m.resource: m.fence for m in found.members} == fences
    # Its events: the set's own (a single release of a member names none).
    assert sorted((e.resource, e.action.value) for e in found.events) == [
        (resource, Action.ACQUIRED.value) for resource in ("set:a", "set:b", "set:c")
    ]
    alone = service.get("set:a")
    c = next(h for h in service.holders("set:c").holders)
    assert service.sets_of_grants(
        [("set:a", alone.fence, alone.acquired_at), ("set:c", c.fence, c.acquired_at)]
    ) == {("set:c", fences["set:c"]): held.set_id}
    assert service.set_view("unknown") is None
    with pytest.raises(InvalidInput):
        service.set_view("not a set id!")


def test_an_operator_releases_a_set_as_one(service, clock):
    held = service.acquire_set(MIXED + [Member("set:d")], "w-1", ttl=30, token="t")
    service.acquire("set:d", "w-1", ttl=30, token="t")  # again, on its own
    done = service.force_release_set(held.set_id, actor="op", reason="stuck job")
    assert [lock.resource for lock in done.released] == ["set:a", "set:b", "set:c"]
    assert done.not_held == ["set:d"]
    for resource in ("set:a", "set:b", "set:c"):
        assert service.holders(resource).holders == []
        event = events_of(resource)[-1]
        assert (event.action, event.set_id, event.actor, event.reason) == (
            Action.FORCE_RELEASED.value,
            held.set_id,
            "op",
            "stuck job",
        )
    # The member acquired again on its own stays its holder's.
    assert [h.owner for h in service.holders("set:d").holders] == ["w-1"]
    assert service.set_view(held.set_id).held == []
    again = service.force_release_set(held.set_id, actor="op", reason="again")
    assert (again.released, again.not_held) == (
        [],
        ["set:a", "set:b", "set:c", "set:d"],
    )
    with pytest.raises(InvalidInput):
        service.force_release_set(held.set_id, actor="op", reason="")
    assert service.force_release_set("unknown", actor="op", reason="x") is None


def test_an_operators_release_of_a_set_leaves_a_grant_taken_since(service, clock):
    """A member that ran out and was taken by another holder is not the
    set's: it stays."""
    held = service.acquire_set([Member("set:a"), Member("set:b")], "w-1", ttl=5)
    service.renew("set:b", "w-1", ttl=60)
    clock.advance(10)
    other = service.acquire("set:a", "w-2", ttl=30).lock
    done = service.force_release_set(held.set_id, actor="op", reason="stuck")
    assert [lock.resource for lock in done.released] == ["set:b"]
    assert done.not_held == ["set:a"]
    assert service.get("set:a").fence == other.fence


def test_a_set_bound_to_a_session_lives_and_ends_with_it(service, clock):
    session = service.sessions.create("w-1", 20, token="t")
    held = service.acquire_set(MIXED, "w-1", token="t", session=session.id)
    assert held.acquired
    for lock in held.locks:
        assert lock.session == session.id
        assert lock.expires_at == session.expires_at
        (event,) = events_of(lock.resource)
        assert event.set_id == held.set_id
        assert json.loads(event.details) == {"session": session.id}
    # Renewed by its heartbeat only: a renewal of the set is refused.
    clock.advance(15)
    beat = service.sessions.heartbeat(session.id, token="t")
    with pytest.raises(SessionBound):
        service.renew_set(["set:a", "set:b", "set:c"], "w-1", ttl=60, token="t")
    clock.advance(15)
    for resource in ("set:a", "set:b", "set:c"):
        (holder,) = service.holders(resource).holders
        assert holder.expires_at == beat.expires_at
    # Its end releases every member, each event naming the set.
    ended = service.sessions.end(session.id, token="t", actor="w-1")
    assert sorted(lock.resource for lock in ended.locks) == ["set:a", "set:b", "set:c"]
    for resource in ("set:a", "set:b", "set:c"):
        assert service.holders(resource).holders == []
        assert [(e.action, e.set_id) for e in events_of(resource)] == [
            (Action.ACQUIRED.value, held.set_id),
            (Action.RELEASED.value, held.set_id),
        ]


def test_a_set_bound_to_a_session_it_cannot_have_writes_nothing(service, clock):
    session = service.sessions.create("w-1", 5, token="t")
    members = [Member("set:a"), Member("set:b", 2)]
    before = snapshot()
    with pytest.raises(UnknownSession):
        service.acquire_set(members, "w-1", token="other", session=session.id)
    with pytest.raises(InvalidInput):
        service.acquire_set(members, "w-2", token="t", session=session.id)
    with pytest.raises(InvalidInput):
        service.acquire_set(members, "w-1", ttl=30, token="t", session=session.id)
    clock.advance(6)
    with pytest.raises(SessionExpired):
        service.acquire_set(members, "w-1", token="t", session=session.id)
    assert snapshot() == before


def test_a_freeze_event_newer_than_a_members_grant_event_is_not_named(service, clock):
    """A freeze names its prefix as its resource and is written under no row
    lock: when it is a member's newest event, the naming finds the grant's
    own event by its fence (``name_sets``' second look), on every database."""
    from lockkeeper_core.set_names import name_sets

    held = service.acquire("set:a", "w-1", ttl=30).lock
    service.freeze("set:a", actor="op", reason="maintenance")
    with db.engine.begin() as conn:
        name_sets(conn, [("set:a", held.fence, held.acquired_at, "planted")])
    assert [(e.action, e.set_id) for e in events_of("set:a")] == [
        (Action.ACQUIRED.value, "planted"),
        ("frozen", None),
    ]
    # A release looks the set up by the grant's event (acquired_at), not by
    # the newest event.
    service.unfreeze("set:a", actor="op", reason="done")
    released = service.release_set(["set:a"], "w-1")
    assert released.released
    assert events_of("set:a")[-1].set_id == "planted"


def _poll(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        threading.Event().wait(0.01)


def test_a_waiting_set_keeps_its_place_in_every_line_and_is_not_starved(
    make_app, clock
):
    """A set waits in line for a held member: it holds nothing meanwhile,
    and a single acquire that comes after it is refused on every member,
    the free one too; once the holder releases, the set is granted and its
    holders are gone."""
    app = make_app()
    with app.app_context():
        service = lock_service()
        service.acquire("set:a", "holder", ttl=30)
        answers = []

        def waiting_set():
            with app.app_context():
                answers.append(
                    lock_service().acquire_set(
                        [Member("set:a"), Member("set:b")], "w-set", ttl=30, wait=10
                    )
                )

        thread = threading.Thread(target=waiting_set)
        thread.start()
        _poll(
            lambda: [w.owner for w in service.queue.line("set:b")] == ["w-set"],
            "the set took its places",
        )
        assert [w.owner for w in service.queue.line("set:a")] == ["w-set"]
        assert service.holders("set:b").holders == []  # nothing held meanwhile
        late = service.acquire("set:b", "single", ttl=30)
        assert not late.acquired  # the set is ahead of it, b free or not
        service.release("set:a", "holder")
        thread.join(timeout=15)
        assert not thread.is_alive()
        (answer,) = answers
        assert answer.acquired
        assert [lock.owner for lock in answer.locks] == ["w-set", "w-set"]
        assert service.queue.line("set:a") == service.queue.line("set:b") == []


def test_a_set_whose_wait_runs_out_leaves_both_lines(service, clock):
    service.acquire("set:a", "holder", ttl=30)
    result = service.acquire_set(
        [Member("set:a"), Member("set:b")], "w-set", ttl=30, wait=0.2
    )
    assert not result.acquired
    assert result.refused == "set:a"
    assert service.queue.line("set:a") == service.queue.line("set:b") == []
    assert service.acquire("set:b", "single", ttl=30).acquired


def test_a_set_past_the_bound_or_naming_a_resource_twice_is_invalid(make_app):
    app = make_app(LOCKKEEPER_MAX_SET_SIZE=2)
    from app.extensions import lock_service

    with app.app_context():
        service = lock_service()
        with pytest.raises(InvalidInput) as bound:
            service.acquire_set(MIXED, "w-1")
        assert bound.value.errors[0][0] == "members"
        assert "LOCKKEEPER_MAX_SET_SIZE" in bound.value.errors[0][1]
        with pytest.raises(InvalidInput) as twice:
            service.acquire_set([Member("set:a"), Member("set:a", 1, SHARED)], "w-1")
        assert twice.value.errors == [
            ("members[1].resource", "names a resource already named")
        ]
        with pytest.raises(InvalidInput) as bad:
            service.acquire_set([Member("set:a", 0), Member("bad name")], "w-1")
        assert [field for field, _ in bad.value.errors] == [
            "members[0].limit",
            "members[1].resource",
        ]
        with pytest.raises(InvalidInput):
            service.acquire_set([], "w-1")


# A set's acquire and release, called as statements in one transaction whose
# reads of the events the server counts (pg_stat_xact_user_tables).
_EVENTS_READ = text(
    "SELECT seq_tup_read + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
    " WHERE relname = 'lock_events'"
)
_ACQUIRE_SET = text(
    "SELECT * FROM lockkeeper_acquire_set(CAST(:names AS varchar[]),"
    " ARRAY[1, 1], ARRAY['exclusive', 'exclusive']::varchar[],"
    " ARRAY[NULL, NULL]::bigint[], 'w-1', NULL, 30, NULL, NULL, NULL, 'long')"
)
_RELEASE_SET = text(
    "SELECT * FROM lockkeeper_release_set(CAST(:names AS varchar[]),"
    " 'w-1', NULL, NULL, NULL)"
)
HISTORY = 5000


@pytest.mark.backends("postgresql")
def test_a_sets_acquire_and_release_read_the_newest_event_not_the_history(service):
    """Each names the set on the event it has just written, the newest of
    its member's resource: found one step back along the resource's index,
    whatever the resource's history. Found as the newest of the resource
    and the fence at once (0041, 0042), PostgreSQL read every event of the
    resource: 26,000 rows for three members of 9,000 events each."""
    names = ["set:long:a", "set:long:b"]
    assert service.acquire_set([Member(n) for n in names], "w-1", ttl=30).acquired
    service.release_set(names, "w-1")
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO lock_events (resource, action, owner, fence,"
                " occurred_at) SELECT r, 'released', 'old', g, now()"
                " FROM unnest(CAST(:names AS varchar[])) AS r,"
                " generate_series(1, :history) AS g"
            ),
            {"names": names, "history": HISTORY},
        )
    with db.engine.connect() as conn:
        conn.execute(text("ANALYZE lock_events"))
    with db.engine.begin() as conn:
        before = conn.scalar(_EVENTS_READ)
        granted = conn.execute(_ACQUIRE_SET, {"names": names}).all()
        acquired = conn.scalar(_EVENTS_READ)
        released = conn.execute(_RELEASE_SET, {"names": names}).all()
        after = conn.scalar(_EVENTS_READ)
    assert [row.resource for row in granted] == names
    assert [row.resource for row in released] == names
    # A few index probes per member, not its 5,000 events.
    assert acquired - before < 20, acquired - before
    assert after - acquired < 40, after - acquired
    for name in names:
        assert [e.set_id for e in events_of(name)[-2:]] == ["long", "long"]
