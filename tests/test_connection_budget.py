"""The suite's budget of server connections (``tests/connections.py``): a share
past what is free waits for it, and the budget leaves room to other clients."""

from __future__ import annotations

import threading

import pytest

from tests.connections import (
    ROOM_FOR_OTHER_CLIENTS,
    ConnectionBudget,
    budget_for,
    server_limit,
)
from tests.databases import SERVER_URLS


def test_a_share_past_what_is_free_waits_until_it_is_given_back(tmp_path):
    budget = ConnectionBudget(tmp_path / "slots", 4)
    first_holds, second_has = threading.Event(), threading.Event()
    release_first = threading.Event()

    def first():
        with budget.share(3, "first"):
            first_holds.set()
            release_first.wait(30)

    def second():
        with budget.share(2, "second"):
            second_has.set()

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert first_holds.wait(30)
    threads.append(threading.Thread(target=second))
    threads[1].start()
    # Only one slot is free: the second share waits for the first's.
    assert not second_has.wait(0.5)
    release_first.set()
    assert second_has.wait(30)
    for thread in threads:
        thread.join(30)


def test_a_share_that_cannot_be_had_in_time_names_what_was_free(tmp_path):
    budget = ConnectionBudget(tmp_path / "slots", 3)
    with budget.share(2, "holder"), pytest.raises(TimeoutError, match="1 of 2"):
        with budget.share(2, "late", wait_seconds=0.2):
            pass


def test_a_share_larger_than_the_budget_is_refused_at_once(tmp_path):
    budget = ConnectionBudget(tmp_path / "slots", 3)
    with pytest.raises(RuntimeError, match="asks for 4 connections"):
        with budget.share(4, "greedy"):
            pass


@pytest.mark.backends("postgresql", "mariadb")
def test_the_budget_leaves_room_to_other_clients_of_the_server(backend):
    budget = budget_for(SERVER_URLS[backend])
    assert budget is not None
    assert budget.size == server_limit(SERVER_URLS[backend]) - ROOM_FOR_OTHER_CLIENTS
