"""``python -m bench``'s guard section: a guarded and a plain write measured in
the same run, and a take-over that waits for the guarded transaction's commit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.guard_bench import HOLD, bench_guard


@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_the_guard_bench_compares_guarded_with_plain_writes(
    databases, tmp_path, server
):
    url = databases(server).fresh(tmp_path)
    (found,) = bench_guard(
        {server: SimpleNamespace(url=url)}, tmp_path, 1, 0.2, lambda _: None
    )
    assert found.name == f"guarded_write_vs_plain_{server}"
    assert found.value > 0
    assert found.baseline > 0
    # The take-over could not commit before the guarded transaction did.
    assert found.detail["take_over_wait_ms"] >= HOLD * 1000
