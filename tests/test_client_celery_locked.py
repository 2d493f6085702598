"""``@locked`` as a decorator, called in the test's own process (no worker): the
name from ``key=``, any argument value, ``owner=``."""

from __future__ import annotations

import pytest
from lockkeeper_client import LockClient
from lockkeeper_client.celery import current_lock, locked


@pytest.fixture
def client(live_server):
    with LockClient(live_server.url, live_server.token) as made:
        yield made


def test_a_name_from_any_argument_value_and_a_named_owner(client):
    @locked("report:{path}", owner="reports-worker", client=client)
    def build(path: str, *, fence: int) -> tuple[str, str]:
        held = current_lock()
        return held.resource, client.get(held.resource).owner

    resource, owner = build("sales/2026 05")  # a slash and a space: was a 400
    assert owner == "reports-worker"
    assert resource.startswith("report:sales-2026-05:")


def test_key_names_the_lock_from_the_arguments(client):
    @locked(key=lambda month, kind, **_: f"{kind}:{month}", client=client)
    def build(month: str, kind: str, *, fence: int) -> str:
        return current_lock().resource

    assert build("2026-05", kind="report") == "report:2026-05"


def test_owner_may_be_computed_from_the_arguments(client):
    @locked("job:{n}", owner=lambda n, **_: f"runner-{n}", client=client)
    def run(n: int, *, fence: int) -> str:
        return client.get(f"job:{n}").owner

    assert run(7) == "runner-7"


def test_name_and_key_are_one_or_the_other():
    with pytest.raises(ValueError, match="name or key"):
        locked()
    with pytest.raises(ValueError, match="name or key"):
        locked("a", key=lambda **_: "b")
