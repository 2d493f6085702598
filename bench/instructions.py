"""Instructions per service acquire+release cycle, counted by callgrind.

Wall-clock rates on a shared two-core machine move by a third between runs;
the number of instructions the Python process executes per cycle does not. This
counts them for the exclusive lock's cycle (``LockService.acquire`` then
``release`` of one resource), in a thread of its own so that start-up and
imports are not counted (``--toggle-collect=start_thread``), as the difference
between a long and a short run divided by the cycles between them (what is left
of the thread's start cancels out). The database server's own work is not in
it: on PostgreSQL it counts the client side of the one statement per call.

``--cycle embedded`` counts the worker client's cycle in the embedded mode
instead (``LockClient.acquire`` then ``release`` on ``EmbeddedTransport``, as an
API token: the client, the token check, the core), and ``--cycle driver`` the raw
driver's cycle the service benchmarks compare with (``bench.driver_sql``'s
statements on a plain driver connection), so a ratio of the two is a ratio of
CPU a worker pays per lock.

Any checkout can be measured with the same script (``--tree``), which is how a
change is compared with the code before it:

    python -m bench.instructions --tree ../before --tree .
    python -m bench.instructions --url postgresql://…/db_at_head --tree .

Each tree needs its database migrated to its own schema: SQLite (the default)
gets a fresh file per tree, migrated by that tree's code; a ``--url`` names a
database already at that tree's revision. Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

WARMUP = 50


CYCLES = ("service", "embedded", "driver")


def _cycles(
    cycles: int, url: str, instance: str, migrate: bool, kind: str = "service"
) -> None:
    """The measured child: the app on ``url``, warmed up, then ``cycles``
    acquire+release cycles of ``kind`` in a thread of their own."""
    from app import create_app

    try:
        from app.extensions import lock_service
    except ImportError:  # a tree from before the lock core stood alone
        from app.locks.service import lock_service

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": instance,
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": migrate,
            "SECRET_KEY": "bench",
            "LOCKKEEPER_REFUSALS_FLUSH_SECONDS": 0,  # no thread but ours
        }
    )
    with app.app_context():
        service = lock_service()
        if kind == "embedded":
            from app.auth.service import create_token

            secret = create_token(f"bench-instructions-{os.getpid()}")
    if kind == "service":

        def cycle() -> bool:
            granted = service.acquire("bench:1", "w", ttl=30).acquired
            service.release("bench:1", "w")
            return granted

    elif kind == "embedded":
        from lockkeeper_client import LockClient
        from lockkeeper_core.embedded import EmbeddedTransport

        client = LockClient("http://embedded", secret, transport=EmbeddedTransport(url))

        def cycle() -> bool:
            granted = client.acquire("bench:1", "w", ttl=30).acquired
            client.release("bench:1", "w")
            return granted

    else:
        from bench.driver_sql import connect, driver_for

        driver, conn = driver_for(url), connect(url)

        def cycle() -> bool:
            granted = driver.service_acquire(conn, "bench:1", "w", 30) is not None
            return driver.service_release(conn, "bench:1", "w") and granted

    with app.app_context():
        for _ in range(WARMUP):
            cycle()

    def run() -> None:
        with app.app_context():
            for _ in range(cycles):
                if not cycle():
                    raise RuntimeError("bench:1 was not granted")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def _source_path(tree: Path) -> str:
    """The tree's own packages first: its server, its lock core once that
    became a distribution of its own (``core/src``), and its worker client
    (the embedded cycle's)."""
    return os.pathsep.join(
        [str(tree), str(tree / "core" / "src"), str(tree / "client" / "src")]
    )


def _counted(tree: Path, url: str, instance: str, cycles: int, kind: str) -> int:
    """Instructions callgrind counted in the measuring thread."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=start_thread",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                str(cycles),
                url,
                instance,
                kind,
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": _source_path(tree), "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            check=False,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{tree}: the measured run failed\n{done.stderr[-2000:]}")
    return int(found[1])


def per_cycle(
    tree: Path, url: str | None, low: int, high: int, kind: str = "service"
) -> float:
    with tempfile.TemporaryDirectory() as instance:
        if url is None:
            url = f"sqlite:///{instance}/bench.db"
            # Migrated by the tree's own code, outside the count.
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "0",
                    url,
                    instance,
                    "service",
                    "migrate",
                ],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": _source_path(tree)},
                capture_output=True,
                check=True,
            )
        counts = [_counted(tree, url, instance, n, kind) for n in (low, high)]
    return (counts[1] - counts[0]) / (high - low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions", description=__doc__
    )
    parser.add_argument(
        "--tree",
        action="append",
        type=Path,
        help="a checkout to measure (repeatable; default: this one)",
    )
    parser.add_argument("--url", help="a database at the trees' revision")
    parser.add_argument("--low", type=int, default=200)
    parser.add_argument("--high", type=int, default=600)
    parser.add_argument(
        "--cycle",
        action="append",
        choices=CYCLES,
        help="the cycle counted (repeatable; default: service)",
    )
    args = parser.parse_args(argv)
    trees = args.tree or [Path(__file__).resolve().parent.parent]
    first = None
    for kind in args.cycle or ["service"]:
        for tree in trees:
            measured = per_cycle(tree.resolve(), args.url, args.low, args.high, kind)
            first = first or measured
            print(
                f"{tree} {kind}: {measured:,.0f} instructions per cycle "
                f"({measured / first:.3f})"
            )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        cycles, url, instance, kind = (
            int(sys.argv[2]),
            sys.argv[3],
            sys.argv[4],
            sys.argv[5],
        )
        _cycles(cycles, url, instance, migrate=sys.argv[6:] == ["migrate"], kind=kind)
    else:
        sys.exit(main())
