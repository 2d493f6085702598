"""tooz's own driver-independent tests (``tooz/tests/test_coordination.py`` of the
pinned tooz release, unchanged) against a live Lockkeeper, through the
``lockkeeper://`` driver of ``lockkeeper-client[tooz]``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tooz
import tooz.coordination

pytestmark = pytest.mark.slow

TOOZ_RELEASE = "9.1.0"  # the suite below is this release's
# Lock tests of exclusive and shared locks, without force-breaking another holder.
AT_LEAST_PASSED = 32


def test_the_driver_is_found_by_its_url_scheme(live_server):
    host = live_server.url.removeprefix("http://")
    coordinator = tooz.coordination.get_coordinator(
        f"lockkeeper://{host}/?token={live_server.token}", b"member-1"
    )
    coordinator.start()
    try:
        first = coordinator.get_lock(b"job:tooz")
        second = coordinator.get_lock(b"job:tooz")
        assert first.acquire(blocking=False)
        assert not second.acquire(blocking=False)  # each Lock its own holder
        assert first.release()
        assert not first.release()
        with pytest.raises(tooz.NotImplemented):
            coordinator.watch_join_group(b"group", lambda event: None)
    finally:
        coordinator.stop()


# The driver speaks HTTP: the database behind the server changes nothing it sees
# (each database's semantics have the server's own tests), so tooz's suite runs
# once, on the database of multi-instance deployments.
@pytest.mark.backends("postgresql")
def test_toozs_own_coordination_tests_pass_against_lockkeeper(
    live_server, backend, tmp_path, record_property
):
    assert tooz.__file__  # the installed release's tests, not a copy
    from importlib.metadata import version

    assert version("tooz") == TOOZ_RELEASE
    host = live_server.url.removeprefix("http://")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(tmp_path / "pytest.ini"),
            "-p",
            "no:cacheprovider",
            "-q",
            "--pyargs",
            "tooz.tests.test_coordination",
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "TOOZ_TEST_URL": f"lockkeeper://{host}/?token={live_server.token}",
            "LOCKKEEPER_TOKEN": live_server.token,
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout else ""
    record_property("tooz_summary", f"{backend}: {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed, summary
    assert int(passed.group(1)) >= AT_LEAST_PASSED, summary
    assert "failed" not in summary, summary
    assert "error" not in summary, summary
