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
