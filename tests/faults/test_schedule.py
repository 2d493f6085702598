"""The fault runs share one pytest-xdist worker (``tests/conftest.py``,
``WORKER_GROUPS``): each starts database servers and app instances of its own
and judges recovery times, which two at once on two cores made late."""

from __future__ import annotations

import os


def test_the_fault_runs_are_kept_on_one_worker(request):
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None
    assert marker.args == ("faults",)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # What ``--dist loadgroup`` schedules by: the marker made into the id.
        assert request.node.nodeid.endswith("@faults"), request.node.nodeid
