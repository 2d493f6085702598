"""A holder changing mode: a promotion (shared → exclusive) is a new exclusive
tenure with a new fence, so a freeze or an ended API token refuses it as it
refuses a new grant; a demotion keeps the fence and goes on. Both say in their
event's details which mode the grant had. Every database."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from app.auth.models import ApiToken
from app.auth.service import create_token
from app.extensions import db
from app.locks.errors import ResourceFrozen, TokenEnded
from app.locks.state import Action
from tests.test_holders import events_of, places_of

pytestmark = pytest.mark.usefixtures("backend")


def test_a_promotion_is_refused_under_a_freeze(service):
    reader = service.acquire("rw:frozen", "r", ttl=30, mode="shared").lock
    service.freeze("rw:", actor="olga", reason="migration")
    with pytest.raises(ResourceFrozen):
        service.acquire("rw:frozen", "r", ttl=30)
    (place,) = places_of("rw:frozen")
    assert (place.owner, place.fence, place.mode) == ("r", reader.fence, "shared")
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
    assert [(p.owner, p.fence) for p in places_of("rw:token")] == [("r", reader.fence)]
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
