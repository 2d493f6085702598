"""The overview's charts as bucketed counts, computed by the database.

Two questions, each answered by a few ``GROUP BY`` queries whose results have at
most a few hundred rows, whatever the number of locks and events:

- How many locks were held / expiring / stale at each sample moment of a window
  (``states``)? Each resource is, between two of its changes, in one *interval*
  with a holder and an expiry ``E``: held while more than ``within`` seconds (or
  half the ttl it was granted or renewed for, if less: ``state.classify``) are
  left, expiring until ``E``, stale after. The database turns every interval into
  the indexes of the first sample moments it covers (``[from, to)``, ``E - within``
  and ``E``) and counts intervals per combination; adding +1 where a state starts
  and -1 where it stops, then summing along the window, gives the counts at every
  moment. The rules are those of ``app.audit.tenures``: after a grant or an
  extension the event names the holder and its expiry; a release or
  force-release frees the resource; before a resource's first event of the
  window, that event tells what it was (a renewal or release: validly held; a
  take-over or a claim with a previous owner: stale; a first acquire: free). A
  resource without events in the window kept its current row all along. A
  resource held by holders (a semaphore's, shared readers) has several holders
  at once: it is counted once, in the state of its grant that ends first, each
  grant read from its own fence's events or its holder's row.
- How many events happened in each bucket of the window (``per_bucket``)?

Never a row per lock or per event into Python (that was 20,000 locks classified
at 61 moments each, 98 % of the overview's time at 100,000 locks).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lockkeeper_core.models import DistributedLock, LockEvent, LockHolder
from lockkeeper_core.state import EXPIRING_SHARE, Action, LockState, state_condition
from lockkeeper_core.statements.listing import granted_ttl
from sqlalchemy import (
    BigInteger,
    Integer,
    and_,
    case,
    cast,
    func,
    literal,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from app.audit.tenures import ENDINGS, EXTENSIONS, GRANTS
from app.database import UTCDateTime
from app.extensions import db

events = LockEvent.__table__
locks = DistributedLock.__table__
holders = LockHolder.__table__

STATES = ("held", "expiring", "stale")
HOLDING = [a.value for a in (*GRANTS, *EXTENSIONS)]
FREEING = [a.value for a in ENDINGS]
# Before one of these, the resource was validly held (expiry unknown).
VALID_BEFORE = [a.value for a in (*EXTENSIONS, *ENDINGS, Action.FORCE_CLAIMED)]
# Before one of these, the grant of its fence was held (expiry unknown).
FENCE_HELD_BEFORE = [a.value for a in (*EXTENSIONS, *ENDINGS)]
# Ids grow with inserts and ``occurred_at`` with the clock; they can disagree by
# about one transaction's length. An event this much older than the window has a
# smaller id than every event of the window.
ID_MARGIN = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class steps_between(FunctionElement):  # noqa: N801 (a SQL function's name)
    """``floor((later - earlier) / step)`` as an integer, for ``later >= earlier``
    (instants; ``step`` in whole microseconds), in each database's own date
    arithmetic, exact (integers or numerics, never a float that lands an instant
    on a bucket boundary one bucket early)."""

    type = Integer()
    inherit_cache = True
    name = "steps_between"


def _parts(element, compiler, **kw) -> tuple[str, str, int]:
    earlier, later, step = element.clauses
    micros = int(step.name)
    return compiler.process(earlier, **kw), compiler.process(later, **kw), micros


@compiles(steps_between, "postgresql")
def _steps_postgresql(element, compiler, **kw):
    earlier, later, micros = _parts(element, compiler, **kw)
    return (
        f"CAST(floor(extract(epoch FROM ({later} - {earlier})) * 1000000 "
        f"/ {micros}) AS INTEGER)"
    )


@compiles(steps_between, "sqlite")
def _steps_sqlite(element, compiler, **kw):
    earlier, later, micros = _parts(element, compiler, **kw)
    # SQLite's date functions keep milliseconds; rounding the float difference
    # to them gives the exact count, and integer division of non-negative
    # integers is floor.
    return (
        f"(CAST(round((julianday({later}) - julianday({earlier})) * 86400000.0) "
        f"AS INTEGER) / {max(micros // 1000, 1)})"
    )


@compiles(steps_between, "mysql")
@compiles(steps_between, "mariadb")
def _steps_mysql(element, compiler, **kw):
    earlier, later, micros = _parts(element, compiler, **kw)
    return f"(TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) DIV {micros})"


class micros_between(FunctionElement):  # noqa: N801 (a SQL function's name)
    """``later - earlier`` in whole microseconds (instants), an integer in each
    database's own date arithmetic (SQLite's keeps milliseconds)."""

    type = BigInteger()
    inherit_cache = True
    name = "micros_between"


@compiles(micros_between, "postgresql")
def _micros_postgresql(element, compiler, **kw):
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return f"CAST(round(extract(epoch FROM ({later} - {earlier})) * 1000000) AS BIGINT)"


@compiles(micros_between, "sqlite")
def _micros_sqlite(element, compiler, **kw):
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return (
        f"(CAST(round((julianday({later}) - julianday({earlier})) * 86400000.0) "
        "AS INTEGER) * 1000)"
    )


@compiles(micros_between, "mysql")
@compiles(micros_between, "mariadb")
def _micros_mysql(element, compiler, **kw):
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return f"TIMESTAMPDIFF(MICROSECOND, {earlier}, {later})"


class int_div(FunctionElement):  # noqa: N801 (a SQL function's name)
    """``floor(a / b)`` of two non-negative integers, as an integer."""

    type = BigInteger()
    inherit_cache = True
    name = "int_div"


@compiles(int_div)
def _int_div(element, compiler, **kw):
    a, b = (compiler.process(c, **kw) for c in element.clauses)
    return f"(({a}) / ({b}))"


@compiles(int_div, "mysql")
@compiles(int_div, "mariadb")
def _int_div_mysql(element, compiler, **kw):
    a, b = (compiler.process(c, **kw) for c in element.clauses)
    return f"(({a}) DIV ({b}))"


MICROSECOND = timedelta(microseconds=1)
# ``EXPIRING_SHARE`` as a whole divisor of a ttl in microseconds (exact
# integer arithmetic in every database).
SHARE_DIVISOR = round(1 / EXPIRING_SHARE)
assert SHARE_DIVISOR * EXPIRING_SHARE == 1


def ttl_micros(seconds: ColumnElement) -> ColumnElement:
    """A ttl in seconds (``listing.granted_ttl``, a number) as whole microseconds."""
    return cast(func.round(seconds * 1000000), BigInteger)


def instant(value: datetime) -> ColumnElement:
    return literal(value, UTCDateTime())


def micros(step: timedelta) -> ColumnElement:
    # Text, not a parameter: rendered inline (``_parts``), and part of the
    # statement's cache key, so another step compiles another statement.
    return literal_column(str(step // timedelta(microseconds=1)))


def on_grid(at: datetime, step: timedelta) -> datetime:
    """The grid moment at or before ``at``: the charts' moments are whole steps
    from the epoch, so a past bucket is the same bucket in every drawing."""
    return at - (at - EPOCH) % step


@dataclass(frozen=True, slots=True)
class Window:
    """Sample moments ``start + i * step`` (``start`` on the grid) up to ``end``,
    and ``end`` itself when it falls between two of them (the open bucket);
    the buckets are the spans between consecutive moments."""

    start: datetime
    step: timedelta
    end: datetime

    @classmethod
    def ending(cls, end: datetime, step: timedelta, buckets: int) -> Window:
        """``buckets`` whole buckets before the grid moment at or before ``end``,
        then the open one up to ``end``."""
        return cls(start=on_grid(end, step) - step * buckets, step=step, end=end)

    @property
    def whole(self) -> int:
        """Whole steps from ``start`` to ``end``."""
        return (self.end - self.start) // self.step

    @property
    def last_on_grid(self) -> datetime:
        return self.start + self.step * self.whole

    @property
    def moments(self) -> list[datetime]:
        on = [self.start + self.step * i for i in range(self.whole + 1)]
        return on if self.end == on[-1] else [*on, self.end]

    @property
    def slots(self) -> int:
        """Buckets (moments - 1); ``slots + 1`` is the index after the last."""
        return len(self.moments) - 1

    def first_moment(self, at: Any, shift: float = 0.0) -> ColumnElement:
        """The index of the first sample moment ``m`` with ``m >= at - shift``
        (seconds): 0 before the window, ``slots + 1`` after it (or for NULL)."""
        shifted = timedelta(seconds=shift)
        low = instant(self.start + shifted)
        grid_end = instant(self.last_on_grid + shifted)
        step = micros(self.step)
        # ceil((t - start) / step) = whole - floor((last_on_grid - t) / step)
        whens = [
            (at.is_(None), self.slots + 1),
            (at <= low, 0),
            (at <= grid_end, self.whole - steps_between(at, grid_end, step)),
        ]
        if self.end != self.last_on_grid:
            whens.append((at <= instant(self.end + shifted), self.whole + 1))
        return case(*whens, else_=self.slots + 1)

    def first_moment_after(self, offset: Any) -> ColumnElement:
        """The index of the first sample moment ``m`` with ``m - start >=
        offset`` (an integer SQL expression, microseconds): 0 before the
        window, ``slots + 1`` after it (or for NULL); ``first_moment`` for an
        instant computed in microseconds."""
        step = self.step // MICROSECOND
        # Integers written into the statement, as ``micros``: a parameter
        # may be typed numeric, and the division would not be whole.
        whens = [
            (offset.is_(None), self.slots + 1),
            (offset <= 0, 0),
            # ceil(offset / step) for a positive offset
            (
                offset <= self.whole * step,
                int_div(offset + literal_column(str(step - 1)), micros(self.step)),
            ),
        ]
        if self.end != self.last_on_grid:
            whens.append(
                ((offset <= (self.end - self.start) // MICROSECOND), self.whole + 1)
            )
        return case(*whens, else_=self.slots + 1)

    def first_expiring(self, expires_at: Any, ttl: Any, within: float) -> ColumnElement:
        """The index of the first sample moment at which a grant that expires
        at ``expires_at``, last granted or renewed for ``ttl`` microseconds (an
        integer SQL expression), is expiring as ``state.classify`` judges it:
        ``within`` seconds or less left, and no more than ``EXPIRING_SHARE`` of
        its ttl. ``first_moment(expires_at, within)`` for a ttl of at least
        twice ``within``."""
        within_micros = literal_column(str(round(within * 1_000_000)))
        share = int_div(ttl, literal_column(str(SHARE_DIVISOR)))
        shift = case(
            (and_(ttl.is_not(None), share < within_micros), share),
            else_=within_micros,
        )
        return self.first_moment_after(
            micros_between(instant(self.start), expires_at) - shift
        )


def _add(deltas: list[int], lo: int, hi: int, count: int, slots: int) -> None:
    lo, hi = max(lo, 0), min(hi, slots + 1)
    if lo < hi:
        deltas[lo] += count
        deltas[hi] -= count


def _holder(
    deltas: dict[str, list[int]],
    lo: int,
    hi: int,
    expiring_from: int,
    stale_from: int,
    count: int,
    slots: int,
) -> None:
    """An interval ``[lo, hi)`` with a holder whose expiry makes it expiring from
    moment ``expiring_from`` and stale from ``stale_from``."""
    _add(deltas["held"], lo, min(hi, expiring_from), count, slots)
    _add(deltas["expiring"], max(lo, expiring_from), min(hi, stale_from), count, slots)
    _add(deltas["stale"], max(lo, stale_from), hi, count, slots)


def states(window: Window, within: float) -> list[dict[str, int]]:
    """Locks held / expiring / stale at each sample moment of ``window``."""
    slots = window.slots
    start, end = instant(window.start), instant(window.end)
    deltas = {state: [0] * (slots + 2) for state in STATES}
    with db.engine.connect() as conn:
        # Every event of the window has a larger id than the newest event
        # ``ID_MARGIN`` before it (the first event after that moment may be
        # newer than some of the window's: a quiet minute before it).
        older_id = conn.scalar(
            select(events.c.id)
            .where(events.c.occurred_at < window.start - ID_MARGIN)
            .order_by(events.c.occurred_at.desc())
            .limit(1)
        )
        after_id = -1 if older_id is None else older_id
        any_in_window = conn.scalar(
            select(literal(1))
            .where(events.c.occurred_at >= start, events.c.occurred_at < end)
            .limit(1)
        )
        if any_in_window is None:
            in_window = None
        else:
            in_window = (
                select(
                    events.c.id,
                    events.c.resource,
                    events.c.fence,
                    events.c.action,
                    events.c.previous_owner,
                    events.c.expires_at,
                    events.c.occurred_at,
                )
                .where(
                    events.c.id > after_id,
                    events.c.occurred_at >= start,
                    events.c.occurred_at < end,
                )
                .cte("in_window")
            )

        in_the_window = (
            events.c.id > after_id,
            events.c.occurred_at >= start,
            events.c.occurred_at < end,
        )
        touched = select(events.c.resource).where(*in_the_window)
        # Resources held by holders during the window: their row has no owner
        # and its ``places_until`` (the latest expiry of its holders) is after
        # the window's start. A few rows; their states come from their holders
        # (``_holder_held_untouched``), or from their events per holder when the
        # window's events touched them (``_holder_held_touched``); counted apart
        # (``holder_deltas``).
        holder_held = select(locks.c.resource).where(
            locks.c.owner.is_(None), locks.c.places_until > start
        )
        holder_deltas = {state: [0] * (slots + 2) for state in STATES}
        _holder_held_untouched(
            conn,
            window,
            within,
            holder_deltas,
            holder_held,
            None if in_window is None else in_the_window,
        )

        # Resources untouched in the window: their row, all along. Counted as
        # every held row less the rows of the resources the window's events
        # touched (a few, found by their resource), not by an anti-join that
        # probes the events once per held row (100,000 of them). A row that
        # expired before the window is stale all along, one that expires after
        # it (and its expiring span) held all along: those are plainly counted;
        # only the rows expiring within the window are placed per moment.
        expires = locks.c.expires_at
        owned = locks.c.owner.is_not(None)
        shift = timedelta(seconds=within)
        low = instant(window.start + min(shift, timedelta(0)))
        high = instant(window.end + max(shift, timedelta(0)))

        # Each count from index ranges alone, as ``LockService.counts`` does:
        # the rows in a range of ``(expires_at, resource)`` less the free rows
        # (no owner) in the same range of ``(owner, expires_at)``, not a CASE
        # per row of a scan of every lock.
        def counted(*where: ColumnElement) -> Any:
            every = select(func.count()).select_from(locks).where(*where)
            free = every.where(locks.c.owner.is_(None))
            return every.scalar_subquery() - free.scalar_subquery()

        before, after = conn.execute(
            select(counted(expires <= low), counted(expires > high))
        ).one()
        _holder(deltas, 0, slots + 1, 0, 0, before, slots)
        _holder(deltas, 0, slots + 1, slots + 1, slots + 1, after, slots)
        stale_moment = window.first_moment(expires).label("stale_from")
        by_window = (window.first_moment(expires, within).label("expiring_from"),)
        by_ttl = (
            window.first_expiring(
                expires, ttl_micros(granted_ttl(locks.c)), within
            ).label("expiring_from"),
        )
        # Expiring is judged against each grant's own ttl (``classify``), a
        # probe of its events to read (``listing.granted_ttl``), for the rows
        # that need it only. A row no event of the window touched was last
        # granted or renewed before the window, so its ttl is longer than from
        # the window's start to its expiry: a row expiring more than twice
        # ``within`` after the start has a ttl over twice ``within``, and is
        # expiring ``within`` before its expiry, as the window alone says. Not
        # so for a grant bound to a session (its heartbeats write no event;
        # a few rows, found by their index) nor for the rows the window's
        # events touched (subtracted below with the same rule as added).
        near = instant(
            min(
                window.start + max(2 * shift, timedelta(0)),
                window.end + max(shift, timedelta(0)),
            )
        )
        bound = locks.c.session_id.is_not(None)

        def grouped(sign: int, moments, *where: ColumnElement) -> Any:
            """Rows matching ``where`` counted per moment pair, signed; a
            derived table, so no database groups by a probe's expression."""
            per_row = select(*moments, stale_moment).where(*where).subquery()
            c = per_row.c
            return select(
                c.expiring_from, c.stale_from, literal(sign).label("sign"), func.count()
            ).group_by(c.expiring_from, c.stale_from)

        # The rows expiring within the window, as ``counted``: every row of the
        # range (``(expires_at, resource)``) less its free rows (``(owner,
        # expires_at)``), each grouped from its index alone past ``near``; a
        # filter on the owner read every row of the range from the table (a
        # day's expiries: thousands of heap pages).
        near_range = (expires > low, expires <= near)
        far_range = (expires > near, expires <= high)
        free = locks.c.owner.is_(None)
        parts = [
            grouped(1, by_ttl, *near_range),
            grouped(-1, by_ttl, free, *near_range),
            grouped(1, by_window, *far_range),
            grouped(-1, by_window, free, *far_range),
            # A session's grants past ``near``: by their ttl, not the window.
            grouped(-1, by_window, owned, bound, *far_range),
            grouped(1, by_ttl, owned, bound, *far_range),
        ]
        if in_window is not None:
            # The touched rows, each as it was added above.
            either = (
                case(
                    (or_(expires <= near, bound), by_ttl[0].element),
                    else_=by_window[0].element,
                ).label("expiring_from"),
            )
            parts.append(grouped(-1, either, owned, locks.c.resource.in_(touched)))
        for expiring_from, stale_from, sign, count in conn.execute(union_all(*parts)):
            _holder(
                deltas, 0, slots + 1, expiring_from, stale_from, sign * count, slots
            )
        if in_window is None:
            return _with_holders_now(conn, window, within, deltas, holder_deltas)

        w = in_window.c
        _holder_held_touched(
            conn, window, within, holder_deltas, in_window, holder_held, in_the_window
        )
        # The other resources: one holder at a time, each change ending the last.
        exclusive = ~w.resource.in_(holder_held)
        changes = (
            select(
                w.resource,
                w.action,
                w.expires_at,
                w.occurred_at,
                func.lead(w.occurred_at)
                .over(partition_by=w.resource, order_by=w.id)
                .label("until_at"),
            )
            .where(w.action.in_(HOLDING + FREEING), exclusive)
            .cte("changes")
        )
        c = changes.c
        held = (
            select(
                window.first_moment(c.occurred_at).label("lo"),
                window.first_moment(c.until_at).label("hi"),
                window.first_expiring(
                    c.expires_at, micros_between(c.occurred_at, c.expires_at), within
                ).label("expiring_from"),
                window.first_moment(c.expires_at).label("stale_from"),
            )
            .where(c.action.in_(HOLDING))
            .subquery()
        )
        for row in conn.execute(
            select(
                held.c.lo,
                held.c.hi,
                held.c.expiring_from,
                held.c.stale_from,
                func.count(),
            ).group_by(
                held.c.lo,
                held.c.hi,
                held.c.expiring_from,
                held.c.stale_from,
            )
        ):
            _holder(deltas, row[0], row[1], row[2], row[3], row[4], slots)

        # Before each resource's first change: what its first event says. One
        # pass of window functions over the window's events (a self-join of
        # the CTE is a nested loop on PostgreSQL, whose row estimate is 1).
        by_resource = {"partition_by": w.resource, "order_by": w.id}
        firsts = (
            select(
                func.row_number().over(**by_resource).label("n"),
                func.first_value(w.action).over(**by_resource).label("action"),
                func.first_value(w.previous_owner)
                .over(**by_resource)
                .label("previous_owner"),
                func.min(case((w.action.in_(HOLDING + FREEING), w.occurred_at)))
                .over(partition_by=w.resource)
                .label("first_change_at"),
            )
            .where(exclusive)
            .subquery()
        )
        before = (
            select(
                case(
                    (firsts.c.action.in_(VALID_BEFORE), "held"),
                    (firsts.c.previous_owner.is_not(None), "stale"),
                    else_="free",
                ).label("state"),
                window.first_moment(firsts.c.first_change_at).label("hi"),
            )
            .where(firsts.c.n == 1)
            .subquery()
        )
        for state, hi, count in conn.execute(
            select(before.c.state, before.c.hi, func.count())
            .where(or_(before.c.state == "held", before.c.state == "stale"))
            .group_by(before.c.state, before.c.hi)
        ):
            _add(deltas[state], 0, hi, count, slots)
        return _with_holders_now(conn, window, within, deltas, holder_deltas)


def _holder_held_untouched(
    conn, window, within, deltas, holder_held, in_the_window
) -> None:
    """The states of the resources in ``holder_held`` that no event of the
    window touched (an event matching ``in_the_window``, or None: no event),
    from their holders: their
    set did not change in the window, so at each moment such a resource is in
    the state of its holder that ends first after that moment (the rule of
    ``LockService.counts``): with its holders ordered by expiry, holder ``i``
    decides from the expiry of holder ``i - 1`` to its own, held then expiring,
    never stale (a holder that ran out is nobody's grant). One grouped read of
    those few resources' holders."""
    slots = window.slots
    start = instant(window.start)
    earlier = (
        func.lag(holders.c.expires_at)
        .over(
            partition_by=holders.c.resource,
            order_by=(holders.c.expires_at, holders.c.id),
        )
        .label("earlier")
    )
    ttl = ttl_micros(granted_ttl(holders.c)).label("ttl")
    chain = select(holders.c.expires_at, earlier, ttl).where(
        holders.c.resource.in_(holder_held), holders.c.expires_at > start
    )
    if in_the_window is not None:
        # A probe of the events' resource index per holder (a few thousand), not
        # ``NOT IN`` the window's events: PostgreSQL hashes that subquery only
        # while it fits in work_mem, and scanned a day's million events once
        # per holder otherwise (35 s for a day drawn with nothing stored).
        chain = chain.where(
            ~select(literal(1))
            .where(events.c.resource == holders.c.resource, *in_the_window)
            .exists()
        )
    chain = chain.subquery()
    moments = (
        # The first holder left after the window's start decides from its start.
        case(
            (chain.c.earlier.is_(None), 0),
            else_=window.first_moment(chain.c.earlier),
        ).label("lo"),
        window.first_expiring(chain.c.expires_at, chain.c.ttl, within).label(
            "expiring_from"
        ),
        window.first_moment(chain.c.expires_at).label("stale_from"),
    )
    per_holder = select(*moments).subquery()
    by = (per_holder.c.lo, per_holder.c.expiring_from, per_holder.c.stale_from)
    for lo, expiring_from, stale_from, count in conn.execute(
        select(*by, func.count()).group_by(*by)
    ):
        _holder(deltas, lo, stale_from, expiring_from, stale_from, count, slots)


def _holder_held_touched(
    conn, window, within, deltas, in_window, holder_held, in_the_window
) -> None:
    """The states of the resources in ``holder_held`` that events of the window
    (``in_window``, matching ``in_the_window``) touched, counted once per
    resource as ``_holder_held_untouched`` counts the untouched ones: at
    each moment, the state of its live grant that ends first (held, then
    expiring; a grant that ran out is nobody's: never stale). Its grants
    overlap, so each is
    read from its own events (one fence's: its grant and its renewals, until
    its next event or its expiry), not one after another as an exclusive
    lock's changes are. Before a fence's first event of the window, a renewal
    or an end says it was held (expiry unknown); a holder with no event in the
    window held from its row. Then the intervals meet the window's moments,
    grouped by resource and moment in the database: a few resources' grants,
    never a row per event into Python."""
    slots = window.slots
    w = in_window.c
    by_fence = {"partition_by": (w.resource, w.fence), "order_by": w.id}
    fenced = (
        select(
            w.resource,
            w.action,
            window.first_moment(w.occurred_at).label("lo"),
            window.first_moment(func.lead(w.occurred_at).over(**by_fence)).label(
                "next_change"
            ),
            # A grant's event sets its expiry to its ttl from the event's time.
            window.first_expiring(
                w.expires_at, micros_between(w.occurred_at, w.expires_at), within
            ).label("expiring_from"),
            window.first_moment(w.expires_at).label("stale_from"),
            func.row_number().over(**by_fence).label("n"),
        )
        .where(w.resource.in_(holder_held), w.action.in_(HOLDING + FREEING))
        .subquery()
    )
    f = fenced.c
    granted = select(
        f.resource,
        f.lo,
        case((f.next_change < f.stale_from, f.next_change), else_=f.stale_from).label(
            "hi"
        ),
        f.expiring_from,
    ).where(f.action.in_(HOLDING))
    held_before = select(f.resource, literal(0), f.lo, literal(slots + 1)).where(
        f.n == 1, f.action.in_(FENCE_HELD_BEFORE)
    )
    touched_here = select(literal(1)).where(
        events.c.resource == holders.c.resource, *in_the_window
    )
    untouched_holders = select(
        holders.c.resource,
        window.first_moment(holders.c.acquired_at),
        window.first_moment(holders.c.expires_at),
        window.first_expiring(
            holders.c.expires_at, ttl_micros(granted_ttl(holders.c)), within
        ),
    ).where(
        holders.c.resource.in_(holder_held),
        holders.c.expires_at > instant(window.start),
        touched_here.exists(),
        ~touched_here.where(events.c.fence == holders.c.fence).exists(),
    )
    grants = union_all(granted, held_before, untouched_holders).subquery()
    resource, lo, hi, expiring_from = grants.c
    moments = select(literal(0).label("i")).cte("moments", recursive=True)
    moments = moments.union_all(
        select((moments.c.i + 1).label("i")).where(moments.c.i < slots)
    )
    first_ending = (
        select(
            moments.c.i,
            func.min(expiring_from).label("expiring_from"),
        )
        .select_from(grants.join(moments, and_(moments.c.i >= lo, moments.c.i < hi)))
        .group_by(resource, moments.c.i)
        .subquery()
    )
    state = case(
        (first_ending.c.i < first_ending.c.expiring_from, "held"), else_="expiring"
    )
    for i, found, count in conn.execute(
        select(first_ending.c.i, state, func.count()).group_by(first_ending.c.i, state)
    ):
        _add(deltas[found], i, i + 1, count, slots)


def _with_holders_now(conn, window, within, deltas, holder_deltas):
    """The counts at every moment: the exclusive grants' and the holders' summed.
    At the window's end (now) a resource held by holders is counted exactly as
    ``LockService.counts`` counts it, from its live holders, whatever its events
    in the window suggested (they tell one grant after another, not which of
    several holders were still live)."""
    slots = window.slots
    counted = _summed(deltas, slots)
    by_holders = _summed(holder_deltas, slots)
    end = instant(window.end)
    # Each resource's live holder that ends first, with the ttl it was last
    # granted or renewed for (a few holders).
    live = (
        select(
            holders.c.expires_at,
            granted_ttl(holders.c).label("ttl"),
            func.row_number()
            .over(
                partition_by=holders.c.resource,
                order_by=(holders.c.expires_at, holders.c.id),
            )
            .label("n"),
        )
        .where(
            holders.c.resource.in_(
                select(locks.c.resource).where(
                    locks.c.owner.is_(None), locks.c.places_until > end
                )
            ),
            holders.c.expires_at > end,
            holders.c.acquired_at <= end,
        )
        .subquery()
    )
    first_ends = select(live.c.expires_at, live.c.ttl).where(live.c.n == 1).subquery()
    ends, ttl = first_ends.c.expires_at, first_ends.c.ttl
    by_holders[-1] = dict(
        zip(
            STATES,
            conn.execute(
                select(
                    *(
                        func.count(
                            case(
                                (
                                    state_condition(
                                        state, ends, window.end, within, ttl=ttl
                                    ),
                                    1,
                                )
                            )
                        )
                        for state in LockState
                    )
                ).select_from(first_ends)
            ).one(),
            strict=True,
        )
    )
    return [
        {state: mine[state] + theirs[state] for state in STATES}
        for mine, theirs in zip(counted, by_holders, strict=True)
    ]


def _summed(deltas: dict[str, list[int]], slots: int) -> list[dict[str, int]]:
    running = dict.fromkeys(STATES, 0)
    counts = []
    for i in range(slots + 1):
        for state in STATES:
            running[state] += deltas[state][i]
        counts.append(dict(running))
    return counts


def per_bucket(window: Window) -> list[dict[str, int]]:
    """Events per action in each of the window's ``slots`` buckets, oldest first."""
    start = instant(window.start)
    slots = (
        select(
            steps_between(start, events.c.occurred_at, micros(window.step)).label(
                "slot"
            ),
            events.c.action,
        )
        .where(
            events.c.occurred_at >= start, events.c.occurred_at < instant(window.end)
        )
        .subquery()
    )
    query = select(slots.c.slot, slots.c.action, func.count()).group_by(
        slots.c.slot, slots.c.action
    )
    counts: list[dict[str, int]] = [{} for _ in range(window.slots)]
    with db.engine.connect() as conn:
        for index, action, count in conn.execute(query):
            if 0 <= index < window.slots:
                counts[index][action] = counts[index].get(action, 0) + count
    return counts
