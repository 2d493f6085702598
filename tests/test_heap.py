"""A server worker freezes its loaded app (``app.ops.heap``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a process of its own: a freeze is for a process's life, and the
# gunicorn configuration sets process-wide state when imported.
WORKER = """
import gc, json
import app.ops.gunicorn_conf as conf
from app import create_app

app = create_app({"LOCKKEEPER_DATABASE_URL": "sqlite://", "LOCKKEEPER_BOOTSTRAP": False,
                  "LOCKKEEPER_AUTO_MIGRATE": False, "SECRET_KEY": "x"})
before = gc.get_freeze_count()
conf.post_worker_init(worker=None)
frozen = gc.get_freeze_count()
loaded = app.url_map  # alive since loading: frozen, so no longer in a generation
in_generations = any(loaded is o for o in gc.get_objects())
made_after = {"a request's": [1]}
print(json.dumps({"before": before, "frozen": frozen, "loaded_tracked": in_generations,
                  "after_tracked": any(made_after is o for o in gc.get_objects())}))
"""


def test_a_worker_freezes_what_loading_the_app_left_alive(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["before"] == 0
    # The app and its modules: tens of thousands of objects.
    assert found["frozen"] > 20_000
    assert found["loaded_tracked"] is False
    # What is made afterwards is collected as before.
    assert found["after_tracked"] is True
