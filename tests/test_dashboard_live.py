"""What polling costs and what it keeps: 204 for an unchanged page, compression,
cached static files, and the way back to login when a session ends."""

from __future__ import annotations

import csv
import gzip
import io
import re

import brotli
import pytest

from app.dashboard.assets import UNVERSIONED_MAX_AGE, YEAR
from tests.dashboard_helpers import HTMX, csrf_token, poller_version, soup


def shown_version(page) -> str:
    return poller_version(page.select_one(".poller"))


def poll(client, url: str, target: str, version: str):
    return client.get(
        url,
        headers={**HTMX, "HX-Target": f"div#{target}", "Lockkeeper-Shown": version},
    )


def test_unchanged_overview_poll_is_204_and_a_change_is_a_new_fragment(
    operator, service, clock
):
    service.acquire("job:1", "w-1", ttl=60)
    page = soup(operator.get("/"))
    version = shown_version(page)
    poll_url = page.select_one(".poller")["hx-get"]

    unchanged = poll(operator, poll_url, "live", version)
    assert unchanged.status_code == 204
    assert unchanged.get_data() == b""
    assert unchanged.headers["Cache-Control"] == "no-store"
    assert "HX-Request" in unchanged.vary
    # Nothing a page's headers would say about a body it has not got: every
    # open overview gets this every 5 s (504 bytes of headers, now 294).
    assert "Content-Type" not in unchanged.headers
    assert "Content-Security-Policy" not in unchanged.headers

    clock.advance(5)  # time passes, nothing changes state
    assert poll(operator, poll_url, "live", version).status_code == 204

    service.acquire("job:2", "w-2", ttl=60)
    changed = poll(operator, poll_url, "live", version)
    assert changed.status_code == 200
    fragment = soup(changed)
    assert fragment.body is None
    assert shown_version(fragment) != version
    assert {
        row.select_one("td.resource").get_text(strip=True)
        for row in fragment.select("#live tbody tr")
    } == {"job:1", "job:2"}


def test_a_renewal_moves_the_rows_time_left_without_the_table(operator, service, clock):
    """The fleet renewing changes the newest event on every poll; with the
    same rows in the same order and states, a poll gets each row's time left
    (swapped in its row) and the poller's new version, not the table again. A
    change elsewhere (a lock not on the page renewed) gets the poller alone."""
    for n in range(25):
        service.acquire(f"job:{n:02d}", f"w-{n}", ttl=600)
    service.acquire("zz:later", "w-z", ttl=3600)  # not on page 1 (urgent first)
    page = soup(operator.get("/"))
    version = shown_version(page)
    poll_url = page.select_one(".poller")["hx-get"]
    rows = page.select("#locks-table tbody tr[id]")
    assert len(rows) == 25
    first = rows[0]
    assert first.select_one("td.resource").get_text(strip=True) == "job:00"

    clock.advance(5)
    service.renew("job:00", "w-0", ttl=600)  # ends last of the page now
    service.renew("job:01", "w-1", ttl=30)  # ends first: the order moves
    table = poll(operator, poll_url, "live", version)
    assert table.status_code == 200
    assert soup(table).select_one("#locks-table") is not None

    version = shown_version(soup(table))
    clock.advance(5)
    service.renew("job:01", "w-1", ttl=30)  # same place in the order
    moved = poll(operator, poll_url, "live", version)
    assert moved.status_code == 200
    fragment = soup(moved)
    assert fragment.select("table, tr, #live") == []
    left = {el["hx-swap-oob"]: el for el in fragment.select("span.ttl[hx-swap-oob]")}
    job_01 = soup(operator.get("/")).select("#locks-table tbody tr[id]")[0]
    assert job_01.select_one("td.resource").get_text(strip=True) == "job:01"
    assert len(left) == 25
    swapped = f"outerHTML:#{job_01['id']} td.remaining .ttl"
    assert left[swapped]["data-ttl"] == "30.000"
    poller = fragment.select_one(".poller[hx-swap-oob]")
    assert poller["id"] == "live-poller"
    assert poller["hx-get"] == poll_url
    new_version = poller_version(poller)
    assert new_version != version
    assert len(moved.get_data()) * 3 < len(table.get_data())
    assert poll(operator, poll_url, "live", new_version).status_code == 204

    clock.advance(5)
    service.renew("zz:later", "w-z", ttl=3600)  # an event, nothing shown moves
    elsewhere = poll(operator, poll_url, "live", new_version)
    assert elsewhere.status_code == 200
    fragment = soup(elsewhere)
    assert fragment.select("[hx-swap-oob]") == fragment.select(".poller")
    new_version = poller_version(fragment.select_one(".poller"))
    assert poll(operator, poll_url, "live", new_version).status_code == 204


def test_a_lock_that_crosses_into_expiring_or_stale_changes_the_version(
    operator, service, clock
):
    service.acquire("job:1", "w-1", ttl=60)
    version = shown_version(soup(operator.get("/")))
    clock.advance(50)  # held -> expiring, without any event
    changed = poll(operator, "/?live=1", "live", version)
    assert changed.status_code == 200
    assert soup(changed).select_one("#live tbody .badge").get_text() == "expiring"


def test_a_poll_of_another_view_never_gets_204_for_this_ones_version(operator, service):
    service.acquire("job:1", "w-1", ttl=60)
    version = shown_version(soup(operator.get("/")))
    assert poll(operator, "/?state=stale&live=1", "live", version).status_code == 200


def test_unchanged_lock_page_poll_is_204_until_the_lock_changes(
    operator, service, clock
):
    service.acquire("job:1", "w-1", ttl=60)
    page = soup(operator.get("/locks/job:1"))
    version = shown_version(page)
    poll_url = page.select_one(".poller")["hx-get"]
    assert poll(operator, poll_url, "lock-live", version).status_code == 204

    service.renew("job:1", "w-1", ttl=120)
    changed = poll(operator, poll_url, "lock-live", version)
    assert changed.status_code == 200
    actions = [
        row.select_one("td.action").get_text()
        for row in soup(changed).select("#history tbody tr")
    ]
    assert actions[0].startswith("acquired · renewed 1×")

    version = shown_version(soup(changed))
    clock.advance(121)  # runs out: stale, no event
    stale = poll(operator, poll_url, "lock-live", version)
    assert stale.status_code == 200
    assert soup(stale).select_one("#lock-state .badge").get_text() == "stale"
    assert "stale for" in soup(stale).select_one("#lock-remaining").get_text()


def test_pages_are_compressed_and_vary_keeps_hx_request(operator, service):
    for n in range(30):
        service.acquire(f"job:{n}", f"worker-{n}", ttl=60)
    plain = operator.get("/", headers={"Accept-Encoding": "identity"})
    squeezed = operator.get("/", headers={"Accept-Encoding": "gzip"})
    assert squeezed.headers["Content-Encoding"] == "gzip"
    body = gzip.decompress(squeezed.get_data())
    # The pages differ only in their CSRF token's signature timestamp, if at all.
    assert len(body) == pytest.approx(len(plain.get_data()), abs=64)
    assert len(squeezed.get_data()) * 4 < len(plain.get_data())
    vary = {v.strip().lower() for v in squeezed.headers["Vary"].split(",")}
    assert {"hx-request", "accept-encoding"} <= vary

    fragment = operator.get(
        "/", headers={**HTMX, "HX-Target": "div#live", "Accept-Encoding": "br"}
    )
    assert fragment.headers["Content-Encoding"] == "br"
    assert b'id="live"' in brotli.decompress(fragment.get_data())


def test_exports_still_stream_when_compressed(operator, service):
    for n in range(50):
        service.acquire(f"job:{n}", "w", ttl=60)
    response = operator.get(
        "/audit/export.csv", headers={"Accept-Encoding": "br"}, buffered=False
    )
    assert response.is_streamed
    assert response.headers["Content-Encoding"] == "br"
    assert "Content-Length" not in response.headers
    data = b"".join(response.response)
    response.close()
    rows = list(csv.DictReader(io.StringIO(brotli.decompress(data).decode())))
    assert len(rows) == 50


def test_static_files_have_versioned_urls_and_long_lifetimes(operator, fake_app):
    page = soup(operator.get("/"))
    css = page.select_one("link[rel=stylesheet]")["href"]
    assert re.fullmatch(r"/static/app\.css\?v=[0-9a-f]{12}", css)
    versioned = operator.get(css)
    assert versioned.status_code == 200
    cache = versioned.cache_control
    assert cache.max_age == YEAR
    assert cache.immutable
    versioned.close()
    stale = operator.get("/static/app.css?v=000000000000")
    assert stale.cache_control.max_age == UNVERSIONED_MAX_AGE
    assert not stale.cache_control.immutable
    stale.close()
    for script in page.find_all("script"):
        assert "?v=" in script["src"]


def test_a_poll_after_the_session_ended_goes_to_login_with_a_message(operator):
    token = csrf_token(operator, "/")
    operator.post("/logout", data={"csrf_token": token})
    response = operator.get(
        "/?live=1",
        headers={
            **HTMX,
            "HX-Target": "div#live",
            "HX-Current-URL": "http://localhost/?state=stale",
        },
    )
    assert response.status_code == 401
    assert response.headers["HX-Redirect"].startswith("/login")
    login = operator.get(response.headers["HX-Redirect"])
    assert "Your session has ended" in login.get_data(as_text=True)


def test_an_action_posted_after_the_session_ended_goes_to_login(operator, service):
    service.acquire("job:1", "w", ttl=60)
    token = csrf_token(operator, "/")
    operator.post("/logout", data={"csrf_token": token})
    # The old page's token no longer matches any session.
    response = operator.post(
        "/locks/job:1/release",
        data={"csrf_token": token, "reason": "stuck"},
        headers={**HTMX, "HX-Target": "div#action-panel"},
    )
    assert response.status_code == 401
    assert response.headers["HX-Redirect"].startswith("/login")
    plain = operator.post(
        "/locks/job:1/release", data={"csrf_token": token, "reason": "stuck"}
    )
    assert plain.status_code == 302
    assert "/login" in plain.headers["Location"]


def wire_bytes(response) -> int:
    """What the response costs on the wire: status line, headers, body."""
    head = len(f"HTTP/1.1 {response.status}\r\n")
    head += sum(len(f"{name}: {value}\r\n") for name, value in response.headers)
    return head + 2 + len(response.get_data())


def test_an_idle_overview_costs_ten_times_fewer_bytes_a_minute(
    operator, service, clock
):
    """Twelve polls (a minute at 5 s) of an overview of 150 locks where nothing
    changes: before, each poll got the whole fragment uncompressed; now each
    gets a 204. Printed for the record (pytest -s)."""
    for n in range(150):
        service.acquire(f"job:{n:03d}", f"host-{n % 7}:{1000 + n}:abcdef", ttl=3600)
    page = soup(operator.get("/"))
    poll_url = page.select_one(".poller")["hx-get"]
    version = shown_version(page)
    poll = {**HTMX, "HX-Target": "div#live", "HX-Current-URL": "http://localhost/"}
    browser_encodings = {"Accept-Encoding": "gzip, deflate, br, zstd"}

    before = after = changing = 0
    for _ in range(12):
        clock.advance(5)
        old = operator.get(poll_url, headers={**poll, "Accept-Encoding": "identity"})
        assert old.status_code == 200
        before += wire_bytes(old)
        new = operator.get(
            poll_url,
            headers={**poll, **browser_encodings, "Lockkeeper-Shown": version},
        )
        assert new.status_code == 204
        after += wire_bytes(new)
        # The worst case: something changed before every poll (compressed).
        busy = operator.get(
            poll_url, headers={**poll, **browser_encodings, "Lockkeeper-Shown": "x"}
        )
        changing += wire_bytes(busy)
    print(
        f"\nidle overview, 150 locks, 12 polls: before {before} B/min, "
        f"after {after} B/min ({before / after:.0f}x less); "
        f"changing every poll, compressed: {changing} B/min "
        f"({before / changing:.1f}x less)"
    )
    assert before >= 10 * after
    assert before >= 4 * changing


def test_a_search_counts_what_it_shows_and_a_quiet_search_polls_204(
    operator, service, clock
):
    for n in range(3):
        service.acquire(f"batch:{n}", "batch-07:1:aa", ttl=600)
    for n in range(5):
        service.acquire(f"job:{n}", "web-1:2:bb", ttl=5)
    clock.advance(10)  # the job: locks go stale
    page = soup(operator.get("/?prefix=batch:"))
    shown_rows = page.select("#locks-table tbody tr[id]")
    assert len(shown_rows) == 3
    counts = {
        s: int(page.select_one(f"#count-{s} .count").get_text())
        for s in ("held", "expiring", "stale")
    }
    assert counts == {"held": 3, "expiring": 0, "stale": 0}
    assert page.select_one("#tab-all .tab-count").get_text() == "(3)"
    assert "of 8 locks in all" in page.select_one("#counts-scope").get_text()

    version = shown_version(page)
    poll_url = page.select_one(".poller")["hx-get"]
    # Elsewhere things change: a release, a new grant, a lock going stale.
    service.force_release("job:0", actor="olga", reason="gone")
    service.acquire("job:9", "web-1:3:cc", ttl=1)
    clock.advance(2)
    assert poll(operator, poll_url, "live", version).status_code == 204
    service.release("batch:1", "batch-07:1:aa")
    changed = poll(operator, poll_url, "live", version)
    assert changed.status_code == 200
    assert soup(changed).select_one("#count-held .count").get_text() == "2"


# -- the audit's live tail ----------------------------------------------------


def test_audit_page_one_tails_new_events_with_204_while_unchanged(operator, service):
    service.acquire("job:1", "w", ttl=100)
    page = soup(operator.get("/audit"))
    poller = page.select_one("#audit-results .poller")
    assert poller is not None, "page 1 with no end of range polls"
    assert poller["hx-sync"] == "this:drop"
    assert not poller.has_attr("hx-push-url")
    assert poller["hx-target"] == "#audit-results"
    version = poller_version(poller)
    url = poller["hx-get"]

    assert poll(operator, url, "audit-results", version).status_code == 204

    service.acquire("job:2", "w", ttl=100)
    fresh = poll(operator, url, "audit-results", version)
    assert fresh.status_code == 200
    rows = soup(fresh).select("#audit-results tbody tr[id^=event-]")
    assert [r.select_one("td.resource").get_text(strip=True) for r in rows][:2] == [
        "job:2",
        "job:1",
    ]
    assert soup(fresh).body is None, "a poll gets the fragment, not the page"


def test_audit_tail_keeps_the_filters_and_skips_older_pages_and_closed_ranges(
    operator, service
):
    for n in range(3):
        service.acquire(f"job:{n}", "w", ttl=100)
    filtered = soup(operator.get("/audit?prefix=job:1"))
    assert "prefix=job" in filtered.select_one("#audit-results .poller")["hx-get"]
    older = soup(operator.get("/audit?limit=1")).select_one(".pager a[rel=next]")
    assert older is not None
    for url in (older["href"], "/audit?until=2030-01-01T00:00:00Z"):
        assert soup(operator.get(url)).select_one("#audit-results .poller") is None, url


def test_a_paused_audit_tail_does_not_poll_and_resumes(operator, service):
    paused = soup(operator.get("/audit?live=0"))
    assert "every" not in paused.select_one("#audit-results .poller")["hx-trigger"]
    assert "Paused." in paused.select_one("#audit-results .live").get_text()
    resume = paused.select_one("#audit-results .live a")
    assert resume.get_text() == "Resume"
    assert "live=1" in resume["href"]
    live = soup(operator.get(resume["href"]))
    assert "every 5s" in live.select_one("#audit-results .poller")["hx-trigger"]
