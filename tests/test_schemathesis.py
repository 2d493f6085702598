"""The API fuzzed against its own OpenAPI document (``.ci/schemathesis.sh``).

Run as a test so that the suite's workers run it beside the other tests: alone,
before them, it kept the machine's cores half idle for its whole run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.paths import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / ".ci" / "schemathesis.sh"
# The script's own ceiling is for a machine it has to itself; beside the
# suite's other workers its phases take longer.
CEILING_SECONDS = 480
# Per operation, in the suite: half the script's own default. The coverage
# phase walks every documented boundary whatever this is; the random phase's
# 100 examples were the suite's longest test (118 s on CI's loaded cores),
# and with no example database each run draws new ones. By hand the script
# still runs 100.
MAX_EXAMPLES = 50


@pytest.mark.slow
def test_every_operation_answers_as_documented_for_any_input(tmp_path):
    bin_dir = str(Path(sys.executable).parent)  # lockkeeper, gunicorn, schemathesis
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LOCKKEEPER_", "PYTEST_"))
    }
    env.update(
        PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]),
        SCHEMATHESIS_TIMEOUT=str(CEILING_SECONDS),
        SCHEMATHESIS_MAX_EXAMPLES=str(MAX_EXAMPLES),
        TMPDIR=str(tmp_path),
    )
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CEILING_SECONDS + 60,
    )
    assert result.returncode == 0, (result.stdout[-6000:], result.stderr[-4000:])
