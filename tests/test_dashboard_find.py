"""Finding what needs attention: sorting, owner search, grouping (service and pages)."""

from __future__ import annotations

import pytest
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.filters import ENTRIES_RESOURCES
from lockkeeper_core.state import LockState
from sqlalchemy import event, inspect
from sqlalchemy.engine import Engine

from app.extensions import db
from tests.dashboard_helpers import soup

# On every database: the sorts, keyset cursors and case-folding are SQL.
pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
def spread(service, clock):
    """Nine locks acquired a second apart, with ttls that do not follow the
    order of names or of acquisition, some of them run out."""
    ttls = [50, 5, 300, 20, 5, 120, 3, 60, 5]
    owners = ["web1:1:a", "web1:2:b", "DB2:7:c", "web1:1:a", "db2:7:d", "x@web1"] + [
        "batch"
    ] * 3
    for n, (ttl, owner) in enumerate(zip(ttls, owners, strict=True)):
        service.acquire(f"job:{(n * 4) % 9}", owner, ttl=ttl)
        clock.advance(1)
    clock.advance(4)
    return service


def all_pages(service, **query):
    seen, cursor = [], None
    while True:
        page = service.list_locks(limit=2, cursor=cursor, **query)
        seen.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return seen


@pytest.mark.parametrize(
    ("sort", "key", "reverse"),
    [
        ("resource", lambda lock: lock.resource, False),
        ("-resource", lambda lock: lock.resource, True),
        ("expires", lambda lock: (lock.expires_at, lock.resource), False),
        ("-expires", lambda lock: (lock.expires_at, lock.resource), True),
        ("acquired", lambda lock: (lock.acquired_at, lock.resource), False),
        ("-owner", lambda lock: (lock.owner, lock.resource), True),
    ],
)
def test_every_sort_pages_through_all_locks_in_order_without_gaps(
    spread, sort, key, reverse
):
    everything = spread.list_locks(limit=100).items
    paged = all_pages(spread, sort=sort)
    assert [lock.resource for lock in paged] == [
        lock.resource for lock in sorted(everything, key=key, reverse=reverse)
    ]


def test_stale_sorted_by_expiry_puts_the_longest_stale_first(spread):
    stale = all_pages(spread, state="stale", sort="expires")
    assert len(stale) == 4
    assert stale == sorted(stale, key=lambda lock: lock.ttl_remaining)


def test_owner_search_finds_a_substring_ignoring_case(spread):
    found = spread.list_locks(owner_contains="DB2", limit=100).items
    assert sorted(lock.owner for lock in found) == ["DB2:7:c", "db2:7:d"]
    assert spread.list_locks(owner_contains="%", limit=100).items == []
    assert len(spread.list_locks(owner_contains="web1", limit=100).items) == 4


def test_a_bad_sort_or_cursor_is_a_named_error(spread):
    with pytest.raises(InvalidInput) as error:
        spread.list_locks(sort="fence")
    assert error.value.errors[0][0] == "sort"
    # A cursor of the resource order has no expiry to continue from.
    cursor = spread.list_locks(limit=2).next_cursor
    with pytest.raises(InvalidInput) as error:
        spread.list_locks(limit=2, sort="expires", cursor=cursor)
    assert error.value.errors[0][0] == "cursor"


def test_owner_counts_put_the_owners_with_stale_locks_first(spread):
    counts = spread.owner_counts()
    assert counts[0].name == "batch"
    assert (counts[0].held, counts[0].expiring, counts[0].stale) == (1, 0, 2)
    by_name = {c.name: c for c in counts}
    assert by_name["web1:1:a"].total == 2


def test_sort_headers_link_both_ways_and_mark_the_order(operator, spread):
    page = soup(operator.get("/?state=stale&sort=expires"))
    header = page.select_one("th[aria-sort]")
    assert header["aria-sort"] == "ascending"
    assert "Stale since" in header.get_text()
    assert "sort=-remaining" in header.a["href"]
    remaining = [
        row.select_one("td.remaining").get_text(strip=True)
        for row in page.select("#live tbody tr")
    ]
    # The state column says "stale"; the time says when, not the state again.
    assert all(text.startswith("ran out") for text in remaining)
    assert remaining[0] == "ran out 7 s ago"  # job acquired at t=1 for 5 s, now t=13
    for row in page.select("#live tbody tr"):
        assert row.get_text(" ", strip=True).count("stale") == 1
    times = page.select("#live tbody td.remaining time")
    assert all(t["title"].startswith("expired 20") for t in times)


def test_grouped_by_host_counts_each_hosts_locks(operator, spread):
    page = soup(operator.get("/?group=host"))
    rows = {
        row.select_one("td.owner").get_text(strip=True): [
            int(td.get_text()) for td in row.select("td.number")
        ]
        for row in page.select("#groups-table tbody tr")
    }
    # web1 has owners web1:1:a (2 locks), web1:2:b, x@web1.
    assert rows["web1"][3] == 4
    assert rows["batch"] == [1, 0, 2, 3]
    assert list(rows)[0] == "batch"  # most stale first
    link = page.select_one("#groups-table a[title=web1]")["href"]
    assert "owner=web1" in link
    assert "group" not in link


def test_a_grouped_view_shows_one_page_of_groups_and_reads_no_lock_list(
    operator, service
):
    # 27 owners: two pages of 25 groups, most locks first among equals.
    for n in range(27):
        for m in range(n + 1):
            service.acquire(f"job:{n}-{m}", f"worker-{n:02d}", ttl=60)
    statements: list[str] = []

    def record(conn, cursor, statement, *args):
        statements.append(statement)

    def listings(url):
        statements.clear()
        event.listen(Engine, "before_cursor_execute", record)
        try:
            page = soup(operator.get(url))
        finally:
            event.remove(Engine, "before_cursor_execute", record)
        # The lock list's page query, known by its sort keys (the groups' last
        # seen probes each grant's latest event with ORDER BY ... LIMIT 1 too).
        return page, [s for s in statements if "sort_0" in s]

    assert listings("/")[1]  # the lock list's page of rows
    first, read = listings("/?group=owner")
    names = [a["title"] for a in first.select("#groups-table tbody td.owner a")]
    assert names == [f"worker-{n:02d}" for n in range(26, 1, -1)]
    # The lock list is neither shown nor read.
    assert first.select_one("#locks-table") is None
    assert read == []
    pager = first.select_one("nav.page-numbers")
    assert pager["aria-label"] == "Pages of groups"
    second_url = pager.select_one("a[rel=next]")["href"]
    assert "group=owner" in second_url
    assert "page=2" in second_url
    second = soup(operator.get(second_url))
    names = [a["title"] for a in second.select("#groups-table tbody td.owner a")]
    assert names == ["worker-01", "worker-00"]
    # Counts stay those of every lock, not of the page's groups.
    assert second.select_one("#count-held .count").get_text() == str(27 * 28 // 2)


def test_owner_search_on_the_page_is_a_substring(operator, spread):
    page = soup(operator.get("/?owner=db2"))
    owners = sorted(td.get_text(strip=True) for td in page.select("#live td.owner"))
    assert owners == ["DB2:7:c", "db2:7:d"]
    assert "owner contains" in page.select_one("#live caption").get_text()


def test_sort_names_match_the_column_labels(operator, service):
    service.acquire("job:late", "w", ttl=600)
    service.acquire("job:soon", "w", ttl=60)
    for sort, first in (("remaining", "job:soon"), ("-remaining", "job:late")):
        response = operator.get(f"/?sort={sort}")
        assert response.status_code == 200
        rows = soup(response).select("#locks-table tbody tr td.resource")
        assert rows[0].get_text(strip=True) == first


@pytest.fixture
def numbered(service, clock):
    """Names whose numbers a lexical order puts out of place, two of them
    waited for (one by three waiters), one run out."""
    names = ["job:20001", "job:4100", "job:9", "job:", "job:0100", "jobs", "a7b"]
    names += ["job:4100x", "job:41", "host12:job3", "host2:job30"]
    for n, name in enumerate(names):
        service.acquire(name, "w", ttl=100 + n)
    service.acquire("job:short", "w", ttl=2)
    clock.advance(3)  # job:short is stale now
    for _ in range(3):
        service.queue.join("job:9", "other", None, 60, mode="exclusive", limit=1)
    service.queue.join("jobs", "other", None, 60, mode="exclusive", limit=1)
    return service


def test_natural_order_puts_numbers_in_numeric_order_on_every_page(numbered):
    paged = [lock.resource for lock in all_pages(numbered, sort="natural")]
    assert paged == [
        "a7b",
        "host12:job3",
        "host2:job30",
        "job:",
        "job:9",
        "job:41",
        "job:0100",
        "job:4100",
        "job:20001",
        "job:4100x",
        "job:short",
        "jobs",
    ]
    backwards = [lock.resource for lock in all_pages(numbered, sort="-natural")]
    assert backwards == paged[::-1]


def test_the_natural_order_is_read_from_its_index_not_sorted(numbered, backend):
    """By name reads the exclusive grants in the order of
    ``ix_distributed_locks_natural`` (migration 0023), only as far as the page,
    instead of sorting every lock (280-650 ms at 100,000 locks): the listing's
    SQL and the index's expressions must stay the same for a planner to use it.
    MariaDB has no index on expressions: it has no such index, and sorts."""
    statements = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        numbered.list_locks(limit=2, sort="natural")
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    [(statement, parameters)] = [s for s in statements if "chosen" in s[0]]
    with db.engine.connect() as conn:
        if backend == "mariadb":
            indexes = inspect(conn).get_indexes("distributed_locks")
            assert "ix_distributed_locks_natural" not in {i["name"] for i in indexes}
            return
        raw = conn.connection.cursor()
        if backend == "postgresql":
            # A handful of rows: without this a sort is cheaper than any index.
            raw.execute("SET enable_sort = off")
            raw.execute("EXPLAIN " + statement, parameters)
        else:
            raw.execute("EXPLAIN QUERY PLAN " + statement, parameters)
        plan = "\n".join(str(line) for line in raw.fetchall())
    assert "ix_distributed_locks_natural" in plan, plan
    # In the index's whole order, not sorted again after its first column
    # (an incremental sort presorted by the head alone).
    assert "RIGHT PART OF ORDER BY" not in plan, plan
    presorted = [line for line in plan.splitlines() if "Presorted Key" in line]
    assert all("length(" in line for line in presorted), plan


def test_by_prefix_reads_its_groups_from_the_prefix_index_on_sqlite(numbered, backend):
    """By prefix under no prefix reads the held locks' groups in the order of
    ``ix_distributed_locks_prefix_expires_at`` (migration 0027) on SQLite,
    which has no hash aggregate and sorted every lock's prefix instead (70 ->
    33 ms at 100,000 locks): ``listing.next_prefix`` and the index's expression
    must stay the same for its planner to use it. PostgreSQL hashes the groups
    and MariaDB has no index on expressions: neither has the index."""
    statements = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        groups, _, _ = numbered.grouped_with_counts("prefix")
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    assert {group.name for group in groups} >= {"job:"}
    [(statement, parameters)] = [s for s in statements if "GROUP BY" in s[0]]
    with db.engine.connect() as conn:
        if backend != "sqlite":
            indexes = inspect(conn).get_indexes("distributed_locks")
            assert "ix_distributed_locks_prefix_expires_at" not in {
                index["name"] for index in indexes
            }
            return
        raw = conn.connection.cursor()
        raw.execute("EXPLAIN QUERY PLAN " + statement, parameters)
        plan = [row[-1] for row in raw.fetchall()]
    exclusive_part = next(line for line in plan if "distributed_locks" in line)
    assert exclusive_part == (
        "SCAN distributed_locks USING INDEX ix_distributed_locks_prefix_expires_at"
    ), plan


def test_urgent_order_puts_contended_then_least_time_left_then_stale(numbered):
    paged = [lock.resource for lock in all_pages(numbered, sort="urgent")]
    assert paged[:2] == ["job:9", "jobs"]  # waited for, by expiry
    assert paged[2:5] == ["job:20001", "job:4100", "job:"]  # least time left
    assert paged[-1] == "job:short"  # stale, last
    assert len(paged) == len(set(paged)) == 12
    backwards = [lock.resource for lock in all_pages(numbered, sort="-urgent")]
    assert backwards == paged[::-1]


def test_sort_by_waiters_and_the_contended_filter(numbered):
    most = all_pages(numbered, sort="-waiters")
    assert [(lock.resource, lock.waiters) for lock in most[:2]] == [
        ("job:9", 3),
        ("jobs", 1),
    ]
    assert len(most) == 12
    fewest = all_pages(numbered, sort="waiters")
    assert [lock.resource for lock in fewest] == [
        lock.resource for lock in reversed(most)
    ]
    contended = all_pages(numbered, contended=True, sort="natural")
    assert [lock.resource for lock in contended] == ["job:9", "jobs"]
    assert numbered.count_locks(contended=True) == 2
    assert numbered.count_locks(contended=True, prefix="jobs") == 1
    assert numbered.count_locks(state="stale") == 1
    assert numbered.count_locks(owner_contains="W") == 12


def test_counts_and_contended_are_the_counts_and_the_contended_count(numbered):
    """The overview's counters in one statement: the numbers of the two reads it
    replaced, a semaphore's holders (one entry) and their waiter among them."""
    numbered.acquire("sem:1", "w", limit=2, ttl=100)
    numbered.acquire("sem:1", "v", limit=2, ttl=100)
    numbered.queue.join("sem:1", "other", None, 60, mode="exclusive", limit=1)
    for filters in ({}, {"prefix": "job"}, {"prefix": "sem"}, {"owner_contains": "V"}):
        counts, contended = numbered.counts_and_contended(**filters)
        assert counts == numbered.counts(**filters), filters
        assert contended == numbered.count_locks(contended=True, **filters), filters
    assert numbered.counts_and_contended()[1] == 3
    assert numbered.counts_and_contended(owner_contains="V") == (
        {LockState.HELD: 1, LockState.EXPIRING: 0, LockState.STALE: 0},
        1,
    )


def test_a_grouped_views_counts_come_with_its_groups_as_read_apart(numbered, clock):
    """One statement for a grouped page: the groups of ``owner_counts`` and
    ``prefix_counts`` and the counts of ``counts_and_contended``, exclusive
    grants, a released one, a semaphore's holders (one resource, a grant per
    owner) and shared grants, waiters, every state, under each search."""
    numbered.acquire("sem:1", "w", limit=3, ttl=100)
    numbered.acquire("sem:1", "v", limit=3, ttl=5)
    numbered.queue.join("sem:1", "other", None, 60, mode="exclusive", limit=1)
    numbered.acquire("rw:cfg", "v", mode="shared", ttl=100)
    numbered.acquire("rw:cfg", "x:1:a", mode="shared", ttl=100)
    numbered.acquire("job:gone", "v", ttl=100)
    numbered.release("job:gone", "v")
    numbered.acquire("job:soon", "v", ttl=14)
    clock.advance(8)  # job:soon expiring, v's holder of sem:1 gone
    at = numbered.now()
    searches = ({}, {"prefix": "job"}, {"prefix": "job:"}, {"owner_contains": "V"})
    for filters in searches:
        counts = numbered.counts_and_contended(**filters, at=at)
        assert counts[0][LockState.EXPIRING] or filters, "an expiring lock counted"
        for group, apart in (
            ("owner", numbered.owner_counts(**filters, at=at)),
            ("prefix", numbered.prefix_counts(**filters, at=at)),
        ):
            together = numbered.grouped_with_counts(group, **filters, at=at)
            assert together == (apart, *counts), (group, filters)
    assert numbered.grouped_with_counts("owner", at=at)[2] == 3


def test_numbered_pages_read_the_same_order_by_offset(numbered):
    whole = [lock.resource for lock in all_pages(numbered, sort="urgent")]
    pages = [
        numbered.list_locks(sort="urgent", limit=5, offset=offset).items
        for offset in (0, 5, 10)
    ]
    assert [lock.resource for page in pages for lock in page] == whole
    assert numbered.list_locks(offset=5, limit=5).next_cursor is None
    with pytest.raises(InvalidInput) as error:
        numbered.list_locks(offset=-1)
    assert error.value.errors[0][0] == "offset"


@pytest.mark.parametrize("sort", ["urgent", "-urgent"])
@pytest.mark.parametrize("state", [None, "stale", "held"])
def test_every_offset_reads_its_slice_of_the_urgent_order(numbered, state, sort):
    """A page whose live locks fill it reads no stale one (``_stale_fetch``):
    every slice, at each side of the live/stale boundary, is still the same
    slice of the whole order, a semaphore's holders among the live."""
    numbered.acquire("sem:1", "v", limit=2, ttl=50)
    numbered.acquire("sem:1", "u", limit=2, ttl=60)
    whole = [
        (lock.resource, lock.fence)
        for lock in numbered.list_locks(
            sort=sort, state=state, limit=100, offset=0, entries=ENTRIES_RESOURCES
        ).items
    ]
    assert len(whole) == numbered.count_locks(state=state) > 0
    for limit in (1, 2, 5):
        for offset in range(len(whole) + 1):
            page = numbered.list_locks(
                sort=sort,
                state=state,
                limit=limit,
                offset=offset,
                entries=ENTRIES_RESOURCES,
            )
            shown = [(lock.resource, lock.fence) for lock in page.items]
            assert shown == whole[offset : offset + limit], (limit, offset)


@pytest.mark.parametrize("sort", ["urgent", "waiters", "natural"])
def test_a_forged_cursor_of_a_new_order_is_a_named_error(numbered, sort):
    from lockkeeper_core.pagination import encode_cursor

    for position in (
        {"resource": "job:1", "key": [7, "2026-01-01T00:00:00+00:00"], "at": "x"},
        {"resource": "job:1", "key": True},
        {"resource": 5},
        {"resource": "job:1", "key": [True, "2026-01-01T00:00:00"], "at": 1},
    ):
        if sort == "natural" and position["resource"] == "job:1":
            continue
        with pytest.raises(InvalidInput) as error:
            numbered.list_locks(sort=sort, cursor=encode_cursor(position))
        assert error.value.errors[0][0] == "cursor"


def shown(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [
        td.get_text(strip=True)
        for td in soup(response).select("#locks-table tbody td.resource")
    ]


def test_the_overview_shows_the_urgent_first_by_default(operator, numbered):
    page = soup(operator.get("/"))
    names = [td.get_text(strip=True) for td in page.select("#live td.resource")]
    assert names[:3] == ["job:9", "jobs", "job:20001"]
    assert names[-1] == "job:short"
    assert page.select_one("#order-urgent")["aria-current"] == "true"
    assert page.select_one("#tab-contended .tab-count").get_text() == "(2)"


def test_the_resource_column_sorts_names_naturally(operator, numbered):
    names = shown(operator.get("/?sort=resource"))
    assert names.index("job:4100") < names.index("job:20001")
    header = soup(operator.get("/?sort=resource")).select_one("th[aria-sort]")
    assert header.a["id"] == "sort-resource"
    assert "sort=-resource" in header.a["href"]
    assert shown(operator.get("/?sort=-resource")) == names[::-1]


def test_most_waiting_and_the_contended_tab(operator, numbered):
    assert shown(operator.get("/?sort=-waiting"))[:2] == ["job:9", "jobs"]
    page = soup(operator.get("/?state=contended&prefix=job"))
    names = [td.get_text(strip=True) for td in page.select("#live td.resource")]
    assert names == ["job:9", "jobs"]
    assert page.select_one("#tab-contended")["aria-current"] == "page"
    release = page.select_one("a[href*='release-many']")
    assert release.get_text(strip=True) == "Release the 2 matching…"
    dialog = soup(operator.get(release["href"]))
    assert len(dialog.select("input[name=lock]")) == 2


def test_numbered_pages_with_a_page_size(operator, service):
    for n in range(60):
        service.acquire(f"job:{n}", "w", ttl=100)
    page = soup(operator.get("/?sort=resource&page=2"))
    names = [td.get_text(strip=True) for td in page.select("#live td.resource")]
    assert names[0] == "job:25"
    links = {a.get_text(): a["href"] for a in page.select(".page-links a")}
    assert set(links) == {"« Previous", "1", "2", "3", "Next »"}
    assert links["3"] == "/?sort=resource&page=3"
    sizes = {a.get_text(): a["href"] for a in page.select(".page-sizes a")}
    assert sizes["50"] == "/?sort=resource&size=50"
    bigger = soup(operator.get(sizes["50"]))
    assert len(bigger.select("#live td.resource")) == 50
    assert bigger.select_one(".page-links a[aria-current]").get_text() == "1"


@pytest.mark.parametrize("query", ["page=0", "page=x", "size=7", "sort=fence"])
def test_a_bad_page_or_size_is_a_400_with_the_reason(operator, numbered, query):
    response = operator.get(f"/?{query}")
    assert response.status_code == 400
    assert soup(response).select_one(".field-error")


@pytest.mark.parametrize("search", ["web", "WEB1", "été", "_", "b:"])
def test_the_stale_release_matches_owners_as_the_search_shows_them(
    operator, service, clock, search
):
    from tests.dashboard_helpers import post

    owners = ["web1:1:a", "WEB2:1:b", "xweb", "db:1", "ÉTÉ:1", "a_b:1", "a%b:2"]
    for n, owner in enumerate(owners):
        service.acquire(f"job:{n}", owner, ttl=1)
    service.acquire("job:held", "web1:9:z", ttl=600)
    clock.advance(2)
    page = soup(operator.get(f"/?state=stale&owner={search}"))
    rows = [td.get_text(strip=True) for td in page.select("#live td.owner")]
    counted = int(page.select_one("#count-stale .count").get_text())
    tab = page.select_one("#tab-stale .tab-count").get_text()
    link = page.find("a", string="Release all stale…")
    assert counted == len(rows)
    assert tab == f"({len(rows)})"
    if not rows:
        assert link is None
        return
    dialog = soup(operator.get(link["href"])).get_text(" ", strip=True)
    s = "" if len(rows) == 1 else "s"
    assert f"Force release {len(rows)} stale lock{s}?" in dialog
    response = post(
        operator, "/stale/release", {"owner": search, "reason": "dead host"}, htmx=True
    )
    assert f"Force-released {len(rows)} stale lock(s)." in soup(response).get_text()
    left = {lock.owner for lock in service.list_locks(limit=100).items}
    assert left == ({*owners, "web1:9:z"} - set(rows))


def test_prefix_counts_group_by_the_next_prefix_exactly(service, clock):
    names = ["job:1", "job:2", "job:eu:7", "job:eu:8", "job:us:1", "report:x"]
    names += ["nightly", "a_b:1"]
    for name in names:
        service.acquire(name, "web1:1:a", ttl=1 if name == "report:x" else 600)
    clock.advance(2)
    top = {g.name: (g.held, g.stale) for g in service.prefix_counts()}
    assert top == {"job:": (5, 0), "report:": (0, 1), "a_b:": (1, 0), "": (1, 0)}
    assert service.prefix_counts()[0].name == "report:"  # most stale first
    under = {g.name: g.total for g in service.prefix_counts(prefix="job:")}
    assert under == {"job:eu:": 2, "job:us:": 1, "": 2}
    # Each named group is exactly what its prefix search lists.
    for group in service.prefix_counts(prefix="job:"):
        if group.name:
            listed = service.list_locks(prefix=group.name, limit=100).items
            assert len(listed) == group.total
    assert service.prefix_counts(owner_contains="WEB2") == []


def test_by_prefix_view_links_each_prefix_and_releases_exactly_its_locks(
    operator, service, clock
):
    for name in ["job:1", "job:2", "job:eu:7", "report:x", "nightly"]:
        service.acquire(name, "web1:1:a", ttl=600)
    service.acquire("job:3", "db2:1:b", ttl=600)
    page = soup(operator.get("/?group=prefix"))
    assert page.select_one("#view-prefix")["aria-current"] == "page"
    rows = {
        row.select_one("td.owner").get_text(" ", strip=True): row
        for row in page.select("#groups-table tbody tr")
    }
    assert list(rows) == ["job:", "report:", "no “:” after the start"]
    assert rows["job:"].select("td.number")[-1].get_text() == "4"
    link = rows["job:"].select_one("td.owner a")["href"]
    assert "prefix=job" in link
    assert "group" not in link
    assert rows["no “:” after the start"].select_one("a") is None
    # Searched, a prefix drills down a level; an owner search narrows the counts
    # and the release alike.
    under = soup(operator.get("/?group=prefix&prefix=job:&owner=WEB1"))
    names = [td.get_text(strip=True) for td in under.select("#groups-table td.owner")]
    assert names == ["no “:” after “job:”", "job:eu:"]  # most locks first
    release = soup(operator.get("/?group=prefix&owner=web1")).select_one(
        "#groups-table a[href*='release-many']"
    )
    assert release.get_text(strip=True).startswith("Release its 3 locks")
    dialog = soup(operator.get(release["href"]))
    assert sorted(
        box["value"].split(":", 1)[1] for box in dialog.select("input[name=lock]")
    ) == ["job:1", "job:2", "job:eu:7"]


@pytest.mark.parametrize(
    "query", ["page=²", "size=①", "page=99999999999999999999", "page=%EF%BC%91"]
)
def test_digits_that_are_not_ascii_are_a_400_not_a_500(operator, numbered, query):
    assert operator.get(f"/?{query}").status_code == 400


def test_a_selected_lock_with_a_superscript_fence_is_a_400(operator, numbered):
    assert operator.get("/release-many?lock=²:job:9").status_code == 400


def test_by_host_says_when_each_host_was_last_seen(operator, service, clock):
    """A host's last seen is its owners' latest acquire, renewal or session
    heartbeat: a dead host is the one not seen for a while, whatever its
    locks' ttls."""
    start = service.now()
    for n in range(2):
        service.acquire(f"dead:{n}", f"dead-1:{n}:a", ttl=10)
    service.acquire("live:1", "live-1:1:a", ttl=60)
    beating = service.sessions.create("beat-1:1:a", 60, token="worker")
    assert service.acquire(
        "beat:1", "beat-1:1:a", session=beating.id, token="worker"
    ).acquired
    clock.advance(55)
    service.renew("live:1", "live-1:1:a", ttl=30)
    clock.advance(3)
    service.sessions.heartbeat(beating.id, token="worker")
    clock.advance(2)
    seen = service.last_seen(["dead-1:0:a", "dead-1:1:a", "live-1:1:a", "beat-1:1:a"])
    assert {owner: (at - start).total_seconds() for owner, at in seen.items()} == {
        "dead-1:0:a": 0,
        "dead-1:1:a": 0,
        "live-1:1:a": 55,
        "beat-1:1:a": 58,
    }
    assert service.last_seen(["nobody"]) == {}

    page = soup(operator.get("/?group=host"))
    ages = {
        row.select_one("td.owner").get_text(strip=True): row.select_one(
            "td.last-seen time"
        )["data-age"]
        for row in page.select("#groups-table tbody tr")
    }
    assert ages == {"dead-1": "60.000", "live-1": "5.000", "beat-1": "2.000"}
    assert "Last seen" in page.select_one("#groups-table thead").get_text()
    by_prefix = soup(operator.get("/?group=prefix"))
    assert by_prefix.select_one("#groups-table td.last-seen") is None
