"""The fenced-write workload (tests/faults/fenced.py): its checker fails the
histories it must fail, and a bounded run with SIGSTOPped holders on PostgreSQL
and MariaDB finds no committed write outside its fence's tenure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.faults.fenced import FencedConfig, check, run

T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(id_, action, fence, seconds, resource="fenced:0"):
    return {
        "id": id_,
        "resource": resource,
        "action": action,
        "fence": fence,
        "occurred_at": at(seconds),
    }


def write(fence, seconds, owner="w", resource="fenced:0"):
    return {
        "resource": resource,
        "fence": fence,
        "owner": owner,
        "written_at": at(seconds),
    }


EVENTS = [
    event(1, "acquired", 1, 0),
    event(2, "renewed", 1, 0.5),
    event(3, "took_over", 2, 2),  # fence 1 expired, fence 2 takes over at 2 s
    event(4, "released", 2, 3),
    event(5, "acquired", 3, 4),
]


def test_the_checker_accepts_writes_inside_their_tenures():
    report = check([write(1, 0.1), write(1, 1.9), write(2, 2.5), write(3, 9)], EVENTS)
    assert report.violations == []
    assert report.stats["take_overs"] == 1


def test_the_checker_finds_a_paused_holders_write_after_the_take_over():
    writes = [write(1, 0.1), write(2, 2.05), write(1, 2.1, owner="paused")]
    report = check(writes, EVENTS)
    assert len(report.violations) == 2  # outside its tenure, and fence order
    assert "paused" in report.violations[0]
    assert "fence 1 wrote after fence 2" in report.violations[1]


def test_the_checker_finds_a_write_after_the_holder_released():
    assert len(check([write(2, 3.5)], EVENTS).violations) == 1


def test_the_checker_finds_a_write_under_a_fence_never_granted_there():
    (violation,) = check([write(7, 1)], EVENTS).violations
    assert "never granted" in violation


@pytest.mark.slow
@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_bounded_fenced_write_run_finds_no_violation(databases, tmp_path, server):
    def exercised(stats) -> bool:
        return (
            stats["pauses"] >= 4
            and stats["take_overs"] >= 3
            and stats["writes_committed"] >= 30
            and sum(stats["writes_refused"].values()) >= 1
        )

    # On a loaded machine 6 s may see no paused holder write late: run again,
    # longer (every run must be free of violations), up to a deadline.
    for duration in (6.0, 12.0, 24.0):
        url = databases(server).fresh(tmp_path)
        report = run(
            FencedConfig(database_url=url, duration=duration), log=lambda _: None
        )
        stats = report.stats
        assert report.violations == [], stats
        if exercised(stats):
            break
    # The run exercised what it claims to: paused holders, take-overs, refusals.
    assert stats["pauses"] >= 4
    assert stats["take_overs"] >= 3
    assert stats["writes_committed"] >= 30
    assert sum(stats["writes_refused"].values()) >= 1
    assert stats["write_errors"] == 0
