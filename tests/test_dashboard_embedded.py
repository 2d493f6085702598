"""A lock taken in the embedded mode is on the dashboard like any other, and
an operator's force-release of it from there reaches the embedded holder and
an embedded watcher of the log."""

from __future__ import annotations

from lockkeeper_client import LockClient
from lockkeeper_core.embedded import EmbeddedTransport

from app.auth.service import create_token
from tests.conftest import _logged_in
from tests.dashboard_helpers import post, soup


def test_an_embedded_holder_is_on_the_dashboard_and_sees_its_force_release(
    app, backend
):
    with app.app_context():
        token = create_token("embedded-workers")
    browser = _logged_in(app, "olga", "operator")
    client = LockClient(
        "http://embedded",
        token,
        transport=EmbeddedTransport(app.config["SQLALCHEMY_DATABASE_URI"]),
    )
    with client:
        held = client.lock("emb:dash", ttl=6, raise_on_lost=False)
        with held:
            overview = soup(browser.get("/")).get_text()
            assert "emb:dash" in overview
            page = soup(browser.get("/locks/emb:dash")).get_text()
            assert held.owner in page
            assert "embedded-workers" in page
            answer = post(
                browser,
                "/locks/emb:dash/release",
                {"reason": "test: embedded holder", "fence": str(held.fence)},
            )
            assert answer.status_code in (200, 303), answer.get_data(as_text=True)
            assert held.lost.wait(10)
        # An embedded watcher reads the operator's release from the same log.
        seen = next(
            iter(client.watch(resource="emb:dash", action="force_released", after=0))
        )
        assert (seen.actor, seen.data["reason"]) == ("olga", "test: embedded holder")
        assert seen.fence == held.fence
    history = soup(browser.get("/locks/emb:dash")).get_text()
    assert "force_released" in history or "force-released" in history
    assert "test: embedded holder" in history
