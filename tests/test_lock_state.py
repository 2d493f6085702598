from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, literal, select

from app.database import UTCDateTime
from app.locks.state import LockState, classify, state_condition

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [
        (-5.0, LockState.STALE),
        (0.0, LockState.STALE),
        (0.001, LockState.EXPIRING),
        (15.0, LockState.EXPIRING),
        (15.001, LockState.HELD),
        (3600.0, LockState.HELD),
    ],
)
def test_each_remaining_time_has_exactly_one_state(remaining, expected):
    assert classify(remaining, expiring_within=15.0) is expected


def test_zero_window_means_no_lock_is_ever_expiring():
    assert classify(0.001, expiring_within=0) is LockState.HELD


@pytest.mark.parametrize("remaining", [-1.0, 0.0, 0.001, 14.999, 15.0, 15.001, 60.0])
def test_the_sql_form_of_the_state_rule_agrees_with_classify(remaining):
    """Lists, counts and bulk stale release filter by ``state_condition``; the
    Lock object's state comes from ``classify``."""
    expires_at = literal(NOW + timedelta(seconds=remaining), UTCDateTime())
    columns = [
        state_condition(state, expires_at, NOW, 15.0).label(state.value)
        for state in LockState
    ]
    with create_engine("sqlite://").connect() as conn:
        row = conn.execute(select(*columns)).one()
    assert [state for state in LockState if getattr(row, state.value)] == [
        classify(remaining, expiring_within=15.0)
    ]
