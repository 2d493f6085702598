"""The holder of a lock is the pair (API token, owner), decided by the same atomic
statement (PostgreSQL) or transaction (MariaDB, SQLite) as before; and a token's
quota of live locks."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from lockkeeper_core.errors import LockHeld, NotOwner, QuotaExceeded
from lockkeeper_core.models import DistributedLock, LockEvent
from sqlalchemy import select, update

from app import create_app
from app.auth.service import create_token
from app.extensions import db, lock_service

pytestmark = pytest.mark.usefixtures("backend")


def _acquire(client, resource="job:1", owner="w-1", ttl=60):
    return client.post(f"/api/v1/locks/{resource}", json={"owner": owner, "ttl": ttl})


def _renew(client, resource="job:1", owner="w-1", ttl=60):
    return client.patch(f"/api/v1/locks/{resource}", json={"owner": owner, "ttl": ttl})


def _release(client, resource="job:1", owner="w-1"):
    return client.delete(f"/api/v1/locks/{resource}?owner={owner}")


def _row(app, resource="job:1"):
    with app.app_context():
        return db.session.execute(
            select(DistributedLock.__table__).where(
                DistributedLock.resource == resource
            )
        ).one()


# -- the same owner string under another token is another owner -----------------


def test_the_same_owner_with_another_token_is_another_owner(api):
    granted = _acquire(api)
    assert granted.status_code == 200
    assert granted.get_json()["lock"]["token"] == "worker"
    before = _row(api.app)
    thief = api.with_token("thief")

    refused = _acquire(thief)
    assert refused.status_code == 409
    assert refused.get_json()["acquired"] is False
    assert refused.get_json()["lock"]["token"] == "worker"
    assert int(refused.headers["Retry-After"]) >= 59

    renewal = _renew(thief, ttl=86400)
    assert renewal.status_code == 409
    assert renewal.mimetype == "application/problem+json"
    release = _release(thief)
    assert release.status_code == 403
    assert release.mimetype == "application/problem+json"
    assert _row(api.app) == before  # nothing written, nothing moved

    # The holder itself still renews, re-acquires with the same fence, releases.
    assert _renew(api).status_code == 200
    again = _acquire(api).get_json()
    assert (again["acquired"], again["lock"]["fence"]) == (True, before.fence)
    assert _release(api).status_code == 204


def test_a_re_acquire_keeps_the_fence_only_for_the_same_token(api, clock):
    first = _acquire(api).get_json()["lock"]
    other = api.with_token("other")
    assert _acquire(other).status_code == 409
    clock.advance(61)  # expired: the other token takes it over, with a new fence
    taken = _acquire(other).get_json()
    assert taken["acquired"] is True
    assert taken["lock"]["token"] == "other"
    assert taken["lock"]["fence"] > first["fence"]
    # The first token comes back with the same owner: refused now.
    assert _acquire(api).status_code == 409
    assert _renew(api).status_code == 409
    assert _release(api).status_code == 403


def test_events_record_the_token(api):
    _acquire(api)
    _renew(api)
    _release(api)
    events = api.get("/api/v1/locks/job:1/events").get_json()["events"]
    assert [(e["action"], e["actor"], e["token"]) for e in events] == [
        ("released", "worker", "worker"),
        ("renewed", "worker", "worker"),
        ("acquired", "worker", "worker"),
    ]


def test_a_lock_from_before_tokens_works_for_any_token_with_its_owner(api):
    """A grant recorded with no token (made before the migration) keeps working
    for its owner under any token until it ends; then the token binds."""
    assert _acquire(api).status_code == 200
    with api.app.app_context():
        db.session.execute(update(DistributedLock).values(token=None))
        db.session.commit()
    fence = _row(api.app).fence
    assert api.get("/api/v1/locks/job:1").get_json()["token"] is None
    other = api.with_token("other")
    assert _renew(other).status_code == 200
    assert _acquire(api, owner="w-2").status_code == 409  # another owner is not
    regranted = _acquire(other).get_json()
    assert regranted["acquired"] is True
    assert regranted["lock"]["fence"] == fence  # a re-acquire of the same holder
    assert regranted["lock"]["token"] == "other"  # ... which now binds the token
    assert _renew(api).status_code == 409
    assert _release(other).status_code == 204


# -- operator claims bound to a token, or to none ----------------------------------


def test_a_claim_for_a_token_is_renewed_and_released_by_that_token_only(api):
    other = api.with_token("other")
    with api.app.app_context():
        lock = lock_service().claim(
            "job:1", "w-1", 60, actor="olga", reason="hand over", for_token="worker"
        )
    assert lock.token == "worker"
    assert _renew(other).status_code == 409
    assert _release(other).status_code == 403
    assert _renew(api).status_code == 200
    assert _release(api).status_code == 204
    events = api.get("/api/v1/locks/job:1/events").get_json()["events"]
    claimed = events[-1]
    assert (claimed["action"], claimed["actor"], claimed["token"]) == (
        "claimed",
        "olga",
        "worker",
    )


def test_a_claim_for_no_token_is_ended_by_an_operator_only(api):
    with api.app.app_context():
        lock = lock_service().claim("job:1", "w-1", 60, actor="olga", reason="mine")
    assert lock.token is None
    shown = api.get("/api/v1/locks/job:1").get_json()
    assert (shown["owner"], shown["token"]) == ("w-1", None)
    assert _acquire(api).status_code == 409
    assert _renew(api).status_code == 409
    assert _release(api).status_code == 403
    with api.app.app_context():
        released = lock_service().force_release("job:1", actor="olga", reason="done")
    assert released.owner == "w-1"
    assert _acquire(api).status_code == 200


def test_a_claim_names_a_live_token_or_is_refused(api):
    from lockkeeper_core.errors import InvalidInput

    from app.auth.service import revoke_token

    api.with_token("leaver")
    with api.app.app_context():
        revoke_token("leaver")
        for name in ("nobody", "leaver"):
            with pytest.raises(InvalidInput) as refused:
                lock_service().claim("job:1", "w", 60, actor="olga", for_token=name)
            assert refused.value.errors[0][0] == "for_token"
    assert api.get("/api/v1/locks/job:1").status_code == 404


def test_claiming_for_the_same_owner_under_another_token_needs_force(api):
    _acquire(api)
    api.with_token("other")
    with api.app.app_context():
        service = lock_service()
        with pytest.raises(LockHeld):
            service.claim("job:1", "w-1", 60, actor="olga", for_token="other")
        lock = service.claim(
            "job:1",
            "w-1",
            60,
            actor="olga",
            reason="move",
            force=True,
            for_token="other",
        )
    assert lock.token == "other"


# -- quotas ---------------------------------------------------------------------


def test_a_token_over_its_quota_gets_429_and_its_own_locks_go_on(api, clock):
    capped = api.with_token("capped", max_locks=2)
    assert _acquire(capped, "job:1", ttl=60).status_code == 200
    assert _acquire(capped, "job:2", ttl=100).status_code == 200
    refused = _acquire(capped, "job:3")
    assert refused.status_code == 429
    assert refused.mimetype == "application/problem+json"
    assert refused.headers["Retry-After"] == "60"  # the soonest of its locks
    assert api.get("/api/v1/locks/job:3").status_code == 404  # nothing written
    # Renewals and re-acquires of its own locks are never refused for the quota.
    assert _renew(capped, "job:1", ttl=120).status_code == 200
    assert _acquire(capped, "job:2", ttl=100).get_json()["acquired"] is True
    # A released lock frees a holder; an expired one too.
    assert _release(capped, "job:1").status_code == 204
    assert _acquire(capped, "job:3").status_code == 200
    assert _acquire(capped, "job:4").status_code == 429
    clock.advance(101)  # job:2 and job:3 have expired
    assert _acquire(capped, "job:4").status_code == 200
    # Another token has its own quota.
    assert _acquire(api, "job:5").status_code == 200


def test_taking_over_a_stale_lock_counts_against_the_quota(api, clock):
    capped = api.with_token("capped", max_locks=1)
    assert _acquire(capped, "job:1", ttl=10).status_code == 200
    assert _acquire(api, "job:2", ttl=10).status_code == 200
    clock.advance(11)
    assert _acquire(capped, "job:3", ttl=60).status_code == 200
    assert _acquire(capped, "job:2").status_code == 429  # a take-over: a new grant
    assert _acquire(capped, "job:1").status_code == 429  # its own, but expired


def test_a_quota_of_zero_is_no_limit(make_app):
    app = make_app(LOCKKEEPER_MAX_LOCKS_PER_TOKEN=0)
    from tests.conftest import ApiClient

    client = ApiClient(app)
    for number in range(5):
        assert _acquire(client, f"job:{number}").status_code == 200


# -- races between real threads: two tokens, one owner string ---------------------


def _app_on(database_url, tmp_path):
    return create_app(
        {
            "LOCKKEEPER_DATABASE_URL": database_url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
            "SQLALCHEMY_ENGINE_OPTIONS": {"pool_size": 10, "max_overflow": 20},
        }
    )


ROUNDS = 10
PER_TOKEN = 4


@pytest.mark.connections(32)  # the pool (10 + 20) and the listener
def test_two_tokens_with_one_owner_string_race_and_one_wins(database_url, tmp_path):
    """Threads of two tokens send the same owner at once, on a free, then a stale
    lock: exactly one token holds it after each round, the other's acquires,
    renewals and releases are all refused, and the winner's fence is new."""
    app = _app_on(database_url, tmp_path)
    with app.app_context():
        for name in ("alpha", "beta"):
            create_token(name)
    tokens = ["alpha"] * PER_TOKEN + ["beta"] * PER_TOKEN
    last_fence = 0
    try:
        for round_number in range(ROUNDS):
            barrier = threading.Barrier(len(tokens))

            def contend(token, barrier=barrier):
                with app.app_context():
                    barrier.wait()
                    service = lock_service()
                    result = service.acquire(
                        "race:1", "host-1", ttl=30, actor=token, token=token
                    )
                    outcomes = [("acquire", result.acquired)]
                    try:
                        service.renew("race:1", "host-1", ttl=30, token=token)
                        outcomes.append(("renew", True))
                    except NotOwner:
                        outcomes.append(("renew", False))
                    return (
                        token,
                        outcomes,
                        result.lock.fence if result.acquired else None,
                    )

            with ThreadPoolExecutor(len(tokens)) as pool:
                results = list(pool.map(contend, tokens))
            winners = {token for token, outcomes, _ in results if outcomes[0][1]}
            assert len(winners) == 1, results
            (winner,) = winners
            for token, outcomes, _fence in results:
                expected = token == winner
                assert outcomes == [("acquire", expected), ("renew", expected)]
            fences = {fence for _, _, fence in results if fence is not None}
            # The winner's threads share one grant: re-acquires keep its fence.
            assert len(fences) == 1
            (fence,) = fences
            assert fence > last_fence
            last_fence = fence
            loser = "beta" if winner == "alpha" else "alpha"
            with app.app_context():
                service = lock_service()
                assert service.get("race:1").token == winner
                with pytest.raises(NotOwner):
                    service.release("race:1", "host-1", token=loser)
                if round_number % 2:
                    service.release("race:1", "host-1", token=winner)
                else:  # leave it to go stale: the next round is a take-over
                    service.renew("race:1", "host-1", ttl=0.001, token=winner)
                    _wait_until_stale(service)
        with app.app_context():
            events = list(
                db.session.scalars(
                    select(LockEvent)
                    .where(LockEvent.action.in_(("acquired", "took_over")))
                    .order_by(LockEvent.id)
                )
            )
            assert len(events) == ROUNDS
            assert all(event.token == event.actor for event in events)
    finally:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()


def _wait_until_stale(service, deadline_seconds: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if service.get("race:1", include_stale=True).state.value == "stale":
            return
        time.sleep(0.005)
    raise AssertionError("the lock did not go stale")


@pytest.mark.connections(32)  # the pool (10 + 20) and the listener
def test_quota_refusals_under_a_race_write_nothing(database_url, tmp_path):
    """Many threads of one capped token acquire different resources at once: at
    least the quota is granted, every refusal is a QuotaExceeded that wrote
    nothing, and each grant has exactly one event."""
    app = _app_on(database_url, tmp_path)
    with app.app_context():
        create_token("capped", max_locks=3)
    threads = 8
    barrier = threading.Barrier(threads)

    def contend(number):
        with app.app_context():
            barrier.wait()
            try:
                lock_service().acquire(
                    f"q:{number}", "w", ttl=30, token="capped", max_locks=3
                )
            except QuotaExceeded:
                return False
            return True

    try:
        with ThreadPoolExecutor(threads) as pool:
            granted = sum(pool.map(contend, range(threads)))
        with app.app_context():
            rows = db.session.scalars(
                select(DistributedLock.resource).where(
                    DistributedLock.owner.is_not(None)
                )
            ).all()
            events = db.session.scalars(select(LockEvent.resource)).all()
        # The count is not serialised between resources: concurrent first grants
        # may each see room (the quota bounds abuse, it is not a semaphore).
        assert 3 <= granted <= threads
        assert len(rows) == granted
        assert sorted(events) == sorted(rows)
    finally:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()


# -- the operator's faces: CLI and dashboard --------------------------------------


def test_cli_claim_binds_to_a_token_or_to_none(api):
    runner = api.app.test_cli_runner()
    bound = runner.invoke(
        args=[
            "locks",
            "claim",
            "job:1",
            "--owner",
            "w-1",
            "--for-token",
            "worker",
            "--reason",
            "hand over",
            "--ttl",
            "60",
        ]
    )
    assert bound.exit_code == 0, bound.output
    assert "token 'worker'" in bound.output
    assert _renew(api).status_code == 200
    header, row = (
        line.split("\t")
        for line in runner.invoke(args=["locks", "list"]).stdout.splitlines()
    )
    assert dict(zip(header, row, strict=True))["token"] == "worker"

    held = runner.invoke(
        args=["locks", "claim", "job:1", "--owner", "w-1", "--reason", "mine"]
    )
    assert held.exit_code != 0
    assert "--force" in held.output
    unbound = runner.invoke(
        args=["locks", "claim", "job:1", "--owner", "w-1", "--reason", "x", "--force"]
    )
    assert unbound.exit_code == 0, unbound.output
    assert "no token" in unbound.output
    assert _renew(api).status_code == 409
    assert _release(api).status_code == 403

    unknown = runner.invoke(
        args=[
            "locks",
            "claim",
            "job:2",
            "--owner",
            "w",
            "--for-token",
            "nobody",
            "--reason",
            "x",
        ]
    )
    assert unknown.exit_code != 0
    assert "for_token" in unknown.output


def test_dashboard_claim_for_a_token_and_the_token_on_the_pages(api):
    from tests.dashboard_helpers import csrf_token, log_in, make_user, soup

    make_user(api.app, "olga", "operator")
    browser = api.app.test_client()
    log_in(browser, "olga")
    form = soup(browser.get("/locks/job:1/claim"))
    assert form.find("input", attrs={"name": "for_token"}) is not None

    def claim(**fields):
        data = {
            "owner": "w-1",
            "ttl": "60",
            "reason": "r",
            "csrf_token": csrf_token(browser, "/"),
        }
        return browser.post("/locks/job:1/claim", data={**data, **fields})

    refused = claim(for_token="nobody")
    assert refused.status_code == 400
    assert "nobody" in soup(refused).get_text()
    assert claim(for_token="worker").status_code == 303
    assert _renew(api).status_code == 200
    page = soup(browser.get("/locks/job:1")).get_text(" ", strip=True)
    assert "Token worker" in page
    overview = soup(browser.get("/"))
    headers = [th.get_text(strip=True) for th in overview.select("table.locks th")]
    assert "Token" in headers
    assert overview.select_one("table.locks td.token").get_text(strip=True) == "worker"
    history = soup(browser.get("/locks/job:1")).select_one("table.events").get_text()
    assert "olga" in history
    assert "for token worker" in history
