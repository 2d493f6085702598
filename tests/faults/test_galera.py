"""Lockkeeper on a three-node MariaDB Galera cluster (``galera.GaleraCluster``),
through the service layer with one app per node (multi-writer).

Each test shows on the real cluster what failed there before its fix. The schema
installs (migration 0034's sequence, 0038 without its cache and 0040's unique
granted fences, under traffic), fences of one resource increase across nodes
(exclusive grants, holders, shared and session-bound grants; also after a
purge), a semaphore admits no more holders than its limit across nodes (the
holders path writes the resource's row), no fence is granted twice while nodes
draw at the offsets of two views (0040), the guard conflicts with a take-over
from another node (0035), a follower reading one node misses no event
committed late on another, the service sets and checks the node settings it
needs, and the fault harness finds no violation with several writing nodes,
nor with every instance writing through HAProxy to one node while that node
is killed (a failover to the next, and back).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict

import pymysql
import pytest
from lockkeeper_core.engine import GALERA_SYNC_WAIT
from lockkeeper_core.errors import ServiceBusy
from lockkeeper_core.models import NO_TOKEN
from lockkeeper_core.state import Action
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app import create_app
from app.audit.follow import HOLE_GRACE, follow_step, start_position
from app.audit.service import EventFilter, newest_event_id
from app.extensions import db, lock_service
from app.factory import upgrade_schema
from app.ops.galera import UnsafeGaleraNode, galera_problems
from app.ops.upgrade import upgrade
from tests.databases import IN_CI
from tests.faults.cluster import ClusterError
from tests.faults.galera import GaleraCluster, galera_prerequisites
from tests.faults.galera_proxy import haproxy_missing
from tests.faults.run import RunConfig, run

pytestmark = pytest.mark.slow


def _app(url: str, instance: str):
    return create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": instance,
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
        }
    )


def _dispose(app) -> None:
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


def _require(missing: str | None) -> None:
    if missing:
        if IN_CI:
            pytest.fail(f"{missing} (CI=true: .ci/run installs it)")
        pytest.skip(missing)


def _require_galera() -> None:
    _require(galera_prerequisites())


@pytest.fixture(scope="module")
def galera(tmp_path_factory):
    """One cluster for the module, migrated once through node 0, and one app
    per node: ``(cluster, [app0, app1, app2])``."""
    _require_galera()
    instance = tmp_path_factory.mktemp("galera")
    with GaleraCluster() as cluster:
        apps = [
            _app(cluster.url(node), str(instance / node.name)) for node in cluster.nodes
        ]
        try:
            upgrade_schema(apps[0])
            yield cluster, apps
        finally:
            for app in apps:
                # What the app counted goes to the cluster while it is there.
                app.extensions["lockkeeper.refusals"].stop()
                _dispose(app)


def _acquire(app, resource: str, owner: str):
    with app.app_context():
        return lock_service().acquire(resource, owner, ttl=60)


def _release(app, resource: str, owner: str) -> None:
    with app.app_context():
        lock_service().release(resource, owner)


def test_the_schema_installs_on_a_galera_cluster_and_0038_0040_run_under_traffic(
    galera, tmp_path
):
    """Migration 0001 created the fence sequence with a cache and INCREMENT BY
    1, which Galera refuses (error 1235); it is INCREMENT BY 0 now. 0038 takes
    its cache away on a Galera node while two nodes grant, and 0040 adds the
    unique index of granted fences: the grants they abort are retried, and the
    fences of each resource increase across them."""
    cluster, _apps = galera
    with cluster.nodes[0].connect() as conn, conn.cursor() as cursor:
        cursor.execute("CREATE DATABASE lk_fresh")
    # Made while the database is empty (nothing to check at their start).
    apps = [
        _app(cluster.url(n, database="lk_fresh"), str(tmp_path / f"a{n}"))
        for n in (1, 2)
    ]
    started = None
    try:
        upgrade(apps[0], "0037")
        with apps[0].app_context(), db.engine.connect() as conn:
            cached = conn.execute(
                text("SELECT increment, cache_size FROM lock_fence_seq")
            )
            assert tuple(cached.one()) == (0, 1000)
            # What a server started now would refuse to start with.
            cache, index = galera_problems(conn)
            assert "with a cache of 1000" in cache, cache
            assert "no unique index uq_lock_events_granted_fence" in index, index
        stop, upgraded = threading.Event(), threading.Event()
        # Grants asked for once the upgrade was done: (granted at, fence); and
        # before it, only counted.
        fences: dict[str, list[tuple]] = defaultdict(list)
        before: dict[str, list[tuple]] = defaultdict(list)
        answers: Counter[str] = Counter()

        def work(app, name: str) -> None:
            # On until the upgrade is done and grants came after it.
            deadline = time.monotonic() + 180
            while not stop.is_set() and time.monotonic() < deadline:
                after = upgraded.is_set()
                for resource, kind in (
                    ("galera:0038:mutex", {}),
                    ("galera:0038:places", {"limit": 2}),
                ):
                    try:
                        with app.app_context():
                            result = lock_service().acquire(
                                resource, name, ttl=30, **kind
                            )
                            if result.acquired:
                                _note_new_grant(
                                    (fences if after else before)[resource], result
                                )
                                lock_service().release(resource, name)
                        answers["granted" if result.acquired else "busy"] += 1
                    except ServiceBusy:
                        answers["ServiceBusy"] += 1
                    except Exception as exc:  # noqa: BLE001 - counted and reported
                        answers[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
                if sum(len(taken) for taken in fences.values()) >= 40:
                    stop.set()

        threads = [
            threading.Thread(target=work, args=(app, f"w{n}-{k}"))
            for n, app in enumerate(apps)
            for k in range(2)
        ]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 30
            while answers["granted"] < 10 and time.monotonic() < deadline:
                time.sleep(0.05)
            upgrade_schema(apps[1])
            upgraded.set()
        finally:
            if not upgraded.is_set():
                stop.set()
            for thread in threads:
                thread.join(timeout=200)
        unexpected = {
            k: v
            for k, v in answers.items()
            if k not in ("granted", "busy", "ServiceBusy")
        }
        assert not unexpected, answers
        # In the order the cluster granted them (each grant's clock is read
        # once its resource's row is held), the fences of a resource increase.
        # Before the upgrade (a cache) holders went backwards here: 9008, 12009,
        # 9011, 12024, 9020, as nodes 1 and 2 drew from their own blocks.
        backwards = _backwards(fences)
        print(
            f"{dict(answers)}; with the cache, {len(_backwards(before, steps=True))}"
            f" of {sum(map(len, before.values()))} grants went backwards"
        )
        assert sum(len(taken) for taken in fences.values()) >= 40, answers
        assert not backwards, f"{dict(answers)}: {backwards}"
        # A server started on it finds the node as it needs it.
        started = _app(cluster.url(1, database="lk_fresh"), str(tmp_path / "started"))
        with started.app_context(), db.engine.connect() as conn:
            assert galera_problems(conn) == []
            sequence = conn.execute(
                text("SELECT increment, cache_size FROM lock_fence_seq")
            )
            assert tuple(sequence.one()) == (0, 0)
            sync_wait = conn.execute(text("SELECT @@session.wsrep_sync_wait"))
            assert sync_wait.scalar() == GALERA_SYNC_WAIT
    finally:
        for app in [*apps, *([started] if started else [])]:
            app.extensions["lockkeeper.refusals"].stop()
            _dispose(app)
        with cluster.nodes[0].connect() as conn, conn.cursor() as cursor:
            cursor.execute("DROP DATABASE lk_fresh")


def test_a_server_refuses_to_start_on_a_node_that_can_lose_acknowledged_commits(
    galera, tmp_path
):
    cluster, _apps = galera
    node = cluster.nodes[2]
    with node.connect() as conn, conn.cursor() as cursor:
        cursor.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
    try:
        with pytest.raises(
            UnsafeGaleraNode, match="innodb_flush_log_at_trx_commit is 2"
        ):
            _app(cluster.url(node), str(tmp_path))
    finally:
        with node.connect() as conn, conn.cursor() as cursor:
            cursor.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 1")


def test_fences_of_one_resource_increase_when_nodes_take_turns(galera):
    """Grants one after the other, each released before the next, alternating
    between the nodes. This holds today: a node applies another's draw (a write
    to the sequence's table) before it sees that node's grant, and the applied
    write drops its own cache, so its next draw is above (1, 3002, 6004, ...)."""
    _cluster, apps = galera
    resource = "galera:turns"
    fences = []
    for turn in range(6):
        app = apps[turn % 3]
        owner = f"worker-{turn}"
        fences.append(_acquire(app, resource, owner).lock.fence)
        _release(app, resource, owner)
    assert fences == sorted(set(fences)), f"fences in grant order: {fences}"


def test_fences_of_holders_shared_and_session_grants_increase_when_nodes_take_turns(
    galera,
):
    """As above, for the grants whose fence is the sequence's draw alone (no
    exclusive row to raise it above): a semaphore's holders, shared grants and
    grants bound to a session. With a cache each node drew from its own block
    (1, 3002, 4, ...): the third node's grant came below the second's. The
    sequence has no cache on Galera (0038): every draw writes it, and a node
    applies another's draw with the grant that drew it."""
    _cluster, apps = galera
    fences: dict[str, list[int]] = defaultdict(list)
    for turn in range(6):
        app = apps[turn % 3]
        owner = f"worker-{turn}"
        with app.app_context():
            service = lock_service()
            for resource, kind in (
                ("galera:turns:places", {"limit": 2}),
                ("galera:turns:shared", {"mode": "shared"}),
            ):
                result = service.acquire(resource, owner, ttl=60, **kind)
                assert result.acquired, (resource, result)
                fences[resource].append(result.lock.fence)
                service.release(resource, owner)
            session = service.sessions.create(owner, 60, token=NO_TOKEN)
            result = service.acquire(
                "galera:turns:session", owner, session=session.id, token=NO_TOKEN
            )
            assert result.acquired, result
            fences["galera:turns:session"].append(result.lock.fence)
            service.sessions.end(session.id, token=NO_TOKEN, actor=None)
    backwards = {r: f for r, f in fences.items() if f != sorted(set(f))}
    assert not backwards, f"fences in grant order: {dict(fences)}"


def test_a_grant_after_a_purge_draws_above_the_purged_fence_on_another_node(galera):
    """A purge deletes a free row: the next grant of the resource has no row to
    raise its fence above, and draws from its node's cache of the sequence.
    A node that applies another's draw of a new cache block drops its own, so
    its next draw is above every value the other node could hand out."""
    cluster, apps = galera
    fences = []
    for turn in range(6):
        here, there = turn % 3, (turn + 1) % 3
        resource = f"galera:purged:{turn}"
        fence = _acquire(apps[here], resource, "before").lock.fence
        _release(apps[here], resource, "before")
        # What purge-stale does to a long-free row.
        with cluster.nodes[here].connect() as conn, conn.cursor() as cursor:
            cursor.execute(
                "DELETE FROM distributed_locks WHERE resource = %s", (resource,)
            )
        again = _acquire(apps[there], resource, "after").lock.fence
        fences.append((fence, again))
    assert all(after > before for before, after in fences), fences


def _two_threads_on_each_node(apps, work) -> None:
    """Run ``work(app, name)`` on two threads per node's app, named
    ``"<node>-<n>"``, until all of them return."""
    threads = [
        threading.Thread(target=work, args=(app, f"{node}-{n}"))
        for node, app in enumerate(apps)
        for n in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _aborts(cluster) -> int:
    """Transactions the nodes aborted for another node's write so far: their
    own at certification, and local ones a replicated write broke into."""
    return sum(sum(node.aborts().values()) for node in cluster.nodes)


def test_fences_of_one_resource_increase_under_contention_across_nodes(galera):
    """Threads on every node take and release two resources as fast as they can;
    exclusive grants of one resource never overlap, so ordered by when each was
    granted (noted before its release), their fences must increase.

    Each node draws from its own cache of the sequence, so before grants raised
    their fence above the one they replace, 38 of 203 went backwards here. The
    grants a node loses at certification are retried like deadlocks, with the
    same bound: one that keeps losing is a ``ServiceBusy`` (503), counted."""
    cluster, apps = galera
    resources = ["galera:contended:0", "galera:contended:1"]
    grants: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    busy: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    stop = threading.Event()
    deadline = time.monotonic() + 15
    aborts_before = _aborts(cluster)

    def work(app, name: str) -> None:
        turn = 0
        while not stop.is_set() and time.monotonic() < deadline:
            resource = resources[turn % len(resources)]
            turn += 1
            try:
                result = _acquire(app, resource, name)
                if not result.acquired:
                    continue
                grants[resource].append((time.monotonic(), result.lock.fence, name))
                _release(app, resource, name)
            except ServiceBusy:
                busy[name] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            if sum(len(g) for g in grants.values()) >= 200:
                stop.set()

    _two_threads_on_each_node(apps, work)
    backwards = []
    for resource, taken in grants.items():
        taken.sort()
        for before, after in zip(taken, taken[1:], strict=False):
            if after[1] <= before[1]:
                backwards.append((resource, before[1:], after[1:]))
    total = sum(len(g) for g in grants.values())
    measured = (
        f"{total} grants, {_aborts(cluster) - aborts_before} transactions aborted "
        f"for another node's write, {sum(busy.values())} ServiceBusy"
    )
    print(measured)
    assert total >= 20, f"{measured}; errors: {dict(errors)}"
    assert not backwards, f"{len(backwards)} went backwards ({measured}): {backwards}"
    assert not errors, f"{measured}; errors: {dict(errors)}"


def _note_new_grant(grants: list, result) -> None:
    """Note a new grant's (granted at, fence). A re-acquire keeps its fence and
    is not one: a thread whose release answered 503 acquires again what it
    still holds."""
    if result.action is not Action.REACQUIRED:
        grants.append((result.lock.acquired_at, result.lock.fence))


def _backwards(grants, *, steps: bool = False):
    """Of ``grants`` (resource -> [(granted at, fence)]), the resources whose
    fences do not increase in grant order, with those fences in that order;
    with ``steps``, every grant whose fence is not above the one before it."""
    found = {}
    for resource, taken in grants.items():
        in_order = [fence for _at, fence in sorted(taken)]
        if steps:
            found.update(
                ((resource, n), pair)
                for n, pair in enumerate(zip(in_order, in_order[1:], strict=False))
                if pair[1] <= pair[0]
            )
        elif in_order != sorted(set(in_order)):
            found[resource] = in_order
    return found


def test_fences_of_holders_and_shared_grants_increase_under_contention_across_nodes(
    galera,
):
    """Threads on every node take and release a holder of a semaphore of 2 and
    a shared grant, as fast as they can. A holder or a shared grant takes the
    sequence's draw as its fence (no exclusive grant's row to raise it above):
    in the order the cluster granted them (the clock each grant read once it
    held its resource's row), their fences must increase. Each node drew
    from its own cache block (before 0038); and two holders admitted on two
    nodes at once wrote no row in common (before the holders path wrote the
    resource's row on Galera), so neither was ordered after the other."""
    cluster, apps = galera
    kinds = {
        "galera:contended:places": {"limit": 2},
        "galera:contended:shared": {"mode": "shared"},
    }
    grants: dict[str, list[tuple]] = defaultdict(list)
    busy: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    stop = threading.Event()
    deadline = time.monotonic() + 15
    aborts_before = _aborts(cluster)

    def work(app, name: str) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            for resource, kind in kinds.items():
                try:
                    with app.app_context():
                        result = lock_service().acquire(resource, name, ttl=60, **kind)
                        if result.acquired:
                            _note_new_grant(grants[resource], result)
                            lock_service().release(resource, name)
                except ServiceBusy:
                    busy[name] += 1
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            if sum(len(g) for g in grants.values()) >= 200:
                stop.set()

    _two_threads_on_each_node(apps, work)
    total = sum(len(g) for g in grants.values())
    backwards = _backwards(grants, steps=True)
    measured = (
        f"{total} grants, {_aborts(cluster) - aborts_before} transactions aborted "
        f"for another node's write, {sum(busy.values())} ServiceBusy"
    )
    print(measured)
    assert total >= 20, f"{measured}; errors: {dict(errors)}"
    assert not backwards, f"{len(backwards)} went backwards ({measured}): {backwards}"
    assert not errors, f"{measured}; errors: {dict(errors)}"


GRANT_ACTIONS = ("acquired", "took_over", "claimed", "force_claimed")


def _granted_twice(node, prefix: str) -> dict[int, str]:
    """The fences that more than one grant event under ``prefix`` names, with
    the resources they went to."""
    with node.connect() as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT fence, GROUP_CONCAT(resource ORDER BY id) FROM lock_events"
            f" WHERE resource LIKE %s AND action IN {GRANT_ACTIONS}"
            " GROUP BY fence HAVING COUNT(*) > 1",
            (prefix + "%",),
        )
        return dict(cursor.fetchall())


def _offsets(node) -> tuple[int, int]:
    with node.connect() as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT @@global.auto_increment_increment, @@global.auto_increment_offset"
        )
        return cursor.fetchone()


def _set_offsets(node, increment: int, offset: int) -> None:
    with node.connect() as conn, conn.cursor() as cursor:
        cursor.execute(
            "SET GLOBAL auto_increment_increment = %s, auto_increment_offset = %s",
            (increment, offset),
        )


def test_no_fence_is_granted_twice_while_nodes_draw_at_offsets_of_two_views(galera):
    """Galera sets each node's ``auto_increment_increment`` (the cluster's size)
    and ``auto_increment_offset`` anew when a node leaves or joins, and the
    fence sequence (``INCREMENT BY 0``) draws at them. Across a view change a
    node can draw at the old view's while another draws at the new one's: a
    multi-writer fault run granted fence 525 (3 x 175, offset 3 of 3; and
    offset 1 of 2) to two resources around a node's rejoin. Here node 1 draws
    as in a view of two nodes (odd values) for the whole test, nodes 0 and 2 as
    in the view of three (1 and 0 mod 3), while threads on every node grant
    exclusive locks of new resources and holders of semaphores.

    Certification never compares the sequence's draws, so on the code before
    0040 both grants of a fence committed: duplicates within seconds. The
    fences of grant events are a unique key on Galera now (0040): of two
    grants of one fence the cluster orders second, or the one on a node that
    applied the other, fails (1213 or 1062) and is retried with a new draw."""
    cluster, apps = galera
    prefix = "galera:once:"
    saved = _offsets(cluster.nodes[1])
    granted: dict[int, tuple[str, str]] = {}
    twice: list[tuple[int, str, str]] = []
    busy: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    stop = threading.Event()
    deadline = time.monotonic() + 30
    aborts_before = _aborts(cluster)
    guard = threading.Lock()

    def note(result, resource: str) -> None:
        if not result.acquired or result.action is Action.REACQUIRED:
            return
        with guard:
            other = granted.setdefault(result.lock.fence, (resource, result.action))
            if other[0] != resource:
                twice.append((result.lock.fence, other[0], resource))
                stop.set()

    def work(app, name: str) -> None:
        turn = 0
        while not stop.is_set() and time.monotonic() < deadline:
            turn += 1
            for resource, kind in (
                (f"{prefix}{name}:{turn}", {}),
                (f"{prefix}{name}:places", {"limit": 2}),
            ):
                try:
                    with app.app_context():
                        result = lock_service().acquire(resource, name, ttl=60, **kind)
                        note(result, resource)
                        if result.acquired:
                            lock_service().release(resource, name)
                except ServiceBusy:
                    busy[name] += 1
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            if len(granted) >= 400:
                stop.set()

    _set_offsets(cluster.nodes[1], 2, 1)
    try:
        _two_threads_on_each_node(apps, work)
    finally:
        _set_offsets(cluster.nodes[1], *saved)
    in_log = _granted_twice(cluster.nodes[0], prefix)
    measured = (
        f"{len(granted)} fences granted, {_aborts(cluster) - aborts_before}"
        f" transactions aborted for another node's write, {sum(busy.values())}"
        " ServiceBusy"
    )
    print(measured)
    assert not twice, f"fences granted twice ({measured}): {twice[:5]}"
    assert not in_log, f"in the log ({measured}): {in_log}"
    assert len(granted) >= 100, f"{measured}; errors: {dict(errors)}"
    assert not errors, f"{measured}; errors: {dict(errors)}"
    # Every node applied every grant: none failed to apply a duplicate (which
    # would have made it leave the cluster as inconsistent).
    for node in cluster.nodes:
        assert node.status("wsrep_local_state_comment") == "Synced", node.name
        assert node.status("wsrep_cluster_size") == str(len(cluster.nodes))


def test_0040_starts_above_a_fence_a_log_already_holds_twice(galera, tmp_path):
    """A log written by several nodes before 0040 may name a fence in two
    grants: the unique index could not be built over it. The column starts
    above the largest such fence, and a fence above it is granted once."""
    cluster, _apps = galera
    node = cluster.nodes[0]
    with node.connect() as conn, conn.cursor() as cursor:
        cursor.execute("CREATE DATABASE lk_twice")
    app = _app(cluster.url(node, database="lk_twice"), str(tmp_path / "twice"))
    insert = (
        "INSERT INTO lock_events (resource, action, owner, fence, occurred_at)"
        " VALUES (%s, %s, 'w', %s, UTC_TIMESTAMP(6))"
    )
    try:
        upgrade(app, "0039")
        with node.connect(database="lk_twice") as conn, conn.cursor() as cursor:
            for resource, action, fence in (
                ("sem:0", "acquired", 525),
                ("rw:0", "took_over", 525),
                ("rw:0", "renewed", 525),
                ("rw:1", "acquired", 600),
            ):
                cursor.execute(insert, (resource, action, fence))
        upgrade(app)
        with app.app_context(), db.engine.connect() as conn:
            assert galera_problems(conn) == []
        with node.connect(database="lk_twice") as conn, conn.cursor() as cursor:
            cursor.execute(insert, ("rw:2", "acquired", 525))
            with pytest.raises(pymysql.err.IntegrityError, match="1062|Duplicate"):
                cursor.execute(insert, ("rw:2", "claimed", 600))
            cursor.execute(insert, ("rw:1", "released", 600))
    finally:
        app.extensions["lockkeeper.refusals"].stop()
        _dispose(app)
        with node.connect() as conn, conn.cursor() as cursor:
            cursor.execute("DROP DATABASE lk_twice")


def test_a_guarded_write_never_commits_past_a_take_over_on_another_node(galera):
    """On one server a take-over waits for the guarded transaction's lock on the
    resource's row. On Galera row locks are local to a node: the take-over on
    node 1 commits at once, and node 0 learns of it when it applies it. Here
    node 0 applies on one thread, held busy by a large transaction node 1
    committed just before the take-over (what a loaded node does), so the
    guarded transaction commits before node 0 has applied the take-over.

    With the guard's shared lock alone the guarded commit certified (it wrote
    nothing the take-over wrote) and then committed after the take-over: the
    applier broke into its lock and replayed it. The guard writes the grant's
    row on Galera (0035), so certification fails it (1213)."""
    cluster, apps = galera
    guarded, other = apps[0], apps[1]
    applier = cluster.nodes[0]
    with guarded.app_context(), db.engine.connect() as conn:
        conn.execute(
            text(
                "CREATE TABLE guarded_writes"
                " (id BIGINT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL)"
            )
        )
        conn.execute(
            text(
                "CREATE TABLE ballast"
                " (id BIGINT AUTO_INCREMENT PRIMARY KEY, pad CHAR(200) NOT NULL)"
            )
        )
    with applier.connect() as node, node.cursor() as cursor:
        cursor.execute("SELECT @@global.wsrep_slave_threads")
        (threads,) = cursor.fetchone()
        cursor.execute("SET GLOBAL wsrep_slave_threads = 1")
    committed_past, codes = [], Counter()
    aborts_before = _aborts(cluster)
    try:
        for turn in range(3):
            resource = f"galera:guarded:{turn}"
            fence = _acquire(guarded, resource, "writer").lock.fence
            with guarded.app_context(), db.engine.connect() as conn:
                conn.execute(
                    text("CALL lockkeeper_guard(:resource, :fence)"),
                    {"resource": resource, "fence": fence},
                )
                conn.execute(
                    text("INSERT INTO guarded_writes (fence) VALUES (:fence)"),
                    {"fence": fence},
                )
                with cluster.nodes[1].connect() as node, node.cursor() as cursor:
                    cursor.execute(
                        "INSERT INTO ballast (pad)"
                        " SELECT REPEAT('x', 200) FROM seq_1_to_20000"
                    )
                with other.app_context():
                    lock_service().force_release(resource, actor="op", reason="#50")
                try:
                    conn.commit()
                    committed_past.append(fence)
                except OperationalError as exc:
                    codes[exc.orig.args[0]] += 1
    finally:
        with applier.connect() as node, node.cursor() as cursor:
            cursor.execute(f"SET GLOBAL wsrep_slave_threads = {int(threads)}")
            cursor.execute("DROP TABLE IF EXISTS ballast")
    measured = (
        f"aborted {dict(codes)}, {_aborts(cluster) - aborts_before} aborts on nodes"
    )
    print(measured)
    assert not committed_past, (
        f"guarded writes committed past a take-over: fences {committed_past}; "
        f"{measured}"
    )
    assert set(codes) == {1213}, codes


def test_a_follower_on_one_node_misses_no_event_committed_late_on_another(galera):
    """A follower reads node 0; a grant on node 1 draws its event's id and
    stays in its transaction while node 2 grants on. The follower's locking
    read waits only for inserts open on its own node: after ``HOLE_GRACE`` it
    took the missing id as rolled back, and the grant, committed later, was
    never read. It closes the hole now (a row written and deleted under the
    id, committed): node 1's transaction fails certification, its grant is
    retried under a new id, and the follower reads it."""
    cluster, apps = galera
    follower, slow, fast = apps
    # The grant on node 1 draws its event's id, then its transaction stays open
    # (what a stalled node, a flow-control pause or a slow commit do) while
    # node 2 goes on granting.
    drawn, go_on = threading.Event(), threading.Event()
    # Shared by the apps of a process (``statements_for``): only the grant of
    # ``galera:late`` is held.
    statements = slow.extensions["lockkeeper.locks"].statements
    insert_event = statements._insert_event

    late_ids: list[int] = []

    def held_insert_event(conn, params):
        insert_event(conn, params)
        if params["resource"] == "galera:late":
            late_ids.append(conn.cursor.lastrowid)
            drawn.set()
            go_on.wait(timeout=60)

    statements._insert_event = held_insert_event
    with follower.app_context():
        position = start_position(None)
    late = threading.Thread(target=_acquire, args=(slow, "galera:late", "late"))
    late.start()
    try:
        assert drawn.wait(timeout=30), "the late grant never drew its event"
        (late_id,) = late_ids
        # The uncommitted id is only in node 1's counter; node 2 draws its own.
        for turn in range(20):
            _acquire(fast, f"galera:early:{turn}", "early")
            with fast.app_context():
                if newest_event_id() > late_id:
                    break
        else:
            pytest.fail(f"node 2 drew no event id above {late_id}")
        seen = []
        deadline = time.monotonic() + HOLE_GRACE + 30
        while position.after <= late_id and time.monotonic() < deadline:
            with follower.app_context():
                found, position = follow_step(EventFilter(), position)
            seen.extend(found)
            time.sleep(0.1)
    finally:
        go_on.set()
        late.join()
        del statements._insert_event  # the class's again
    # The late grant is committed now (under its id, or retried under a new
    # one when the follower closed its id first): the follower reads on until
    # it has read past that event's id.
    deadline = time.monotonic() + HOLE_GRACE + 10
    while time.monotonic() < deadline:
        with follower.app_context():
            found, position = follow_step(EventFilter(), position)
            seen.extend(found)
            committed = newest_event_id("galera:late")
            if committed and position.after >= committed:
                break
        time.sleep(0.1)
    resources = [e.resource for e in seen]
    assert "galera:late" in resources, (
        f"event {late_id} (the late grant) missed; read ids "
        f"{[e.id for e in seen]} up to {position.after}"
    )


def test_a_follower_keeps_up_with_one_writing_node(galera):
    """Each node draws event ids at its own offset (3 apart with three nodes):
    one writing node leaves two missing ids after each of its events. A
    follower that waited out one hole at a time (``HOLE_GRACE``, 2 s) read one
    event per 2 s; it closes all of a window's holes at once."""
    _cluster, apps = galera
    writer = apps[0]
    with writer.app_context():
        position = start_position(None)
    wanted = {f"galera:stream:{n}" for n in range(20)}
    for resource in sorted(wanted):
        _acquire(writer, resource, "streamed")
    seen: set[str] = set()
    started = time.monotonic()
    deadline = started + 4 * HOLE_GRACE
    while wanted - seen and time.monotonic() < deadline:
        with writer.app_context():
            found, position = follow_step(EventFilter(), position)
        seen.update(event.resource for event in found)
        time.sleep(0.1)
    took = time.monotonic() - started
    assert not wanted - seen, f"{len(wanted - seen)} of 20 unread after {took:.1f} s"


def test_a_node_that_cannot_start_ends_the_start_at_once_with_its_log():
    _require_galera()
    cluster = GaleraCluster(nodes=1)
    arguments = cluster._arguments

    def broken(node, *, bootstrap):
        return [*arguments(node, bootstrap=bootstrap), "--no-such-option"]

    cluster._arguments = broken
    try:
        started = time.monotonic()
        with pytest.raises(ClusterError, match="galera0: mariadbd exited") as failure:
            cluster.start(timeout=180.0)
        assert time.monotonic() - started < 60, "waited for the deadline"
        assert "no-such-option" in str(failure.value)
    finally:
        cluster.close()


def test_a_semaphore_admits_no_more_holders_than_its_limit_across_nodes(galera):
    cluster, apps = galera
    first, slow, fast = apps
    resource = "galera:semaphore"
    with first.app_context():
        assert lock_service().acquire(resource, "h0", ttl=120, limit=2).acquired
    # Node 1 admits a holder and stays in its transaction while node 2 admits one.
    admitted, go_on = threading.Event(), threading.Event()
    statements = slow.extensions["lockkeeper.locks"].statements.transactional
    dequeue = statements._dequeue_waiter

    def held_dequeue(conn, waiter):
        dequeue(conn, waiter)
        # The apps of a process share their dialect's statements
        # (``statements_for``): only the first holder, node 1's, is held open.
        if not admitted.is_set():
            admitted.set()
            go_on.wait(timeout=60)

    statements._dequeue_waiter = held_dequeue
    results = {}

    def slow_acquire() -> None:
        with slow.app_context():
            results["slow"] = lock_service().acquire(resource, "h1", ttl=30, limit=2)

    thread = threading.Thread(target=slow_acquire)
    thread.start()
    try:
        assert admitted.wait(timeout=30), "node 1 never admitted its place"
        with fast.app_context():
            results["fast"] = lock_service().acquire(resource, "h2", ttl=30, limit=2)
    finally:
        go_on.set()
        thread.join(timeout=60)
        del statements._dequeue_waiter  # the class's again
    with cluster.nodes[0].connect() as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM lock_holders"
            " WHERE resource = %s AND expires_at > UTC_TIMESTAMP(6)",
            (resource,),
        )
        (holders,) = cursor.fetchone()
    granted = sorted(name for name, r in results.items() if r.acquired)
    assert holders <= 2, f"{holders} live places of 2 (granted: {granted})"


def test_a_short_fault_run_on_the_cluster_finds_no_violation(galera):
    """The history checker's run on this cluster, in a database of its own,
    with instance n writing through node n (multi-writer): the mutex,
    semaphore and shared-lock workloads while a node (any, its instance's
    database gone with it) and an app instance on another node are SIGKILLed,
    and the node rejoins by IST. Before the fences of grant events were a
    unique key (0040) a 30 s run of it handed a fence out twice, to two
    resources, around the node's rejoin. One writing node is the same run with
    fewer conflicts (``--galera-writers 1``, by hand; docs/deploy.md, "MariaDB
    Galera")."""
    cluster, _apps = galera
    config = RunConfig(
        database="galera",
        duration=15.0,
        workers=8,
        kill_every=(3.0, 6.0),
        database_restarts=1,
        galera_writers=3,
    )
    report = run(config, galera=cluster)
    print(json.dumps(report.stats, default=str))
    assert report.ok, report.violations
    (kill,) = report.stats["node_kills"]
    assert kill["transfer"] == "IST", kill


def test_a_short_fault_run_through_haproxy_finds_no_violation(galera):
    """The same run with every instance through HAProxy (``galera_proxy``),
    which sends every connection to galera0 while its check finds it Synced:
    galera0 is SIGKILLed (an instance with it), HAProxy fails over to galera1,
    and back to galera0 once it has rejoined. Beyond the history's checks,
    nothing acknowledged before either switch is missing afterwards, no fence
    after one is below a fence granted before it, every probe meanwhile was
    answered 503 problem+json or served, and every instance served again
    within 20 s of each switch (``checker.check_failovers``). By hand:
    ``--galera-proxy`` (docs/deploy.md, "MariaDB Galera")."""
    _require(haproxy_missing())
    cluster, _apps = galera
    config = RunConfig(
        database="galera",
        duration=15.0,
        workers=8,
        kill_every=(3.0, 6.0),
        database_restarts=1,
        # The failover's probes and recovery are its outage already.
        outage=1.0,
        galera_proxy=True,
    )
    report = run(config, galera=cluster)
    print(json.dumps(report.stats, default=str))
    assert report.ok, report.violations
    (kill,) = report.stats["node_kills"]
    assert (kill["node"], kill["fault"]) == ("galera0", "kill"), kill
    switches = [(s["kind"], s["old"], s["new"]) for s in report.stats["switches"]]
    assert switches == [
        ("failover (kill)", "galera0", "galera1"),
        ("failback", "galera1", "galera0"),
    ], report.stats["switches"]
