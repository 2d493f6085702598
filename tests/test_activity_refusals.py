"""Refused acquires per minute: counted in memory by each process, added to the
database off the request path, drawn as the overview's third chart (each test
on every backend)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from lockkeeper_core.errors import QuotaExceeded, ResourceFrozen
from sqlalchemy import func, select

from app.audit import refusals
from app.audit.models import ActivityRefusals
from app.dashboard import charts
from app.extensions import db, lock_service
from tests.dashboard_helpers import soup


def stored(app) -> dict[tuple, int]:
    with app.app_context():
        return {
            (row.starts_at, row.outcome): row.refused
            for row in db.session.scalars(select(ActivityRefusals))
        }


def counts_of(app) -> refusals.RefusalCounts:
    return app.extensions["lockkeeper.refusals"]


def test_each_kind_of_refusal_is_counted_and_flushed_per_minute(
    fake_app, clock, backend
):
    minute = charts.counts_of.on_grid(clock.now(), timedelta(minutes=1))
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=60)
        assert not service.acquire("job:1", "w2", ttl=60).acquired
        assert not service.acquire("job:1", "w3", ttl=60).acquired
        service.freeze("frozen:", actor="olga", reason="migration")
        with pytest.raises(ResourceFrozen):
            service.acquire("frozen:1", "w", ttl=60)
        service.acquire("q:1", "w", ttl=60, token="q", max_locks=1)
        with pytest.raises(QuotaExceeded):
            service.acquire("q:2", "w", ttl=60, token="q", max_locks=1)
        assert stored(fake_app) == {}  # nothing written on the request path
        assert counts_of(fake_app).flush() == 4
    assert stored(fake_app) == {
        (minute, "held"): 2,
        (minute, "frozen"): 1,
        (minute, "over_quota"): 1,
    }
    assert counts_of(fake_app).flush() == 0  # flushed once, not again


def test_flushes_of_several_processes_add_up_under_concurrent_refusals(
    make_app, backend
):
    """Two apps (two server processes) on one database, four threads each
    refusing acquires while both flush over and over: every refusal is in the
    table once, none lost, none counted twice."""
    apps = [make_app(), make_app()]
    with apps[0].app_context():
        lock_service().acquire("job:busy", "holder", ttl=600)
    per_thread = 25
    done = threading.Event()
    errors = []

    def refuse(app):
        try:
            with app.app_context():
                service = lock_service()
                for n in range(per_thread):
                    assert not service.acquire("job:busy", f"w{n}", ttl=5).acquired
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    def flush_until_done(app):
        try:
            while not done.is_set():
                counts_of(app).flush()
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    workers = [
        threading.Thread(target=refuse, args=(a,)) for a in apps for _ in range(4)
    ]
    flushers = [threading.Thread(target=flush_until_done, args=(a,)) for a in apps]
    for thread in [*flushers, *workers]:
        thread.start()
    for thread in workers:
        thread.join(timeout=300)
    done.set()
    for thread in flushers:
        thread.join(timeout=60)
    for app in apps:
        counts_of(app).flush()
    assert not errors
    total = sum(n for (_, outcome), n in stored(apps[0]).items() if outcome == "held")
    assert total == 2 * 4 * per_thread


def test_the_flusher_thread_adds_counts_every_interval(make_app, backend):
    app = make_app(LOCKKEEPER_REFUSALS_FLUSH_SECONDS=0.05)
    with app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=60)
        for _ in range(3):
            service.acquire("job:1", "w2", ttl=60)
    deadline = time.monotonic() + 30
    while sum(stored(app).values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(stored(app).values()) == 3
    assert counts_of(app).pending() == 0
    counts_of(app).stop()


def test_a_failed_flush_keeps_its_counts_for_the_next(fake_app, backend, monkeypatch):
    counts = counts_of(fake_app)
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=60)
        service.acquire("job:1", "w2", ttl=60)

    def broken(engine, rows):
        raise RuntimeError("database away")

    with monkeypatch.context() as patched:
        patched.setattr(refusals, "_adding", broken)
        with pytest.raises(RuntimeError):
            counts.flush()
    assert counts.pending() == 1
    assert counts.flush() == 1
    assert sum(stored(fake_app).values()) == 1


def test_refusals_are_the_overviews_third_chart(operator, fake_app, clock, backend):
    with fake_app.app_context():
        service = lock_service()
        service.acquire("job:1", "w1", ttl=600)
        for _ in range(3):
            service.acquire("job:1", "w2", ttl=600)
        service.freeze("frozen:", actor="olga", reason="migration")
        with pytest.raises(ResourceFrozen):
            service.acquire("frozen:1", "w", ttl=60)
        counts_of(fake_app).flush()
        clock.advance(90)
        drawn = charts.build(clock.now(), 15)
        total = db.session.scalar(select(func.sum(ActivityRefusals.refused)))
    assert total == 4
    assert drawn.total_refused == {"held": 3, "frozen": 1, "over_quota": 0}
    assert drawn.refusals.peak == 3
    page = soup(operator.get("/activity"))
    assert "3 held by another, 1 frozen (423), 0 over quota (429)" in (
        page.select_one("#refused-desc").get_text()
    )
    lines = page.select("#activity polyline.series")
    assert {line["class"][1] for line in lines} >= {
        "refused-held",
        "refused-frozen",
        "refused-over_quota",
    }


def test_stop_all_flushes_every_apps_counts_while_their_databases_exist(
    make_app, backend
):
    """What the exit flush does, called before the databases go away: each
    app's pending refusals reach its own database, and none is left to flush
    later (the interpreter's exit then writes nowhere)."""
    apps = [make_app(), make_app()]
    refusals.stop_all()  # what earlier tests' apps left is not this test's
    before = sum(stored(apps[0]).values())
    for app in apps:
        with app.app_context():
            service = lock_service()
            service.acquire("job:1", "w1", ttl=60)
            service.acquire("job:1", "w2", ttl=60)
    assert [counts_of(app).pending() for app in apps] == [1, 1]
    refusals.stop_all()
    assert [counts_of(app).pending() for app in apps] == [0, 0]
    assert sum(stored(apps[0]).values()) - before == 2  # one database for both
