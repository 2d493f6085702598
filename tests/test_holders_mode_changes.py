"""A holder changing mode: a promotion (shared → exclusive) is a new exclusive
tenure with a new fence, so a freeze or an ended API token refuses it as it
refuses a new grant; a demotion keeps the fence and goes on. Both say in their
event's details which mode the grant had. Every database."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from lockkeeper_core.errors import ResourceFrozen, TokenEnded
from lockkeeper_core.state import Action
from sqlalchemy import update

from app.auth.models import ApiToken
from app.auth.service import create_token
from app.extensions import db
from tests.test_holders import events_of, holders_of

pytestmark = pytest.mark.usefixtures("backend")


def test_a_promotion_is_refused_under_a_freeze(service):
    reader = service.acquire("rw:frozen", "r", ttl=30, mode="shared").lock
    service.freeze("rw:", actor="olga", reason="migration")
    with pytest.raises(ResourceFrozen):
        service.acquire("rw:frozen", "r", ttl=30)
    (holder,) = holders_of("rw:frozen")
    assert (holder.owner, holder.fence, holder.mode) == ("r", reader.fence, "shared")
    assert [e.action for e in events_of("rw:frozen")] == [Action.ACQUIRED]
    # Renewing the shared grant goes on, as renewals do under a freeze.
    again = service.acquire("rw:frozen", "r", ttl=30, mode="shared")
    assert (again.action, again.lock.fence) == (Action.REACQUIRED, reader.fence)


def test_a_promotion_is_refused_for_a_revoked_token(service):
    create_token("leaving")
    reader = service.acquire(
        "rw:token", "r", ttl=30, mode="shared", token="leaving"
    ).lock
    db.session.execute(
        update(ApiToken)
        .where(ApiToken.name == "leaving")
        .values(revoked_at=datetime.now(UTC))
    )
    db.session.commit()
    with pytest.raises(TokenEnded):
        service.acquire("rw:token", "r", ttl=30, token="leaving")
    assert [(p.owner, p.fence) for p in holders_of("rw:token")] == [("r", reader.fence)]
    assert len(events_of("rw:token")) == 1


def test_the_audit_tells_a_promotion_and_a_demotion(service):
    reader = service.acquire("rw:audit", "r", ttl=30, mode="shared").lock
    promoted = service.acquire("rw:audit", "r", ttl=30).lock
    service.freeze("rw:", actor="olga", reason="migration")
    # A demotion keeps the fence (the same tenure, narrowed): a freeze lets it.
    demoted = service.acquire("rw:audit", "r", ttl=30, mode="shared").lock
    assert demoted.fence == promoted.fence > reader.fence
    logged = [(e.action, e.fence, e.mode, e.details) for e in events_of("rw:audit")]
    assert [entry[:3] for entry in logged] == [
        (Action.ACQUIRED, reader.fence, "shared"),
        (Action.ACQUIRED, promoted.fence, "exclusive"),
        (Action.REACQUIRED, promoted.fence, "shared"),
    ]
    assert logged[0][3] is None
    assert json.loads(logged[1][3]) == {
        "from_mode": "shared",
        "from_fence": reader.fence,
    }
    assert json.loads(logged[2][3]) == {"from_mode": "exclusive"}


def test_a_refused_promotion_names_the_other_grant_that_ends_first(api, service, clock):
    """The 409 of a promotion refused beside other readers names what is in
    its way: of the others' live grants, the one that ends first (with
    Retry-After until then), never the caller's own shared grant, even when
    that ends sooner; the same on every dialect (PostgreSQL decides it in
    lockkeeper_acquire_place)."""
    for owner, ttl in (("mine", 5), ("r-late", 50), ("r-soon", 20), ("r-mid", 30)):
        body = {"owner": owner, "ttl": ttl, "mode": "shared"}
        assert api.post("/api/v1/locks/rw:promo", json=body).status_code == 200
    clock.advance(1)
    logged = len(events_of("rw:promo"))
    refused = api.post("/api/v1/locks/rw:promo", json={"owner": "mine", "ttl": 10})
    assert refused.status_code == 409
    body = refused.get_json()
    assert body["acquired"] is False
    assert (body["lock"]["owner"], body["lock"]["mode"]) == ("r-soon", "shared")
    assert refused.headers["Retry-After"] == "19"
    # Nothing changed: the four shared grants, no event for the refusal.
    assert sorted(h.owner for h in service.holders("rw:promo").holders) == [
        "mine",
        "r-late",
        "r-mid",
        "r-soon",
    ]
    assert len(events_of("rw:promo")) == logged


def test_a_refused_session_bound_promotion_names_the_same_grant(api, service, clock):
    """A session's shared grant asking to be exclusive decides in the holders
    transaction on every dialect: its refusal names the same grant."""
    session = api.post("/api/v1/sessions", json={"owner": "s", "ttl": 5}).get_json()
    shared = {"owner": "s", "session": session["id"], "mode": "shared"}
    assert api.post("/api/v1/locks/rw:sp", json=shared).status_code == 200
    for owner, ttl in (("r-late", 50), ("r-soon", 20)):
        assert service.acquire("rw:sp", owner, ttl=ttl, mode="shared").acquired
    refused = api.post(
        "/api/v1/locks/rw:sp", json={"owner": "s", "session": session["id"]}
    )
    assert refused.status_code == 409
    assert refused.get_json()["lock"]["owner"] == "r-soon"
    assert refused.headers["Retry-After"] == "20"
