"""An operator force-releases one grant of a resource held by places, by the
fence confirmed: that place alone ends (one event), the others stay; a fence no
grant carries any more is refused and names the grant there now. Every database."""

from __future__ import annotations

import pytest

from app.locks.errors import InvalidInput, LockChanged
from app.locks.state import Action
from tests.test_holders import events_of

pytestmark = pytest.mark.usefixtures("backend")


def grant(service, resource, owner, **kwargs):
    result = service.acquire(resource, owner, ttl=30, **kwargs)
    assert result.acquired
    return result.lock


def test_one_place_force_released_by_its_fence(service, clock):
    fences = [grant(service, "sem:op", f"w-{n}", limit=3).fence for n in (1, 2, 3)]
    clock.advance(5)
    ended = service.force_release_place(
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
    # The freed place is a place again.
    assert grant(service, "sem:op", "w-4", limit=3).fence > fences[2]


def test_a_shared_grant_force_released_leaves_the_other_readers(service):
    first = grant(service, "rw:op", "r-1", mode="shared")
    second = grant(service, "rw:op", "r-2", mode="shared")
    service.force_release_place("rw:op", first.fence, actor="olga", reason="stuck")
    assert [h.fence for h in service.holders("rw:op").holders] == [second.fence]
    forced = [e for e in events_of("rw:op") if e.action == Action.FORCE_RELEASED]
    assert [(e.owner, e.mode) for e in forced] == [("r-1", "shared")]


def test_a_changed_fence_is_refused_and_named(service):
    first = grant(service, "sem:gone", "w-1", limit=2)
    second = grant(service, "sem:gone", "w-2", limit=2)
    service.release("sem:gone", "w-1")
    with pytest.raises(LockChanged) as refused:
        service.force_release_place(
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
        service.force_release_place("sem:none", 7, actor="olga", reason="x")
    assert nobody.value.holder is None


@pytest.mark.parametrize(
    ("fence", "reason", "field"),
    [(3, "", "reason"), (3, None, "reason"), (0, "r", "fence"), (None, "r", "fence")],
)
def test_a_reason_and_a_fence_are_required(service, fence, reason, field):
    grant(service, "sem:bad", "w-1", limit=2)
    with pytest.raises(InvalidInput) as refused:
        service.force_release_place("sem:bad", fence, actor="olga", reason=reason)
    assert field in [name for name, _ in refused.value.errors]
    assert len(service.holders("sem:bad").holders) == 1
