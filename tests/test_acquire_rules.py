"""A refused acquire is decided from its outcome alone (``rules.refuse_acquire``):
no database, no clock, no service; what it cannot settle it names as the one
second look the service then takes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from lockkeeper_core import rules
from lockkeeper_core.errors import (
    LimitMismatch,
    LockExpired,
    LockNotFound,
    NotOwner,
    ResourceFrozen,
    TokenEnded,
)
from lockkeeper_core.results import AcquireResult, Lock
from lockkeeper_core.statements.common import Outcome
from lockkeeper_core.values import Ask

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
ASK = Ask("job:1", "w-1", "billing", 30.0)


def _row(owner="w-1", token="billing", expires_in=10.0, **more):
    return SimpleNamespace(
        resource="job:1",
        owner=owner,
        token=token,
        fence=7,
        acquired_at=NOW - timedelta(seconds=5),
        expires_at=NOW + timedelta(seconds=expires_in),
        waiters=more.pop("waiters", 0),
        places_until=more.pop("places_until", None),
        **more,
    )


def _refused(row, **outcome) -> AcquireResult | rules.SecondLook:
    return rules.refuse_acquire(
        ASK,
        Outcome(False, None, row, NOW, **outcome),
        lambda found: Lock.from_row(found, NOW, 15.0),
    )


def test_held_by_another_is_answered_with_the_holder_and_no_second_look():
    refused = _refused(_row(owner="w-2", waiters=2))
    assert isinstance(refused, AcquireResult)
    assert (refused.acquired, refused.lock.owner, refused.waiters) == (False, "w-2", 2)


def test_a_free_row_with_a_line_before_us_is_answered_without_a_look():
    refused = _refused(_row(expires_in=-1, waiters=1))
    assert refused == AcquireResult(False, refused.lock, None, 1)
    assert refused.lock.owner == "w-1"


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        ({"limit_mismatch": 4}, LimitMismatch),
        ({"token_ended": True}, TokenEnded),
        ({"freeze": SimpleNamespace(**dict.fromkeys(
            ("prefix", "reason", "actor", "frozen_at", "ends_at"), None
        ))}, ResourceFrozen),
    ],
)  # fmt: skip
def test_refusals_that_need_no_read_are_raised_by_the_rule(outcome, error):
    with pytest.raises(error):
        _refused(_row(expires_in=-1), **outcome)


def test_what_needs_a_read_is_named_as_the_second_look():
    assert _refused(_row(expires_in=-1), over_quota=True) == rules.SecondLook(
        0, quota=True
    )
    # Our own valid grant refused: the session it is bound to is read after.
    assert _refused(_row()) == rules.SecondLook(0, bound_session=True)
    # Held by holders: the grant that ends first is read after.
    held = _refused(_row(owner=None, places_until=NOW + timedelta(seconds=3)))
    assert held == rules.SecondLook(0, first_holder=True)
    # Nothing explains the refusal: the row changed under the attempt.
    assert _refused(None) == rules.SecondLook(0)


# -- a refused renew or release of the caller's own grant (``rules.refuse_own``)


def _own(row) -> rules.OwnLook:
    return rules.refuse_own(
        row,
        NOW,
        resource="job:1",
        owner="w-1",
        token="billing",
        show=lambda found: Lock.from_row(found, NOW, 15.0),
    )


def test_no_row_is_not_found_with_no_place_to_look_for():
    look = _own(None)
    assert (type(look.refusal), look.outcome, look.maybe_holder) == (
        LockNotFound,
        "not_found",
        False,
    )
    assert not look.bound_session


@pytest.mark.parametrize(
    ("row", "error", "outcome"),
    [
        (_row(owner=None, token=None), LockNotFound, "not_found"),
        (_row(expires_in=-1), LockExpired, "expired"),
    ],
    ids=["free", "run-out"],
)
def test_a_row_without_a_valid_exclusive_grant_looks_for_the_callers_holder(
    row, error, outcome
):
    look = _own(row)
    assert (type(look.refusal), look.outcome, look.maybe_holder) == (
        error,
        outcome,
        True,
    )
    assert not look.bound_session


def test_another_holders_valid_grant_is_not_owner_naming_it_with_no_look():
    look = _own(_row(owner="w-2"))
    assert isinstance(look.refusal, NotOwner)
    assert look.refusal.holder.owner == "w-2"
    assert (look.outcome, look.maybe_holder, look.bound_session) == (
        "not_owner",
        False,
        False,
    )


def test_our_own_valid_grant_refused_looks_for_its_session_else_raced():
    look = _own(_row())
    assert look == rules.OwnLook(None, None, bound_session=True)
