"""``python -m lockkeeper_core``: the lock schema on a worker's own database,
without the server (whose ``lockkeeper db`` commands do the same on its own).

    python -m lockkeeper_core upgrade postgresql://app@db/app
    python -m lockkeeper_core current postgresql://app@db/app
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.exc import SQLAlchemyError

from lockkeeper_core.engine import engine_for
from lockkeeper_core.schema import (
    CORE_UPGRADE_COMMAND,
    schema_state,
    shown_revisions,
    worker_problem,
)
from lockkeeper_core.upgrade import (
    DEFAULT_ATTEMPTS,
    DEFAULT_LOCK_TIMEOUT,
    UpgradeFailed,
    upgrade,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lockkeeper_core",
        description="Create, upgrade or check Lockkeeper's lock schema in a database.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "upgrade",
        help="run the migrations this code has and the database has not"
        " (each in its own transaction, safe while workers and servers run)",
    )
    up.add_argument("url", help="the database's SQLAlchemy URL")
    up.add_argument(
        "--lock-timeout",
        type=float,
        default=DEFAULT_LOCK_TIMEOUT,
        help="seconds a migration waits for a lock before it rolls back and"
        f" tries again (default {DEFAULT_LOCK_TIMEOUT:g})",
    )
    up.add_argument(
        "--attempts",
        type=int,
        default=DEFAULT_ATTEMPTS,
        help="tries of a migration whose lock wait ran out"
        f" (default {DEFAULT_ATTEMPTS})",
    )
    current = commands.add_parser(
        "current", help="the database's revision, and whether this code can run on it"
    )
    current.add_argument("url", help="the database's SQLAlchemy URL")
    return parser


def _upgrade(url: str, lock_timeout: float, attempts: int) -> str:
    done = upgrade(
        url,
        lock_timeout=lock_timeout,
        attempts=attempts,
        report=lambda line: print(f"lockkeeper_core: {line}", file=sys.stderr),
        command_name=CORE_UPGRADE_COMMAND,
    )
    if done.after == done.before:
        return f"Already at revision {shown_revisions(done.after)}: nothing to do."
    return (
        f"Upgraded the database from revision {shown_revisions(done.before)}"
        f" to {shown_revisions(done.after)}."
    )


def _current(url: str) -> tuple[str, bool]:
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            state = schema_state(conn)
    finally:
        engine.dispose()
    if state.ready:
        return f"revision {state.current_shown}: {state.verdict()}", True
    return f"revision {state.current_shown}: not ready: {worker_problem(state)}", False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "upgrade":
            print(_upgrade(args.url, args.lock_timeout, args.attempts))
            return 0
        line, ready = _current(args.url)
        print(line)
        return 0 if ready else 1
    except UpgradeFailed as exc:
        print(f"Error: {exc}", file=sys.stderr)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        print(f"Error: the database does not answer: {reason}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
