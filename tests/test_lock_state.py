from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.state import LockState, classify, seconds_between, state_condition
from sqlalchemy import create_engine, literal, select

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
    """A grant on a long ttl: the window alone decides."""
    assert classify(remaining, expiring_within=15.0, ttl=86400) is expected


@pytest.mark.parametrize(
    ("remaining", "ttl", "expected"),
    [
        # A healthy leader on a 15 s ttl renewing every 5 s: never expiring.
        (15.0, 15.0, LockState.HELD),
        (10.0, 15.0, LockState.HELD),
        (7.501, 15.0, LockState.HELD),
        # Past half its ttl since its last renewal: it missed one.
        (7.5, 15.0, LockState.EXPIRING),
        (2.0, 15.0, LockState.EXPIRING),
        (0.0, 15.0, LockState.STALE),
        # A 2 s ttl is in its last second only.
        (1.5, 2.0, LockState.HELD),
        (1.0, 2.0, LockState.EXPIRING),
        # A long ttl: within the window, however small a share of the ttl.
        (20.0, 60.0, LockState.HELD),
        (15.0, 60.0, LockState.EXPIRING),
    ],
)
def test_expiring_is_judged_against_the_grants_own_ttl(remaining, ttl, expected):
    assert classify(remaining, expiring_within=15.0, ttl=ttl) is expected


def test_zero_window_means_no_lock_is_ever_expiring():
    assert classify(0.001, expiring_within=0, ttl=1.0) is LockState.HELD


CASES = [
    (remaining, ttl)
    for remaining in (-1.0, 0.0, 0.001, 4.999, 5.0, 5.001, 14.999, 15.0, 15.001, 60.0)
    for ttl in (10.0, 30.0, 3600.0)
]


@pytest.mark.usefixtures("backend")
def test_the_sql_form_of_the_state_rule_agrees_with_classify(database_url):
    """Lists, counts and bulk stale release filter by ``state_condition``; the
    Lock object's state comes from ``classify``: on every database's own date
    arithmetic, at the boundaries of the window and of the ttl's share."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            for remaining, ttl in CASES:
                expires_at = literal(NOW + timedelta(seconds=remaining), UTCDateTime())
                columns = [
                    state_condition(state, expires_at, NOW, 15.0, literal(ttl)).label(
                        state.value
                    )
                    for state in LockState
                ]
                row = conn.execute(select(*columns)).one()
                found = [state for state in LockState if getattr(row, state.value)]
                assert found == [classify(remaining, 15.0, ttl)], (remaining, ttl)
    finally:
        engine.dispose()


@pytest.mark.usefixtures("backend")
def test_seconds_between_instants_is_exact_to_the_millisecond(database_url):
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            for seconds in (0.001, 15.0, 86400.5, -2.25):
                later = literal(NOW + timedelta(seconds=seconds), UTCDateTime())
                found = conn.scalar(
                    select(seconds_between(literal(NOW, UTCDateTime()), later))
                )
                assert float(found) == pytest.approx(seconds, abs=1e-3)
    finally:
        engine.dispose()


def test_a_window_without_ttls_judges_by_the_window_alone():
    expires_at = literal(NOW + timedelta(seconds=10), UTCDateTime())
    with create_engine("sqlite://").connect() as conn:
        row = conn.execute(
            select(state_condition(LockState.EXPIRING, expires_at, NOW, 15.0))
        ).one()
    assert row[0]
