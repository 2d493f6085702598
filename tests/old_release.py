"""The code of an earlier release, served from this repository's history.

A release is named by its schema head: the code is the last commit of main
whose migration scripts ended at that revision (the parent of the commit that
added the next migration). Its tree is read with ``git archive`` and served by a
subprocess whose ``sys.path`` starts with it, so the old ``app`` (and its
worker client) is imported, not this one: the rolling-upgrade tests run the
previous release's requests against a database this code migrates.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from lockkeeper_core.schema import LEGACY_VERSION_TABLE, VERSION_TABLE
from sqlalchemy import Engine, text

from app.paths import PROJECT_ROOT

# Where the migration scripts are, and were before the lock core became a
# distribution of its own.
VERSIONS = ("core/src/lockkeeper_core/migrations/versions", "app/migrations/versions")
# What a server of the old tree needs to import and render (of these, what the
# tree has: ``core`` came later).
TREE_PATHS = ("app", "core/src", "client/src", "templates", "static")

SERVE = """
import json, sys
from werkzeug.serving import make_server
from app import create_app
from app.auth.service import create_token

app = create_app()
with app.app_context():
    token = create_token("traffic")
server = make_server("127.0.0.1", 0, app, threaded=True)
print(json.dumps({"port": server.server_port, "token": token}), flush=True)
server.serve_forever()
"""


def as_a_release_left_it(engine: Engine) -> None:
    """The schema's revision moved to where every release up to 0.2 kept it,
    ``alembic_version``, as if that release's own migrations had made the
    database (the same objects: tests/test_routines.py holds them equal)."""
    with engine.begin() as conn:
        revisions = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
        rows = [{"r": revision} for revision in revisions.scalars()]
        conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
        conn.execute(
            text(
                f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32)"
                f" NOT NULL, CONSTRAINT {LEGACY_VERSION_TABLE}_pkc"
                " PRIMARY KEY (version_num))"
            )
        )
        conn.execute(text(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES (:r)"), rows)


def _git(*args: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), *args], check=True, capture_output=True
    ).stdout


def _down_revision(source: bytes) -> str | None:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "down_revision" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def _scripts(commit: str) -> list[str]:
    """The paths of ``commit``'s migration scripts."""
    return [
        name
        for folder in VERSIONS
        for name in _git("ls-tree", "--name-only", commit, f"{folder}/")
        .decode()
        .split()
        if name.endswith(".py") and not name.endswith("__init__.py")
    ]


def _has(commit: str, path: str) -> bool:
    return bool(_git("ls-tree", "--name-only", commit, "--", path).strip())


def release_commit(revision: str) -> str:
    """The last commit whose migrations ended at ``revision``."""
    for name in _scripts("HEAD"):
        # Added where the scripts were then: the oldest add of either path.
        places = [f"{folder}/{name.rsplit('/', 1)[1]}" for folder in VERSIONS]
        added = _git("log", "--diff-filter=A", "--format=%H", "--", *places).split()
        if not added:
            continue
        first = added[-1].decode()
        path = next(place for place in places if _has(first, place))
        if _down_revision(_git("show", f"{first}:{path}")) == revision:
            commit = _git("rev-parse", f"{first}^").decode().strip()
            # The next migration may have come in one commit with this one:
            # then no commit of this history ends at ``revision``. Two may
            # have been written on it side by side, the one that landed second
            # then put after the first: the first one's parent ends there.
            if _head_of(commit) == revision:
                return commit
    raise LookupError(f"no commit of this history ends its migrations at {revision}")


def _head_of(commit: str) -> str | None:
    """The newest revision of ``commit``'s migrations (none points down to it)."""
    revisions, downs = set(), set()
    for name in _scripts(commit):
        revisions.add(name.rsplit("/", 1)[1].split("_", 1)[0])
        downs.add(_down_revision(_git("show", f"{commit}:{name}")))
    heads = revisions - downs
    return heads.pop() if len(heads) == 1 else None


def release_tree(revision: str, into: Path) -> Path:
    """The code of that release, extracted under ``into`` (once)."""
    tree = into / f"release-{revision}"
    if not tree.exists():
        commit = release_commit(revision)
        paths = [path for path in TREE_PATHS if _has(commit, path)]
        archive = _git("archive", commit, *paths)
        partial = into / f".release-{revision}.{os.getpid()}"
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(tree)
    return tree


@dataclass
class OldServer:
    url: str
    token: str
    process: subprocess.Popen


@contextmanager
def serving(tree: Path, database_url: str, instance: Path) -> Iterator[OldServer]:
    """The old release's app on a threaded HTTP server, an API token of its own."""
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(
            str(path) for path in (tree, tree / "core" / "src", tree / "client" / "src")
        ),
        "LOCKKEEPER_DATABASE_URL": database_url,
        "LOCKKEEPER_INSTANCE_PATH": str(instance),
        "LOCKKEEPER_SECRET_KEY": "old-release",
        "LOCKKEEPER_BOOTSTRAP": "false",
        "LOCKKEEPER_AUTO_MIGRATE": "false",
        "LOCKKEEPER_REFUSALS_FLUSH_SECONDS": "0",
    }
    log = (instance.parent / f"{tree.name}.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        line = process.stdout.readline()  # "" once it exits
        if not line:
            log.flush()
            raise RuntimeError(
                "the old release did not start: " + Path(log.name).read_text()[-2000:]
            )
        started = json.loads(line)
        yield OldServer(
            f"http://127.0.0.1:{started['port']}", started["token"], process
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
