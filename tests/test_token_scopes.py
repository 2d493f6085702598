"""API tokens limited to resource prefixes, to reads, in time: decided once, in the
API's guard, before any resource is looked up."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import select

from app.auth.models import ApiToken
from app.auth.service import AuthError, create_token, verify_token
from app.extensions import db

pytestmark = pytest.mark.usefixtures("backend")


def _acquire(client, resource, owner="w-1"):
    return client.post(f"/api/v1/locks/{resource}", json={"owner": owner, "ttl": 60})


def test_a_scoped_token_acts_inside_its_prefixes(api):
    scoped = api.with_token("jobs", prefixes=["job:", "report:"])
    assert _acquire(scoped, "job:1").status_code == 200
    assert _acquire(scoped, "report:may").status_code == 200
    assert scoped.get("/api/v1/locks/job:1").status_code == 200
    assert scoped.get("/api/v1/locks/job:1/events").status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/locks/other:1"),
        ("GET", "/api/v1/locks/other:1"),
        ("PATCH", "/api/v1/locks/other:1"),
        ("DELETE", "/api/v1/locks/other:1"),
        ("GET", "/api/v1/locks/other:1/events"),
        ("GET", "/api/v1/events?resource=other:1"),
        # A name that the prefix begins but does not start: job is not job:
        ("POST", "/api/v1/locks/job"),
        ("POST", "/api/v1/locks/JOB:1"),
    ],
)
def test_outside_its_prefixes_a_token_gets_403_that_says_nothing(api, method, path):
    """Held, free or never seen: the answer is the same 403, decided before the
    lock is looked up."""
    assert _acquire(api, "other:1").status_code == 200
    scoped = api.with_token("jobs", prefixes=["job:"])
    held = scoped.open(method, path, json={"owner": "w-1", "ttl": 5})
    never_seen = scoped.open(
        method, path.replace("other:1", "other:2"), json={"owner": "w-1", "ttl": 5}
    )
    for response in (held, never_seen):
        assert response.status_code == 403, response.get_json()
        assert response.mimetype == "application/problem+json"
        assert "w-1" not in response.get_data(as_text=True)
    assert held.get_json()["detail"] == never_seen.get_json()["detail"]
    # Nothing changed: the other token's lock is intact.
    assert api.get("/api/v1/locks/other:1").get_json()["owner"] == "w-1"


def test_lists_and_event_queries_are_narrowed_to_the_prefixes(api):
    for resource in ("job:1", "job:2", "other:1", "jobs"):
        assert _acquire(api, resource).status_code == 200
    scoped = api.with_token("jobs", prefixes=["job:"])
    listed = scoped.get("/api/v1/locks").get_json()["locks"]
    assert [lock["resource"] for lock in listed] == ["job:1", "job:2"]
    narrower = scoped.get("/api/v1/locks?prefix=job:2").get_json()["locks"]
    assert [lock["resource"] for lock in narrower] == ["job:2"]
    outside = scoped.get("/api/v1/locks?prefix=other").get_json()["locks"]
    assert outside == []
    events = scoped.get("/api/v1/events").get_json()["events"]
    assert sorted(event["resource"] for event in events) == ["job:1", "job:2"]
    by_owner = scoped.get("/api/v1/events?owner=w-1&prefix=o").get_json()["events"]
    assert by_owner == []
    # The unscoped token still sees everything.
    assert len(api.get("/api/v1/locks").get_json()["locks"]) == 4


def test_a_read_only_token_reads_but_never_changes(api):
    assert _acquire(api, "job:1").status_code == 200
    reader = api.with_token("reader", read_only=True)
    assert reader.get("/api/v1/locks/job:1").status_code == 200
    assert reader.get("/api/v1/locks").status_code == 200
    assert reader.get("/api/v1/events").status_code == 200
    for method, path in (
        ("POST", "/api/v1/locks/job:2"),
        ("PATCH", "/api/v1/locks/job:1"),
        ("DELETE", "/api/v1/locks/job:1"),
    ):
        response = reader.open(method, path, json={"owner": "w-1", "ttl": 5})
        assert response.status_code == 403, (method, response.get_json())
        assert response.mimetype == "application/problem+json"
    assert api.get("/api/v1/locks").get_json()["locks"][0]["resource"] == "job:1"
    assert len(api.get("/api/v1/locks").get_json()["locks"]) == 1


def test_an_expired_token_is_refused_like_a_revoked_one(api, clock):
    short = api.with_token("short", expires_in=timedelta(hours=1))
    assert short.get("/api/v1/locks").status_code == 200
    clock.advance(3599)
    assert short.get("/api/v1/locks").status_code == 200
    clock.advance(2)
    response = short.get("/api/v1/locks")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert _acquire(short, "job:1").status_code == 401
    assert api.get("/api/v1/locks").status_code == 200  # no expiry: no end


def test_tokens_made_before_scopes_keep_full_scope_and_no_expiry(fake_app):
    """A row with the new columns at their migration defaults."""
    with fake_app.app_context():
        token = create_token("old", max_locks=0)
        row = db.session.scalar(select(ApiToken).where(ApiToken.name == "old"))
        assert (row.prefixes, row.read_only, row.expires_at, row.max_locks) == (
            None,
            False,
            None,
            None,
        )
        identity = verify_token(token)
    assert identity.prefixes is None
    assert not identity.read_only
    assert identity.covers("anything:at-all")
    assert identity.may_send("DELETE")


def test_new_tokens_get_the_configured_quota(make_app):
    app = make_app(LOCKKEEPER_MAX_LOCKS_PER_TOKEN=7)
    with app.app_context():
        assert verify_token(create_token("default")).max_locks == 7
        assert verify_token(create_token("three", max_locks=3)).max_locks == 3
        assert verify_token(create_token("free", max_locks=0)).max_locks is None


@pytest.mark.parametrize(
    "options",
    [
        {"prefixes": ["job/"]},
        {"prefixes": [""]},
        {"prefixes": ["x" * 256]},
        {"expires_in": timedelta(0)},
        {"max_locks": -1},
    ],
)
def test_bad_token_options_are_refused(fake_app, options):
    with fake_app.app_context():
        with pytest.raises(AuthError):
            create_token("bad", **options)
        assert db.session.scalar(select(ApiToken.id)) is None


# -- the command line -----------------------------------------------------------


def test_tokens_create_with_every_option_and_list_shows_them(make_app):
    app = make_app(LOCKKEEPER_MAX_LOCKS_PER_TOKEN=50)
    runner = app.test_cli_runner()
    created = runner.invoke(
        args=[
            "tokens",
            "create",
            "ci",
            "--prefix",
            "job:",
            "--prefix",
            "report:",
            "--read-only",
            "--expires-in",
            "90d",
            "--max-locks",
            "5",
        ]
    )
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    assert runner.invoke(args=["tokens", "create", "plain"]).exit_code == 0
    assert (
        runner.invoke(args=["tokens", "create", "free", "--max-locks", "0"]).exit_code
        == 0
    )
    with app.app_context():
        identity = verify_token(token)
    assert identity.prefixes == ("job:", "report:")
    assert identity.read_only
    assert identity.max_locks == 5
    assert identity.expires_at is not None

    listed = runner.invoke(args=["tokens", "list"])
    assert listed.exit_code == 0, listed.output
    rows = {
        line.split("\t")[0]: line.split("\t") for line in listed.output.splitlines()
    }
    assert rows["name"][:6] == [
        "name",
        "status",
        "prefixes",
        "access",
        "expires",
        "max_locks",
    ]
    assert rows["ci"][1:4] == ["active", "job:,report:", "read-only"]
    assert rows["ci"][4].startswith(identity.expires_at.date().isoformat())
    assert rows["ci"][5] == "5"
    assert rows["plain"][1:6] == ["active", "*", "read-write", "never", "50"]
    assert rows["free"][5] == "unlimited"


@pytest.mark.parametrize(
    "args",
    [
        ["--prefix", "job/"],
        ["--expires-in", "soon"],
        ["--max-locks", "-1"],
        ["--max-locks", "many"],
    ],
)
def test_tokens_create_refuses_bad_options(make_app, args):
    runner = make_app().test_cli_runner()
    result = runner.invoke(args=["tokens", "create", "bad", *args])
    assert result.exit_code != 0
    # No token was made (the database's own name may start with lk_ too).
    assert not re.search(r"\blk_[A-Za-z0-9_-]{40,}", result.output), result.output
    with make_app().app_context():
        assert db.session.scalar(select(ApiToken).where(ApiToken.name == "bad")) is None


def test_a_scoped_token_lists_only_the_freezes_over_its_resources(api, fake_app):
    from app.extensions import lock_service

    with fake_app.app_context():
        for prefix, reason in [
            ("billing:", "secret migration plan"),
            ("job:nightly", "nightly jobs paused"),
            ("job", "every job"),
        ]:
            lock_service().freeze(prefix, actor="olga", reason=reason)
    scoped = api.with_token("jobs", prefixes=["job:"])
    listed = scoped.get("/api/v1/freezes").get_json()["freezes"]
    # Inside its scope, and over all of it; never another prefix's reason.
    assert [f["prefix"] for f in listed] == ["job", "job:nightly"]
    everyone = api.get("/api/v1/freezes").get_json()["freezes"]
    assert [f["prefix"] for f in everyone] == ["billing:", "job", "job:nightly"]
