"""Audit scale benchmark: 100 000 locks and 1 000 000 events, then page timings.

Loads a private database (an SQLite file in a temp dir, or a PostgreSQL database it
creates and drops), then times pages through the Flask test client as a logged-in
viewer, and a full CSV export in a separate process whose peak RSS is read from
/proc (VmHWM), so the loading phase does not count.

    python bench/audit_bench.py --backend sqlite --backend postgresql
    python bench/audit_bench.py --backend postgresql --events 200000 --explain

Loading a million events takes minutes: ``--keep`` leaves the loaded database
in place and prints its URL, ``--reuse URL`` times pages against it again (no
load, nothing dropped). The history ends at the load and the locks' expiries
are spread around it: the charts' last minutes hold events only for a few
minutes after it, so time a kept database soon (a copy of it, a PostgreSQL
``CREATE DATABASE ... TEMPLATE`` or a copied SQLite file, makes the A and B
sides of a comparison the same data). Drop a kept PostgreSQL database with
``DROP DATABASE <name>``; a kept SQLite file is in a temp dir.

Report: docs/benchmarks-audit.md.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get(
    "LOCKKEEPER_BENCH_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
KINDS = ("job", "report", "build", "sync", "mail", "backup", "index", "cache")
OWNERS = 500
PASSWORD = "bench-password-1"
# Two events per 100 ms: the history runs from BASE to about now, so the last hour
# (the overview's charts) holds its share of it, as on a live system.
EVENT_SPACING = timedelta(milliseconds=50)
BASE = datetime.now(UTC).replace(microsecond=0) - EVENT_SPACING * 1_000_000


# -- data -----------------------------------------------------------------------


def resource_name(n: int) -> str:
    return f"{KINDS[n % len(KINDS)]}:{n}"


def generate_events(
    locks: int, events: int, holder: dict, seed: int = 7, base: datetime = BASE
):
    """Event tuples in time order (ties included), streamed: never all in memory.

    Each resource walks a small state machine, so the history is one a real service
    could have written: grants with new fences, renewals, releases, take-overs and
    operator force-releases. ``holder`` ends up with the resources still held.
    """
    rng = random.Random(seed)
    fence = 0
    for i in range(events):
        r = rng.randrange(locks)
        # Two events per 100 ms tick: ties in occurred_at are common.
        at = base + timedelta(milliseconds=100 * (i // 2))
        owner = f"worker-{rng.randrange(OWNERS)}"
        actor, reason, previous = f"token-{rng.randrange(20)}", None, None
        current = holder.get(r)
        if current is None:
            fence += 1
            action, this_fence = "acquired", fence
            holder[r] = (owner, fence, at)
        else:
            held_by, this_fence, since = current
            previous = held_by
            roll = rng.random()
            if roll < 0.55:
                action, owner = "renewed", held_by
            elif roll < 0.85:
                action, owner = "released", held_by
                del holder[r]
            elif roll < 0.9:
                action, owner = "force_released", held_by
                actor, reason = "alice", f"stuck since {since:%H:%M}, rebooting"
                del holder[r]
            else:
                fence += 1
                action, this_fence = "took_over", fence
                holder[r] = (owner, fence, at)
        yield (
            resource_name(r),
            action,
            owner,
            previous,
            this_fence,
            at,
            at + timedelta(seconds=30),
            actor,
            reason,
            at,
        )


# One resource in this many is held by holders, not by an exclusive grant:
# alternately a semaphore of SEMAPHORE_LIMIT with 1 to 4 holders and a lock with
# 2 to 4 shared grants, so the lists read both sources (``listing``).
HOLDER_HELD_EVERY = 100
SEMAPHORE_LIMIT = 5


def holder_held(r: int) -> bool:
    return r % HOLDER_HELD_EVERY == HOLDER_HELD_EVERY // 2


def generate_locks(
    locks: int,
    holder: dict,
    first_free_fence: int,
    holders: list | None = None,
    seed: int = 8,
):
    """Lock rows (resource, owner, fence, acquired_at, expires_at, holder_limit,
    places_until); a holder-held resource's holders go to ``holders`` as
    ``lock_holders`` rows (resource, owner, token, mode, fence, acquired_at,
    expires_at), their fences above every lock row's."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    holder_fence = first_free_fence + locks
    for r in range(locks):
        owner, fence, since = holder.get(
            r, (f"worker-{r % OWNERS}", first_free_fence + r, BASE)
        )
        expires = now + timedelta(seconds=rng.uniform(-3600, 3600))
        if not holder_held(r):
            yield (resource_name(r), owner, fence, since, expires, 1, None)
            continue
        shared = (r // HOLDER_HELD_EVERY) % 2 == 1
        count = rng.randint(2, 4) if shared else rng.randint(1, 4)
        until = since
        for worker in rng.sample(range(OWNERS), count):
            holder_fence += 1
            ends = now + timedelta(seconds=rng.uniform(60, 3600))
            until = max(until, ends)
            if holders is not None:
                holders.append(
                    (
                        resource_name(r),
                        f"worker-{worker}",
                        "bench",
                        "shared" if shared else "exclusive",
                        holder_fence,
                        now,
                        ends,
                    )
                )
        limit = 1 if shared else SEMAPHORE_LIMIT
        # The row of a resource held by holders: no owner, free since its last
        # exclusive grant ended.
        yield (resource_name(r), None, fence, since, since, limit, until)


LOCK_COLUMNS = (
    "resource, owner, fence, acquired_at, expires_at, holder_limit, places_until"
)
HOLDER_COLUMNS = "resource, owner, token, mode, fence, acquired_at, expires_at"


EVENT_COLUMNS = (
    "resource, action, owner, previous_owner, fence, acquired_at, expires_at, "
    "actor, reason, occurred_at"
)


def load(url: str, n_locks: int, n_events: int) -> None:
    from sqlalchemy import create_engine, text

    holder: dict = {}
    # The newest event is about now, whatever the number of events.
    base = datetime.now(UTC).replace(microsecond=0) - EVENT_SPACING * n_events
    events = generate_events(n_locks, n_events, holder, base=base)
    # Lock rows use fences above every event's, holders above theirs; the
    # counter starts above all of them.
    next_fence = n_events + n_locks * 5 + 1
    holders: list = []

    def locks():
        return generate_locks(n_locks, holder, n_events + 1, holders)

    engine = create_engine(url)
    started = time.perf_counter()
    if engine.dialect.name == "postgresql":
        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            with cur.copy(f"COPY lock_events ({EVENT_COLUMNS}) FROM STDIN") as copy:
                for row in events:
                    copy.write_row(row)
            for table, columns, rows in (
                ("distributed_locks", LOCK_COLUMNS, locks()),
                # After the locks: their generator fills ``holders``.
                ("lock_holders", HOLDER_COLUMNS, holders),
            ):
                with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            cur.execute("SELECT setval('lock_fence_seq', %s)", (next_fence,))
            raw.commit()
            # What autovacuum does soon after a load: statistics, and the
            # visibility map (else every index-only scan visits the heap).
            raw.driver_connection.autocommit = True
            cur.execute("VACUUM ANALYZE")
        finally:
            raw.close()
    else:

        def naive(row):
            return tuple(
                v.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(v, datetime) else v
                for v in row
            )

        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.executemany(
                f"INSERT INTO lock_events ({EVENT_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (naive(row) for row in events),
            )
            cur.executemany(
                f"INSERT INTO distributed_locks ({LOCK_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (naive(row) for row in locks()),
            )
            cur.executemany(
                f"INSERT INTO lock_holders ({HOLDER_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (naive(row) for row in holders),
            )
            cur.execute("UPDATE lock_fence_counter SET value = ?", (next_fence,))
            raw.commit()
            cur.execute("ANALYZE")
            raw.commit()
        finally:
            raw.close()
    with engine.connect() as conn:
        counted = conn.execute(text("SELECT count(*) FROM lock_events")).scalar()
        size = ""
        if engine.dialect.name == "postgresql":
            # What one audit row costs on disk, indexes included (the figure for
            # deciding whether every renewal should stay a row).
            total = conn.execute(
                text("SELECT pg_total_relation_size('lock_events')")
            ).scalar()
            size = f", {total / counted:.0f} bytes per event with its indexes"
    engine.dispose()
    print(
        f"  loaded {n_locks} locks ({len(holders)} places of "
        f"{n_locks // HOLDER_HELD_EVERY} place-held resources), {counted} events in "
        f"{time.perf_counter() - started:.1f} s{size}",
        flush=True,
    )


# -- databases ------------------------------------------------------------------


class BenchDatabase:
    def __init__(self, backend: str, workdir: Path, reuse: str | None = None):
        from sqlalchemy import create_engine, text

        from app.config import normalize_database_url

        self.backend = backend
        self.admin = None
        if reuse is not None:
            # A database a run before loaded and kept: never dropped here.
            self.url = reuse
            return
        if backend == "sqlite":
            self.url = f"sqlite:///{workdir / 'bench.sqlite3'}"
            return
        from sqlalchemy.engine import make_url

        admin_url = make_url(normalize_database_url(PG_ADMIN_URL))
        self.name = f"lk_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {self.name}"))
        self.url = admin_url.set(database=self.name).render_as_string(
            hide_password=False
        )

    def drop(self) -> None:
        from sqlalchemy import text

        if self.admin is None:
            return
        with self.admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)"))
        self.admin.dispose()


def make_app(url: str, instance: Path):
    from app import create_app

    return create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
            "WTF_CSRF_ENABLED": False,
        }
    )


# -- measurements ---------------------------------------------------------------


def timed(client, url: str, runs: int, before=None) -> tuple[float, float, int]:
    client.get(url)  # warm caches and the plan
    samples = []
    status = 0
    for _ in range(runs):
        if before is not None:
            before()
        started = time.perf_counter()
        response = client.get(url)
        response.get_data()
        response.close()  # as a server does once it has sent the body
        samples.append((time.perf_counter() - started) * 1000)
        status = response.status_code
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    return statistics.median(samples), p95, status


def export_child(url: str, instance: str, query: str) -> None:
    """Stream one export through the test client; print rows, seconds, peak RSS."""
    app = make_app(url, Path(instance))
    client = app.test_client()
    client.post("/login", data={"username": "bench", "password": PASSWORD})
    client.get("/audit/export.csv?resource=warm:up").get_data()
    before_kb = _proc_status_kb("VmRSS")
    started = time.perf_counter()
    response = client.get(f"/audit/export.csv{query}", buffered=False)
    lines = 0
    size = 0
    for chunk in response.response:
        data = chunk if isinstance(chunk, bytes) else chunk.encode()
        lines += data.count(b"\n")
        size += len(data)
    response.close()
    seconds = time.perf_counter() - started
    peak_kb = _proc_status_kb("VmHWM")
    print(
        f"{response.status_code} {lines - 1} {size} {seconds:.2f} {before_kb} {peak_kb}"
    )


def _proc_status_kb(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith(field))
    return int(line.split()[1])


def run_export(url: str, instance: Path, query: str = "") -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--export-child", url, str(instance), query],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    status, rows, size, seconds, before_kb, peak_kb = out[-6:]
    return {
        "before_mb": int(before_kb) / 1024,
        "status": int(status),
        "rows": int(rows),
        "mb": int(size) / 1e6,
        "seconds": float(seconds),
        "peak_mb": int(peak_kb) / 1024,
    }


def explain(app) -> None:
    from sqlalchemy import text

    from app.audit.service import EventFilter, events
    from app.extensions import db

    queries = {
        "unfiltered": EventFilter(),
        "owner": EventFilter(owner="worker-7"),
        "prefix (common)": EventFilter(prefix="job:"),
        "prefix (rare)": EventFilter(prefix="job:4242"),
        "time range": EventFilter(
            since=datetime(2026, 11, 1, 6, tzinfo=UTC),
            until=datetime(2026, 11, 1, 7, tzinfo=UTC),
        ),
    }
    from sqlalchemy import select

    with app.app_context(), db.engine.connect() as conn:
        for label, filters in queries.items():
            query = filters.apply(select(events)).order_by(events.c.id.desc()).limit(51)
            compiled = query.compile(
                dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}
            )
            prefix = (
                "EXPLAIN ANALYZE"
                if db.engine.dialect.name == "postgresql"
                else "EXPLAIN QUERY PLAN"
            )
            plan = conn.execute(text(f"{prefix} {compiled}")).all()
            print(f"  -- {label}")
            for row in plan:
                print("    " + " | ".join(str(v) for v in row))


def time_listings(app, runs: int, results: dict) -> None:
    """The service's list orders side by side in one run, the lexical order
    (an index range) the baseline: ratios say what an order costs."""
    from app.extensions import lock_service

    calls = {
        "resource (lexical, baseline)": {"sort": "resource"},
        "natural": {"sort": "natural"},
        "urgent": {"sort": "urgent"},
        "-waiters": {"sort": "-waiters"},
        "contended": {"sort": "urgent", "contended": True},
        "urgent, offset 1000": {"sort": "urgent", "offset": 1000},
    }
    with app.app_context():
        service = lock_service()
        baseline = None
        for label, query in calls.items():
            service.list_locks(limit=25, **query)
            samples = []
            for _ in range(runs):
                started = time.perf_counter()
                service.list_locks(limit=25, **query)
                samples.append((time.perf_counter() - started) * 1000)
            median = statistics.median(samples)
            baseline = baseline or median
            results[f"listing {label}"] = median
            print(
                f"  listing {label:32s} median {median:7.1f} ms  "
                f"({median / baseline:.2f}x the lexical order)",
                flush=True,
            )


def bench(
    backend: str,
    n_locks: int,
    n_events: int,
    runs: int,
    show_plans: bool,
    exports: bool = True,
    only: list[str] | None = None,
    keep: bool = False,
    reuse: str | None = None,
):
    from app.auth.service import create_user
    from app.factory import upgrade_schema

    workdir = Path(tempfile.mkdtemp(prefix="lk-audit-bench-"))
    database = BenchDatabase(backend, workdir, reuse)
    results = {}
    try:
        app = make_app(database.url, workdir)
        upgrade_schema(app)
        if reuse is None:
            with app.app_context():
                create_user("bench", PASSWORD, "viewer")
            load(database.url, n_locks, n_events)
        if keep:
            print(f"  kept: --reuse {database.url}", flush=True)
        if show_plans:
            explain(app)
        # As a gunicorn worker does once its app is loaded (post_worker_init):
        # the loaded objects out of the collector's full passes.
        from app.ops.heap import freeze_loaded_app

        freeze_loaded_app()
        client = app.test_client()
        login = client.post("/login", data={"username": "bench", "password": PASSWORD})
        assert login.status_code in (302, 303), login.status_code
        stamp = datetime.now(UTC)
        now = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        hour_ago = (stamp - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        first = client.get("/audit?limit=50")
        from bs4 import BeautifulSoup

        older = BeautifulSoup(first.get_data(as_text=True), "html.parser").select_one(
            ".pager a[rel=next]"
        )
        pages = {
            "overview /": "/",
            "lock page /locks/job:8": "/locks/job:8",
            "audit, unfiltered": "/audit",
            "audit, page 2 (cursor)": older["href"] if older else "/audit",
            "audit, by owner": "/audit?owner=worker-7",
            "audit, by prefix (1 in 8 events)": "/audit?prefix=job:",
            "audit, by prefix (rare: job:4242*)": "/audit?prefix=job:4242",
            "audit, by resource": "/audit?resource=report:4242",
            "audit, one hour": f"/audit?since={hour_ago}&until={now}",
            "activity /activity": "/activity",
            "overview, stale tab": "/?state=stale",
            "overview, prefix job:1": "/?prefix=job:1",
            "overview, by owner": "/?group=owner",
            "overview, by host": "/?group=host",
            "overview, by prefix": "/?group=prefix",
            "overview, by name (natural)": "/?sort=resource",
            "overview, most waiting": "/?sort=-waiting",
            "overview, contended tab": "/?state=contended",
            "overview, page 40": "/?page=40",
            "freezes /freezes": "/freezes",
        }
        pages = {
            k: v for k, v in pages.items() if not only or any(o in k for o in only)
        }

        def afresh():
            # The charts are drawn once a minute per process: time the draw,
            # which reads the closed buckets stored by the drawings before.
            # A drawing that left part of its range uncounted started a count
            # in the background: let it finish first (not timed).
            from app.dashboard.charts import counting_in_background

            for thread in counting_in_background(app):
                thread.join()
            app.extensions.get("lockkeeper.activity", {}).clear()

        def nothing_stored():
            # The first drawing of a range after a deploy: every bucket counted.
            afresh()
            from app.audit.models import ActivityEvents, ActivitySample
            from app.extensions import db

            with app.app_context():
                db.session.query(ActivitySample).delete()
                db.session.query(ActivityEvents).delete()
                db.session.commit()

        drawn_afresh = {
            "activity, drawn afresh": ("/activity", afresh),
            "activity 24 h, drawn afresh": ("/activity?range=24h", afresh),
            "activity 7 d, drawn afresh": ("/activity?range=7d", afresh),
            "activity, nothing stored": ("/activity", nothing_stored),
            "activity 24 h, nothing stored": ("/activity?range=24h", nothing_stored),
            "activity 7 d, nothing stored": ("/activity?range=7d", nothing_stored),
        }
        for label, (url, _) in drawn_afresh.items():
            if not only or any(o in label for o in only):
                pages[label] = url
        if not only or any("listing" in o for o in only):
            time_listings(app, runs, results)
        for label, url in pages.items():
            before = drawn_afresh[label][1] if label in drawn_afresh else None
            # Each run waits for the background count of the whole range (about
            # 4 s at a million events): ten runs tell it.
            times = min(runs, 10) if before is nothing_stored else runs
            median, p95, status = timed(client, url, times, before)
            results[label] = (median, p95, status)
            print(
                f"  {label:40s} median {median:7.1f} ms  p95 {p95:7.1f} ms  "
                f"(HTTP {status})",
                flush=True,
            )
        # A drawing that left part of its range uncounted is still counting in
        # a thread: let it end before the engine goes (and the interpreter).
        afresh()
        with app.app_context():
            from app.extensions import db

            db.engine.dispose()
        for label, query in (
            ("export, 1 in 8 events (prefix job:)", "?prefix=job:"),
            ("export, every event", ""),
        )[: 2 if exports else 0]:
            found = run_export(database.url, workdir, query)
            results[label] = found
            print(
                f"  {label:40s} {found['rows']} rows, {found['mb']:.0f} MB in "
                f"{found['seconds']:.1f} s, RSS {found['before_mb']:.0f} MB before, "
                f"peak {found['peak_mb']:.0f} MB "
                f"(HTTP {found['status']})",
                flush=True,
            )
    finally:
        if not keep and reuse is None:
            database.drop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend", action="append", choices=["sqlite", "postgresql"], default=[]
    )
    parser.add_argument("--locks", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--no-export", action="store_true", help="pages only")
    parser.add_argument(
        "--only",
        action="append",
        help="time only the pages whose label contains this (repeatable)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the loaded database, print its URL"
    )
    parser.add_argument(
        "--reuse", metavar="URL", help="time pages against a kept database (no load)"
    )
    parser.add_argument("--export-child", nargs=3, metavar=("URL", "INSTANCE", "QUERY"))
    args = parser.parse_args()
    if args.reuse and len(args.backend) != 1:
        parser.error("--reuse takes the one --backend its database is")
    if args.export_child:
        export_child(*args.export_child)
        return
    for backend in args.backend or ["sqlite", "postgresql"]:
        print(f"{backend}: {args.locks} locks, {args.events} events", flush=True)
        bench(
            backend,
            args.locks,
            args.events,
            args.runs,
            args.explain,
            exports=not args.no_export,
            only=args.only,
            keep=args.keep,
            reuse=args.reuse,
        )


if __name__ == "__main__":
    # Quiet the app's logs: only the figures go to stdout.
    sys.stderr = io.TextIOWrapper(sys.stderr.buffer, line_buffering=True)
    main()
