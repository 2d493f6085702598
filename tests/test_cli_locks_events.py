"""``lockkeeper locks ...`` and ``lockkeeper events ...`` through the CLI runner."""

from __future__ import annotations

import csv
import io
import json

import pytest

from app.audit.service import EventFilter, iter_events, list_events
from app.cli.locks import operator_actor
from app.extensions import lock_service


@pytest.fixture
def cli(fake_app):
    return fake_app.test_cli_runner()


@pytest.fixture
def history(service, clock):
    service.acquire("job:1", "w-1", ttl=30, actor="tok-a")
    service.acquire("job:2", 'owner, "quoted"', ttl=3600, actor="tok-b")
    clock.advance(60)  # job:1 is stale now
    service.acquire("report:7", "w-3", ttl=600, actor="tok-a")
    service.force_release("report:7", actor="alice", reason="line one\nline, two")
    return service


def test_locks_list_prints_every_lock_with_its_state(cli, history):
    result = cli.invoke(args=["locks", "list"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert lines[0][:4] == ["resource", "owner", "fence", "state"]
    assert [(r[0], r[3]) for r in lines[1:]] == [("job:1", "stale"), ("job:2", "held")]


def test_locks_list_filters_by_state(cli, history):
    result = cli.invoke(args=["locks", "list", "--state", "stale"])
    assert [line.split("\t")[0] for line in result.stdout.splitlines()[1:]] == ["job:1"]


def test_locks_release_force_releases_as_the_cli_user_with_the_reason(
    cli, history, fake_app
):
    result = cli.invoke(args=["locks", "release", "job:2", "--reason", "wedged"])
    assert result.exit_code == 0, result.output
    assert "job:2" in result.output
    with fake_app.app_context():
        (event,) = list_events(
            EventFilter(resource="job:2", action="force_released")
        ).items
        assert (event.actor, event.reason) == (operator_actor(), "wedged")
        assert event.actor.startswith("cli:")
        assert [lock.resource for lock in lock_service().list_locks().items] == [
            "job:1"
        ]


def test_locks_release_with_the_confirmed_fence_releases_that_grant(
    cli, history, fake_app
):
    with fake_app.app_context():
        fence = lock_service().get("job:2").fence
    result = cli.invoke(
        args=["locks", "release", "job:2", "--reason", "x", "--fence", str(fence)]
    )
    assert result.exit_code == 0, result.output
    with fake_app.app_context():
        assert [lock.resource for lock in lock_service().list_locks().items] == [
            "job:1"
        ]


def test_locks_release_refuses_when_the_lock_changed_hands(cli, history, fake_app):
    with fake_app.app_context():
        stale = lock_service().get("job:1", include_stale=True).fence
        taken = lock_service().acquire("job:1", "w-9").lock.fence
    result = cli.invoke(
        args=["locks", "release", "job:1", "--reason", "x", "--fence", str(stale)]
    )
    assert result.exit_code == 3
    assert f"held by 'w-9' with fence {taken}" in result.output
    assert "nothing was released" in result.output
    with fake_app.app_context():
        lock = lock_service().get("job:1")
        assert (lock.owner, lock.fence) == ("w-9", taken)


def test_locks_release_needs_a_reason(cli, history):
    result = cli.invoke(args=["locks", "release", "job:2"])
    assert result.exit_code == 1
    assert "reason: is required" in result.output


def test_locks_release_of_an_absent_lock_fails_cleanly(cli, service):
    result = cli.invoke(args=["locks", "release", "job:404", "--reason", "x"])
    assert result.exit_code == 1
    assert "job:404" in result.output


def test_locks_release_of_an_invalid_resource_fails_cleanly(cli, service):
    result = cli.invoke(args=["locks", "release", "no spaces", "--reason", "x"])
    assert result.exit_code == 1
    assert "resource" in result.output


def test_purge_stale_removes_only_long_expired_rows_and_fences_keep_rising(
    cli, history, clock, fake_app
):
    clock.advance(3600 * 24 * 8)  # everything is stale now, for over 7 days
    history.acquire("fresh:1", "w-1", ttl=30)
    clock.advance(60)
    result = cli.invoke(args=["locks", "purge-stale", "--older-than", "7d"])
    assert result.exit_code == 0, result.output
    assert "Purged 2" in result.output
    with fake_app.app_context():
        service = lock_service()
        assert [lock.resource for lock in service.list_locks().items] == ["fresh:1"]
        highest = max(e.fence for e in iter_events() if e.fence)
        assert service.acquire("job:1", "w-9", ttl=30).lock.fence > highest


def test_purge_stale_rejects_a_bad_duration(cli, service):
    result = cli.invoke(args=["locks", "purge-stale", "--older-than", "soon"])
    assert result.exit_code == 2
    assert "not a duration" in result.output


def test_events_export_csv_has_the_same_rows_as_the_page(cli, history, fake_app):
    result = cli.invoke(args=["events", "export", "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout, newline="")))
    with fake_app.app_context():
        page = list_events(EventFilter(), limit=500).items
    assert [int(r["id"]) for r in rows] == [e.id for e in page]
    assert {r["owner"] for r in rows} >= {'owner, "quoted"'}
    assert "line one\nline, two" in [r["reason"] for r in rows]


def test_events_export_applies_the_filters(cli, history, fake_app):
    result = cli.invoke(
        args=["events", "export", "--format", "jsonl", "--actor", "tok-a"]
        + ["--prefix", "report:", "--since", "2026-11-30T09:01:00Z"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["resource"], r["action"]) for r in records] == [("report:7", "acquired")]


def test_events_export_writes_to_a_file(cli, history, tmp_path):
    target = tmp_path / "audit.jsonl"
    result = cli.invoke(
        args=["events", "export", "--format", "jsonl", "--output", str(target)]
    )
    assert result.exit_code == 0, result.output
    lines = target.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    assert all(isinstance(json.loads(line), dict) for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "must be an RFC 3339 timestamp"),
        (["--action", "stolen"], "Invalid value for '--action'"),
        (["--resource", "bad resource"], "resource"),
    ],
)
def test_events_export_refuses_bad_filters(cli, service, args, message):
    result = cli.invoke(args=["events", "export", "--format", "csv", *args])
    assert result.exit_code != 0
    assert message in result.output


def test_events_prune_deletes_old_events_only(cli, history, clock, fake_app):
    clock.advance(86400 * 91)
    history.acquire("new:1", "w-1", ttl=30)
    result = cli.invoke(args=["events", "prune", "--older-than", "90d"])
    assert result.exit_code == 0, result.output
    assert "Pruned 4 event(s)" in result.output
    with fake_app.app_context():
        assert [e.resource for e in iter_events()] == ["new:1"]


def test_locks_list_prints_each_holder_and_shared_grant(cli, service):
    for owner in ("a", "b"):
        assert service.acquire("sem:pool", owner, ttl=30, limit=3).acquired
    for owner in ("r-1", "r-2"):
        assert service.acquire("rw:cfg", owner, ttl=30, mode="shared").acquired
    result = cli.invoke(args=["locks", "list"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert lines[0][-2:] == ["mode", "limit"]
    assert [(r[0], r[1], r[-2], r[-1]) for r in lines[1:]] == [
        ("rw:cfg", "r-1", "shared", "1"),
        ("rw:cfg", "r-2", "shared", "1"),
        ("sem:pool", "a", "exclusive", "3"),
        ("sem:pool", "b", "exclusive", "3"),
    ]
    mine = cli.invoke(args=["locks", "list", "--owner", "b"])
    assert [line.split("\t")[0] for line in mine.stdout.splitlines()[1:]] == [
        "sem:pool"
    ]
