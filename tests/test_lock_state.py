import pytest

from app.locks.state import LockState, classify


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
