"""An operator force-releases one grant of a resource held by holders, by the
fence confirmed: that holder alone ends (one event), the others stay; a fence no
grant carries any more is refused and names the grant there now. Every database."""

from __future__ import annotations

import threading
import time

import pytest
from lockkeeper_core.errors import (
    HeldByHolders,
    InvalidInput,
    LockChanged,
    LockNotFound,
    QuotaExceeded,
    ResourceFrozen,
)
from lockkeeper_core.state import Action

from app.auth.service import create_token
from app.extensions import lock_service
from tests.dashboard_helpers import post, soup
from tests.test_holders import events_of, holders_of

pytestmark = pytest.mark.usefixtures("backend")


def grant(service, resource, owner, **kwargs):
    result = service.acquire(resource, owner, ttl=30, **kwargs)
    assert result.acquired
    return result.lock


def test_one_holder_force_released_by_its_fence(service, clock):
    fences = [grant(service, "sem:op", f"w-{n}", limit=3).fence for n in (1, 2, 3)]
    clock.advance(5)
    ended = service.force_release_holder(
        "sem:op", fences[1], actor="olga", reason="wedged"
    )
    assert (ended.owner, ended.fence, ended.mode) == ("w-2", fences[1], "exclusive")
    left = service.holders("sem:op").holders
    assert [(h.owner, h.fence) for h in left] == [
        ("w-1", fences[0]),
        ("w-3", fences[2]),
    ]
    forced = [e for e in events_of("sem:op") if e.action == Action.FORCE_RELEASED]
    assert [(e.owner, e.fence, e.actor, e.reason, e.mode) for e in forced] == [
        ("w-2", fences[1], "olga", "wedged", "exclusive")
    ]
    # The freed place is taken again.
    assert grant(service, "sem:op", "w-4", limit=3).fence > fences[2]


def test_a_shared_grant_force_released_leaves_the_other_readers(service):
    first = grant(service, "rw:op", "r-1", mode="shared")
    second = grant(service, "rw:op", "r-2", mode="shared")
    service.force_release_holder("rw:op", first.fence, actor="olga", reason="stuck")
    assert [h.fence for h in service.holders("rw:op").holders] == [second.fence]
    forced = [e for e in events_of("rw:op") if e.action == Action.FORCE_RELEASED]
    assert [(e.owner, e.mode) for e in forced] == [("r-1", "shared")]


def test_a_changed_fence_is_refused_and_named(service):
    first = grant(service, "sem:gone", "w-1", limit=2)
    second = grant(service, "sem:gone", "w-2", limit=2)
    service.release("sem:gone", "w-1")
    with pytest.raises(LockChanged) as refused:
        service.force_release_holder(
            "sem:gone", first.fence, actor="olga", reason="late"
        )
    assert refused.value.expected_fence == first.fence
    assert (refused.value.holder.owner, refused.value.holder.fence) == (
        "w-2",
        second.fence,
    )
    assert str(first.fence) in str(refused.value)
    assert [h.fence for h in service.holders("sem:gone").holders] == [second.fence]
    assert not [e for e in events_of("sem:gone") if e.action == Action.FORCE_RELEASED]
    with pytest.raises(LockChanged) as nobody:
        service.force_release_holder("sem:none", 7, actor="olga", reason="x")
    assert nobody.value.holder is None


@pytest.mark.parametrize(
    ("fence", "reason", "field"),
    [(3, "", "reason"), (3, None, "reason"), (0, "r", "fence"), (None, "r", "fence")],
)
def test_a_reason_and_a_fence_are_required(service, fence, reason, field):
    grant(service, "sem:bad", "w-1", limit=2)
    with pytest.raises(InvalidInput) as refused:
        service.force_release_holder("sem:bad", fence, actor="olga", reason=reason)
    assert field in [name for name, _ in refused.value.errors]
    assert len(service.holders("sem:bad").holders) == 1


# -- every grant at once ---------------------------------------------------------


def forced_events(resource):
    return [
        (e.owner, e.fence, e.mode, e.actor, e.reason)
        for e in events_of(resource)
        if e.action == Action.FORCE_RELEASED
    ]


def test_force_release_all_ends_every_holder_one_event_each(service):
    fences = [grant(service, "sem:all", f"w-{n}", limit=3).fence for n in (1, 2, 3)]
    done = service.force_release_all("sem:all", actor="olga", reason="drain")
    assert sorted(lock.fence for lock in done.released) == fences
    assert (done.left_alone, done.gone) == ([], [])
    assert service.holders("sem:all").holders == []
    assert sorted(forced_events("sem:all")) == [
        (f"w-{n}", fence, "exclusive", "olga", "drain")
        for n, fence in zip((1, 2, 3), fences, strict=True)
    ]
    # Free again: an exclusive lock may take it at once.
    assert service.acquire("sem:all", "solo", ttl=30).acquired


def test_force_release_all_ends_shared_grants_and_an_exclusive_grant(service):
    readers = [grant(service, "rw:all", f"r-{n}", mode="shared") for n in (1, 2)]
    done = service.force_release_all("rw:all", actor="olga", reason="x")
    assert {(lock.owner, lock.mode) for lock in done.released} == {
        ("r-1", "shared"),
        ("r-2", "shared"),
    }
    assert sorted(e[:3] for e in forced_events("rw:all")) == [
        ("r-1", readers[0].fence, "shared"),
        ("r-2", readers[1].fence, "shared"),
    ]
    held = grant(service, "job:all", "w-1")
    done = service.force_release_all(
        "job:all", actor="olga", reason="y", fences=[held.fence]
    )
    assert [(lock.owner, lock.fence) for lock in done.released] == [("w-1", held.fence)]
    assert forced_events("job:all") == [("w-1", held.fence, "exclusive", "olga", "y")]
    with pytest.raises(LockNotFound):
        service.force_release_all("job:all", actor="olga", reason="again")


def test_a_grant_taken_since_the_confirmation_is_left_alone(service):
    first = grant(service, "sem:seen", "w-1", limit=3)
    gone = grant(service, "sem:seen", "w-2", limit=3)
    confirmed = [h.fence for h in service.holders("sem:seen").holders]
    service.release("sem:seen", "w-2")
    newer = grant(service, "sem:seen", "w-3", limit=3)
    done = service.force_release_all(
        "sem:seen", actor="olga", reason="drain", fences=confirmed
    )
    assert [lock.fence for lock in done.released] == [first.fence]
    assert [(lock.owner, lock.fence) for lock in done.left_alone] == [
        ("w-3", newer.fence)
    ]
    assert done.gone == [gone.fence]
    assert [h.fence for h in service.holders("sem:seen").holders] == [newer.fence]
    assert [e[1] for e in forced_events("sem:seen")] == [first.fence]


@pytest.mark.parametrize(
    ("fences", "reason", "field"),
    [(None, " ", "reason"), ([], "r", "fence"), ([0], "r", "fence")],
)
def test_force_release_all_needs_a_reason_and_real_fences(
    service, fences, reason, field
):
    grant(service, "sem:bad", "w-1", limit=2)
    with pytest.raises(InvalidInput) as refused:
        service.force_release_all("sem:bad", actor="olga", reason=reason, fences=fences)
    assert field in [name for name, _ in refused.value.errors]
    assert len(service.holders("sem:bad").holders) == 1


# -- races, real threads on the real clock -----------------------------------------

RACE_SECONDS = 2.0
RACE_DEADLINE = 30.0


@pytest.fixture
def race_app(make_app):
    """Connections for every thread, so none queues on the pool."""
    return make_app(SQLALCHEMY_ENGINE_OPTIONS={"pool_size": 10, "max_overflow": 10})


def run_threads(*targets) -> None:
    errors: list[BaseException] = []

    def run(target) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_release_all_racing_new_holders_leaves_no_grant_without_its_event(race_app):
    """Workers take holders while an operator releases every grant, over and
    over: each grant ever made either is still a holder or has exactly one
    force_released event, never both, never neither."""
    resource = "race:all"
    started = time.monotonic()
    granted: list[int] = []
    released: list[int] = []

    def going() -> bool:
        elapsed = time.monotonic() - started
        enough = len(granted) >= 40 and len(released) >= 20
        return elapsed < RACE_DEADLINE and (elapsed < RACE_SECONDS or not enough)

    def worker(number: int):
        def run() -> None:
            with race_app.app_context():
                service = lock_service()
                attempt = 0
                while going():
                    attempt += 1
                    owner = f"w{number}-{attempt}"
                    result = service.acquire(resource, owner, ttl=60, limit=8)
                    if result.acquired:
                        granted.append(result.lock.fence)

        return run

    def operator() -> None:
        with race_app.app_context():
            service = lock_service()
            while going():
                try:
                    done = service.force_release_all(
                        resource, actor="olga", reason="drain"
                    )
                except LockNotFound:
                    continue
                released.extend(lock.fence for lock in done.released)

    run_threads(operator, *(worker(n) for n in range(4)))
    with race_app.app_context():
        events = [(e.action, e.fence) for e in events_of(resource)]
        live = [holder_row.fence for holder_row in holders_of(resource)]
    made = [fence for action, fence in events if action == Action.ACQUIRED]
    forced = [fence for action, fence in events if action == Action.FORCE_RELEASED]
    assert sorted(made) == sorted(granted)
    assert len(forced) == len(set(forced)) == len(released) >= 20
    assert not set(forced) & set(live)
    assert sorted(forced + live) == sorted(made)


def test_a_holder_granted_while_release_all_runs_outlives_stale_fences(race_app):
    """The confirmation is read, then a new holder and the release race: in
    either order the new holder carries a fence the operator never confirmed
    and stays."""
    resource = "race:seen"
    with race_app.app_context():
        service = lock_service()
        for round_number in range(12):
            for n in (1, 2):
                assert service.acquire(
                    resource, f"base-{round_number}-{n}", ttl=60, limit=8
                ).acquired
            confirmed = [h.fence for h in service.holders(resource).holders]
            barrier = threading.Barrier(2)
            outcome: dict[str, object] = {}

            def release(confirmed=confirmed, barrier=barrier, outcome=outcome):
                with race_app.app_context():
                    barrier.wait(timeout=30)
                    outcome["done"] = lock_service().force_release_all(
                        resource, actor="olga", reason="drain", fences=confirmed
                    )

            def newcomer(number=round_number, barrier=barrier, outcome=outcome):
                with race_app.app_context():
                    barrier.wait(timeout=30)
                    outcome["new"] = lock_service().acquire(
                        resource, f"new-{number}", ttl=60, limit=8
                    )

            run_threads(release, newcomer)
            new = outcome["new"].lock
            assert outcome["new"].acquired
            assert sorted(g.fence for g in outcome["done"].released) == confirmed
            assert [h.fence for h in service.holders(resource).holders] == [new.fence]
            forced = [
                e.fence
                for e in events_of(resource)
                if e.action == Action.FORCE_RELEASED
            ]
            assert new.fence not in forced
            service.release(resource, f"new-{round_number}")


# -- the dashboard and the CLI -------------------------------------------------------


def test_the_lock_page_releases_all_holders_it_showed(operator, service):
    for n in (1, 2, 3):
        grant(service, "sem:page", f"w-{n}", limit=4)
    page = soup(operator.get("/locks/sem:page"))
    button = page.find(id="lock-release-all")
    assert button.get_text(strip=True) == "Release all 3 holders…"
    form = soup(operator.get(button["href"]))
    # A reason is asked for: a usual one picked, or typed (either will do, so
    # neither field is required by itself; a post with neither is a 400).
    assert form.find("select", attrs={"name": "reason_choice"}) is not None
    assert form.find("textarea", attrs={"name": "reason"}) is not None
    shown = [int(i["value"]) for i in form.find_all("input", attrs={"name": "fence"})]
    assert sorted(shown) == sorted(h.fence for h in service.holders("sem:page").holders)
    action = form.find("textarea").find_parent("form")["action"]
    refused = post(operator, action, {"reason": " ", "fence": shown})
    assert refused.status_code == 400
    assert len(service.holders("sem:page").holders) == 3
    # Between the confirmation and the post: one leaves, another comes.
    service.release("sem:page", "w-2")
    newer = grant(service, "sem:page", "w-4", limit=4)
    done = post(operator, action, {"reason": "drain", "fence": shown}, htmx=True)
    assert done.status_code == 200
    message = soup(done).get_text(" ", strip=True)
    assert "Released 2 grants of sem:page" in message
    assert f"Left alone, taken since you looked: w-4 (fence {newer.fence})" in message
    assert [h.owner for h in service.holders("sem:page").holders] == ["w-4"]
    assert sorted(e[0] for e in forced_events("sem:page")) == ["w-1", "w-3"]
    # The same confirmation again: every grant it showed has ended.
    again = post(operator, action, {"reason": "again", "fence": shown}, htmx=True)
    assert again.status_code == 409
    form = soup(again)
    assert "Released 0 grants" in form.get_text(" ", strip=True)
    assert [
        int(i["value"]) for i in form.find_all("input", attrs={"name": "fence"})
    ] == [newer.fence]
    assert [h.owner for h in service.holders("sem:page").holders] == ["w-4"]
    bad = post(operator, action, {"reason": "x", "fence": "²"})
    assert bad.status_code == 400
    assert post(operator, action, {"reason": "x"}).status_code == 400
    assert [h.owner for h in service.holders("sem:page").holders] == ["w-4"]


def test_the_whole_lock_release_form_shows_the_holders_of_a_holder_held_resource(
    operator, service
):
    """/locks/<resource>/release confirms one exclusive grant. Of a resource
    held by holders it said "not locked" (404), and posted "already released"
    while three grants stayed: it now shows the holders' confirmation, every
    grant with its fence, and releases them from there."""
    for n in (1, 2, 3):
        grant(service, "sem:old", f"w-{n}", limit=3)
    shown = operator.get("/locks/sem:old/release")
    assert shown.status_code == 200
    form = soup(shown)
    fences = [int(i["value"]) for i in form.find_all("input", attrs={"name": "fence"})]
    assert sorted(fences) == sorted(h.fence for h in service.holders("sem:old").holders)
    action = form.find("textarea").find_parent("form")["action"]
    assert action == "/locks/sem:old/holders/release"
    done = post(operator, action, {"reason": "drain", "fence": fences}, htmx=True)
    assert "Released 3 grants of sem:old" in soup(done).get_text(" ", strip=True)
    assert service.holders("sem:old").holders == []


def test_the_whole_lock_release_posted_for_holders_releases_nothing_and_says_so(
    operator, service
):
    """The lock page showed one exclusive grant; before the post its holder
    turned it into a shared grant (the same fence) and a reader joined. The
    post releases nothing (the confirmation was of one lock, not of the
    grants there now): 409 naming how many hold it, with their form."""
    writer = grant(service, "rw:old", "w")
    form = soup(operator.get("/locks/rw:old/release"))
    assert form.find("input", attrs={"name": "fence"})["value"] == str(writer.fence)
    grant(service, "rw:old", "w", mode="shared")  # demoted: the same fence
    grant(service, "rw:old", "r", mode="shared")
    for htmx in (False, True):
        refused = post(
            operator,
            "/locks/rw:old/release",
            {"reason": "stuck", "fence": str(writer.fence)},
            htmx=htmx,
        )
        assert refused.status_code == 409
        page = soup(refused)
        text = page.get_text(" ", strip=True)
        assert "rw:old is held by 2 grants at once" in text
        assert "nothing was released" in text
        assert sorted(
            int(i["value"]) for i in page.find_all("input", attrs={"name": "fence"})
        ) == sorted(h.fence for h in service.holders("rw:old").holders)
        assert page.find("textarea", attrs={"name": "reason"}).get_text() == "stuck"
    assert sorted(h.owner for h in service.holders("rw:old").holders) == ["r", "w"]
    assert forced_events("rw:old") == []


def test_the_whole_lock_release_of_a_free_resource_is_still_not_found(operator):
    assert operator.get("/locks/free:old/release").status_code == 404
    gone = post(operator, "/locks/free:old/release", {"reason": "x", "fence": "1"})
    assert gone.status_code == 404


def test_release_the_matching_of_a_host_releases_its_holders_and_shared_grants(
    operator, service
):
    """A host's grants are an exclusive lock, two holders of a semaphore (a
    third is another host's) and a shared grant beside another host's. The
    host's "Release its…" confirmation names each of its grants by fence (it
    named the resources but released the exclusive lock only, reporting the
    others 'nobody holds it now'); posted, each ends by its fence, one event
    each, the other hosts' grants stay, and a holder that changed hands since
    the confirmation is left alone and reported."""
    exclusive = grant(service, "job:x", "batch-07:1:a")
    holder_rows = [
        grant(service, "sem:h", f"batch-07:{n}:b", limit=3, token="ci") for n in (1, 2)
    ]
    grant(service, "sem:h", "web-1:1:c", limit=3, token="ci")
    shared = grant(service, "rw:h", "batch-07:3:d", mode="shared")
    grant(service, "rw:h", "web-1:2:e", mode="shared")
    hosts = soup(operator.get("/?group=host"))
    [link] = [
        a for a in hosts.select("#groups-table td.actions a") if "batch-07" in a.text
    ]
    confirm = soup(operator.get(link["href"]))
    assert confirm.find("h2").get_text() == "Force release 4 grants of 3 locks?"
    shown = [i["value"] for i in confirm.select("form input[name=lock]")]
    ours = [exclusive, *holder_rows, shared]
    assert sorted(shown) == sorted(f"{g.fence}:{g.resource}" for g in ours)
    # Meanwhile batch-07:2's holder is released and taken by another worker.
    service.release("sem:h", "batch-07:2:b", token="ci")
    newer = grant(service, "sem:h", "web-3:1:f", limit=3, token="ci")
    response = post(
        operator,
        "/release-many",
        {"lock": shown, "reason": "host died", "confirm_count": "4"},
        htmx=True,
    )
    assert response.status_code == 200
    text = soup(response).get_text(" ", strip=True)
    assert "Force-released 3 locks." in text
    assert (
        "Left alone 1 that changed hands: sem:h (now held by web-1:1:c" in text
        or "Left alone 1 that changed hands: sem:h (now held by web-3:1:f" in text
    )
    assert sorted(h.owner for h in service.holders("sem:h").holders) == [
        "web-1:1:c",
        "web-3:1:f",
    ]
    assert [h.owner for h in service.holders("rw:h").holders] == ["web-1:2:e"]
    with pytest.raises(LockNotFound):
        service.get("job:x")
    released = {
        (e.resource, e.owner, e.fence, e.mode)
        for e in events_of("job:x") + events_of("sem:h") + events_of("rw:h")
        if e.action == Action.FORCE_RELEASED
    }
    assert released == {
        ("job:x", "batch-07:1:a", exclusive.fence, "exclusive"),
        ("sem:h", "batch-07:1:b", holder_rows[0].fence, "exclusive"),
        ("rw:h", "batch-07:3:d", shared.fence, "shared"),
    }
    assert newer.fence not in {fence for _, _, fence, _ in released}


def test_release_many_counts_the_grants_and_the_locks_it_released(operator, service):
    """Three grants of two locks (two holders of a semaphore, an exclusive
    lock) released together are reported as such, not as three locks; as
    many grants as locks are counted as locks."""
    holder_rows = [grant(service, "sem:count", f"w-{n}", limit=3) for n in (1, 2)]
    exclusive = grant(service, "job:count", "w-3")
    chosen = [f"{g.fence}:{g.resource}" for g in (*holder_rows, exclusive)]
    response = post(
        operator,
        "/release-many",
        {"lock": chosen, "reason": "r", "confirm_count": "3"},
        htmx=True,
    )
    assert response.status_code == 200
    text = soup(response).get_text(" ", strip=True)
    assert "Force-released 3 grants of 2 locks." in text
    assert service.holders("sem:count").holders == []
    one = grant(service, "job:count", "w-4")
    response = post(
        operator,
        "/release-many",
        {"lock": [f"{one.fence}:job:count"], "reason": "r"},
        htmx=True,
    )
    assert "Force-released 1 lock." in soup(response).get_text(" ", strip=True)


def test_release_many_checks_every_selected_grant_before_it_changes_any(
    operator, service
):
    """A bad row among the selected ones is a 400 before any grant ends (the
    lock before it was released, then the bad one refused)."""
    kept = grant(service, "job:chk", "w-1")
    holder_row = grant(service, "sem:chk", "w-2", limit=2)
    bad = post(
        operator,
        "/release-many",
        {
            "lock": [
                f"{kept.fence}:job:chk",
                f"{holder_row.fence}:sem:chk",
                f"1:{'x' * 300}",
            ],
            "reason": "r",
            "confirm_count": "3",
        },
    )
    assert bad.status_code == 400
    assert service.get("job:chk").owner == "w-1"
    assert [h.owner for h in service.holders("sem:chk").holders] == ["w-2"]


def test_a_viewer_has_no_release_all(viewer, service):
    grant(service, "sem:view", "w-1", limit=2)
    page = soup(viewer.get("/locks/sem:view"))
    assert page.find(id="lock-release-all") is None
    assert viewer.get("/locks/sem:view/holders/release").status_code == 403


def test_the_cli_releases_every_grant_or_the_fences_named(fake_app, service):
    cli = fake_app.test_cli_runner()
    fences = [grant(service, "sem:cli", f"w-{n}", limit=3).fence for n in (1, 2, 3)]
    service.release("sem:cli", "w-3")
    result = cli.invoke(
        args=["locks", "release", "sem:cli", "--reason", "x"]
        + ["--fence", str(fences[0]), "--fence", str(fences[2])]
    )
    assert result.exit_code == 3, result.output
    assert f"Force-released 'sem:cli' (owner 'w-1', fence {fences[0]})." in (
        result.output
    )
    assert f"carries fence {fences[2]} any more" in result.output
    assert f"held by 'w-2' with fence {fences[1]}" in result.output
    result = cli.invoke(args=["locks", "release", "sem:cli", "--reason", "x"])
    assert result.exit_code == 0, result.output
    assert f"(owner 'w-2', fence {fences[1]})." in result.output
    assert service.holders("sem:cli").holders == []
    result = cli.invoke(args=["locks", "release", "sem:cli", "--reason", "x"])
    assert result.exit_code == 1


# -- an operator's claim of one holder ---------------------------------------------


def claimed_events(resource):
    return [
        (e.owner, e.fence, e.mode, e.actor, e.reason)
        for e in events_of(resource)
        if e.action == Action.CLAIMED
    ]


def test_a_claim_takes_one_free_place_of_a_semaphore(service):
    theirs = [grant(service, "sem:claim", f"w-{n}", limit=3) for n in (1, 2)]
    claimed = service.claim(
        "sem:claim", "operator:olga", 60, actor="olga", reason="probe"
    )
    assert (claimed.owner, claimed.mode, claimed.limit, claimed.holders) == (
        "operator:olga",
        "exclusive",
        3,
        3,
    )
    assert claimed.fence > theirs[1].fence
    assert sorted((h.owner, h.fence) for h in service.holders("sem:claim").holders) == [
        ("operator:olga", claimed.fence),
        ("w-1", theirs[0].fence),
        ("w-2", theirs[1].fence),
    ]
    assert claimed_events("sem:claim") == [
        ("operator:olga", claimed.fence, "exclusive", "olga", "probe")
    ]
    # Full now: a worker is refused as by any full semaphore.
    assert not service.acquire("sem:claim", "w-3", ttl=30, limit=3).acquired


def test_a_claim_of_a_full_semaphore_is_refused_and_says_why(service):
    fences = [grant(service, "sem:full", f"w-{n}", limit=2).fence for n in (1, 2)]
    for force in (False, True):
        with pytest.raises(HeldByHolders) as refused:
            service.claim("sem:full", "op", 60, actor="olga", reason="x", force=force)
        assert "no free place" in str(refused.value)
        assert refused.value.holder.fence == fences[0]
    assert [h.fence for h in service.holders("sem:full").holders] == fences
    assert claimed_events("sem:full") == []


def test_a_claim_of_shared_grants_needs_the_shared_mode(service):
    reader = grant(service, "rw:claim", "r-1", mode="shared")
    with pytest.raises(HeldByHolders) as refused:
        service.claim("rw:claim", "op", 60, actor="olga", reason="x", force=True)
    assert "claim it shared" in str(refused.value)
    joined = service.claim("rw:claim", "op", 60, actor="olga", mode="shared")
    assert (joined.mode, joined.holders) == ("shared", 2)
    assert sorted(h.fence for h in service.holders("rw:claim").holders) == [
        reader.fence,
        joined.fence,
    ]
    fresh = service.claim("rw:free", "op", 60, actor="olga", mode="shared")
    assert [(h.owner, h.mode) for h in service.holders("rw:free").holders] == [
        ("op", "shared")
    ]
    assert claimed_events("rw:free") == [("op", fresh.fence, "shared", "olga", None)]
    grant(service, "sem:rw", "w-1", limit=2)
    with pytest.raises(HeldByHolders, match="semaphore of limit 2"):
        service.claim("sem:rw", "op", 60, actor="olga", mode="shared")
    grant(service, "job:rw", "w-1")
    with pytest.raises(HeldByHolders, match="held exclusively"):
        service.claim("job:rw", "op", 60, actor="olga", mode="shared", force=True)
    with pytest.raises(InvalidInput):
        service.claim("rw:claim", "op", 60, actor="olga", mode="both")
    assert len(service.holders("rw:claim").holders) == 2


def test_a_holder_claim_keeps_freezes_fences_and_quotas(service):
    create_token("ci", max_locks=1)
    seen = grant(service, "sem:rules", "w-1", limit=3)
    service.freeze("sem:", actor="olga", reason="migration")
    with pytest.raises(ResourceFrozen):
        service.claim("sem:rules", "op", 60, actor="olga")
    assert len(service.holders("sem:rules").holders) == 1
    with pytest.raises(LockChanged):
        service.claim(
            "sem:rules",
            "op",
            60,
            actor="olga",
            force=True,
            expected_fence=seen.fence + 99,
        )
    # Past the freeze with force, as any claim; for the token "ci".
    claimed = service.claim(
        "sem:rules", "op", 60, actor="olga", force=True, for_token="ci",
        expected_fence=seen.fence,
    )  # fmt: skip
    assert claimed.token == "ci"
    # Quotas count grants: the claimed holder is the token's one live lock.
    with pytest.raises(QuotaExceeded):
        service.acquire("job:other", "w", ttl=30, token="ci", max_locks=1)


def test_the_dashboard_claim_is_one_more_holder(operator, service):
    grant(service, "sem:faces", "w-1", limit=2)
    form = soup(operator.get("/locks/sem:faces/claim"))
    assert "places are held: a claim takes a free one" in form.get_text(" ", strip=True)
    assert form.find(id="claim-force") is None
    fence = form.find("input", attrs={"name": "fence"})["value"]
    done = post(
        operator,
        "/locks/sem:faces/claim",
        {"owner": "op-page", "ttl": "60", "fence": fence},
    )
    assert done.status_code == 303, soup(done).get_text(" ", strip=True)
    assert sorted(h.owner for h in service.holders("sem:faces").holders) == [
        "op-page",
        "w-1",
    ]
    full = post(
        operator, "/locks/sem:faces/claim", {"owner": "op-more", "fence": fence}
    )
    assert full.status_code == 409
    assert "no free place" in soup(full).get_text(" ", strip=True)
    shared = post(
        operator, "/locks/rw:faces/claim", {"owner": "op-r", "mode": "shared"}
    )
    assert shared.status_code == 303
    assert [h.mode for h in service.holders("rw:faces").holders] == ["shared"]
    assert len(claimed_events("sem:faces")) == 1


def test_the_cli_claim_is_one_more_holder(fake_app, service):
    grant(service, "sem:cli", "w-1", limit=2)
    cli = fake_app.test_cli_runner()
    result = cli.invoke(
        args=["locks", "claim", "sem:cli", "--owner", "op-cli", "--ttl", "60"]
    )
    assert result.exit_code == 0, result.output
    assert "one place of 2" in result.output
    result = cli.invoke(args=["locks", "claim", "sem:cli", "--owner", "op-x"])
    assert result.exit_code == 1
    assert "no free place" in result.output
    shared = cli.invoke(
        args=["locks", "claim", "rw:cli", "--owner", "op", "--mode", "shared"]
    )
    assert shared.exit_code == 0, shared.output
    assert ", shared)" in shared.output
    assert len(claimed_events("sem:cli")) == 1


def test_a_claim_racing_workers_for_the_last_place_never_overfills(race_app):
    """One holder left, an operator's claim and four workers at once, round
    after round: one of them gets it, the others are refused (the claim
    because no place is free)."""
    with race_app.app_context():
        service = lock_service()
        for round_number in range(8):
            resource = f"race:claim-{round_number}"
            for n in (1, 2):
                assert service.acquire(resource, f"w-{n}", ttl=60, limit=3).acquired
            barrier = threading.Barrier(5)
            won: list[str] = []
            refusals: list[str] = []

            def claim(resource=resource, barrier=barrier, won=won, refusals=refusals):
                with race_app.app_context():
                    barrier.wait(timeout=30)
                    try:
                        lock_service().claim(resource, "op", 60, actor="olga")
                    except HeldByHolders as refused:
                        # Refused only because a worker took the last place.
                        refusals.append(str(refused))
                        return
                    won.append("op")

            def worker(number, resource=resource, barrier=barrier, won=won):
                def run() -> None:
                    with race_app.app_context():
                        barrier.wait(timeout=30)
                        owner = f"c-{number}"
                        if (
                            lock_service()
                            .acquire(resource, owner, ttl=60, limit=3)
                            .acquired
                        ):
                            won.append(owner)

                return run

            run_threads(claim, *(worker(n) for n in range(4)))
            assert len(won) == 1
            assert len(refusals) == (0 if won == ["op"] else 1)
            assert all("no free place" in refusal for refusal in refusals)
            assert len(holders_of(resource)) == 3
            made = [
                e.owner
                for e in events_of(resource)
                if e.action in (Action.ACQUIRED, Action.CLAIMED)
            ]
            assert sorted(made) == sorted(["w-1", "w-2", *won])
