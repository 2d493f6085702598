"""Finding what needs attention: sorting, owner search, grouping (service and pages)."""

from __future__ import annotations

import pytest

from app.locks.errors import InvalidInput
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
    assert "sort=-expires" in header.a["href"]
    remaining = [
        row.select_one("td.remaining").get_text(strip=True)
        for row in page.select("#live tbody tr")
    ]
    assert all(text.startswith("stale for") for text in remaining)
    assert remaining[0] == "stale for 7 s"  # job acquired at t=1 for 5 s, now t=13
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
        service.queue.join("job:9", "other", None, 60)
    service.queue.join("jobs", "other", None, 60)
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


def test_urgent_order_puts_contended_then_least_time_left_then_stale(numbered):
    paged = [lock.resource for lock in all_pages(numbered, sort="urgent")]
    assert paged[:2] == ["job:9", "jobs"]  # waited for, by expiry
    assert paged[2:5] == ["job:20001", "job:4100", "job:"]  # least time left
    assert paged[-1] == "job:short"  # stale, last
    assert len(paged) == len(set(paged)) == 12


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


@pytest.mark.parametrize("sort", ["urgent", "waiters", "natural"])
def test_a_forged_cursor_of_a_new_order_is_a_named_error(numbered, sort):
    from app.locks.pagination import encode_cursor

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
