"""Generate the blocking client (``_sync/``) from the asyncio one (``_async/``).

The behaviour is written once, as async code; this script removes ``async`` and
``await`` and renames the async names to their blocking twins (unasync, token by
token), then sorts the imports and formats the result as the repository does::

    python client/scripts/make_sync.py           # rewrite _sync/
    python client/scripts/make_sync.py --check   # CI: fail if _sync/ is stale
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lockkeeper_client"
SOURCE = PACKAGE / "_async"
TARGET = PACKAGE / "_sync"
HEADER = "# Generated from _async/ by client/scripts/make_sync.py: edit that.\n"
RENAMES = {
    "_async": "_sync",
    "AsyncLockClient": "LockClient",
    "AsyncHeldLock": "HeldLock",
    "AsyncHeldSet": "HeldSet",
    "AsyncSetPort": "SetPort",
    "AsyncGrantWait": "GrantWait",
    "AsyncLockPort": "LockPort",
    "AsyncDirectCalls": "DirectCalls",
    "AsyncLockSession": "LockSession",
    "AsyncSessionLock": "SessionLock",
    "AsyncLeadership": "Leadership",
    "AsyncClient": "Client",
    "AsyncBaseTransport": "BaseTransport",
    "aclose": "close",
    "aread": "read",
    # httpx-sse: the stream reader of watch().
    "aconnect_sse": "connect_sse",
    "aiter_sse": "iter_sse",
    # lockkeeper_client/_concurrency.py: each primitive, written twice.
    "AsyncEvent": "Event",
    "AsyncBackground": "Background",
    "async_sleep": "sleep",
    "async_wait_event": "wait_event",
    "async_shielded": "shielded",
    # lockkeeper_client/_transports.py: the sockets under httpx.
    "async_fast_streams": "fast_streams",
}


def _ruff(*args: str, source: str, path: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(path), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def generate() -> dict[str, str]:
    """File name → the text ``_sync/`` should hold."""
    rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=RENAMES)
    with tempfile.TemporaryDirectory() as tmp:
        copied = Path(tmp) / "_async"
        shutil.copytree(SOURCE, copied, ignore=shutil.ignore_patterns("__pycache__"))
        unasync.unasync_files([str(path) for path in copied.glob("*.py")], [rule])
        generated = {
            path.name: HEADER + path.read_text()
            for path in sorted((Path(tmp) / "_sync").glob("*.py"))
        }
    for name, text in generated.items():
        text = _ruff(
            "check", "--fix-only", "--select", "I", source=text, path=TARGET / name
        )
        generated[name] = _ruff("format", source=text, path=TARGET / name)
    return generated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if _sync/ is stale")
    args = parser.parse_args()
    wanted = generate()
    present = {path.name: path.read_text() for path in TARGET.glob("*.py")}
    if args.check:
        stale = sorted(
            name
            for name in wanted.keys() | present.keys()
            if wanted.get(name) != present.get(name)
        )
        for name in stale:
            print(
                f"{TARGET / name} is not what _async/{name} generates", file=sys.stderr
            )
        if stale:
            print("run: python client/scripts/make_sync.py", file=sys.stderr)
        return 1 if stale else 0
    TARGET.mkdir(exist_ok=True)
    for name in present.keys() - wanted.keys():
        (TARGET / name).unlink()
    for name, text in wanted.items():
        (TARGET / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
