"""A case that applies to some databases only is collected on those only
(``@pytest.mark.backends``): elsewhere it is not a test that passes unchecked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def collected(*files: str) -> set[str]:
    """The test ids pytest collects from ``files`` on all three databases."""
    found = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"]
        + ["--backends", "sqlite,postgresql,mariadb", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return {line.split("::", 1)[1] for line in found.splitlines() if "::" in line}


@pytest.fixture(scope="module")
def seam_and_stream() -> set[str]:
    return collected("tests/test_driver_seam.py", "tests/test_events_stream.py")


@pytest.mark.parametrize(
    ("test", "backends"),
    [
        # One autocommit statement on the seam: PostgreSQL and MariaDB.
        ("test_a_row_comes_back_by_name_with_utc_instants", {"postgresql", "mariadb"}),
        ("test_a_duplicate_insert_is_an_integrity_error", {"postgresql", "mariadb"}),
        (
            "test_an_unreachable_server_is_an_operational_error",
            {"postgresql", "mariadb"},
        ),
        # A transaction on the seam: SQLite and MariaDB.
        (
            "test_a_transaction_binds_and_reads_back_aware_utc_instants",
            {"sqlite", "mariadb"},
        ),
        (
            "test_a_transaction_refuses_a_naive_instant_and_writes_nothing",
            {"sqlite", "mariadb"},
        ),
        (
            "test_a_duplicate_insert_in_a_transaction_is_a_lost_race",
            {"sqlite", "mariadb"},
        ),
        # NOTIFY: PostgreSQL only.
        ("test_postgresql_streams_wake_on_notify_not_on_their_poll", {"postgresql"}),
        (
            "test_postgresql_writers_notify_only_while_a_listener_is_registered",
            {"postgresql"},
        ),
    ],
)
def test_a_case_is_collected_only_on_the_databases_it_applies_to(
    seam_and_stream, test, backends
):
    assert {
        case.removeprefix(f"{test}[").removesuffix("]")
        for case in seam_and_stream
        if case.startswith(f"{test}[")
    } == backends


def test_a_backend_the_marker_leaves_out_is_not_collected_however_chosen():
    """Chosen with --backends, a marker's database still narrows a case."""
    found = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"]
        + ["--backends", "sqlite", "tests/test_driver_seam.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "test_a_row_comes_back_by_name_with_utc_instants" not in found
    assert "test_a_transaction_binds_and_reads_back_aware_utc_instants[sqlite]" in found
