"""The Galera harness's own guards, without a cluster: the network namespaces
it builds partitions in are never the machine's, and the faults a run asks
for are ones it knows, a kill first."""

from __future__ import annotations

import argparse

import pytest

from tests.faults.galera_network import in_own_network_namespace
from tests.faults.run import galera_faults

HEADER = (
    "Inter-|   Receive                            |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes\n"
)


def _table(tmp_path, *names: str) -> str:
    path = tmp_path / "dev"
    path.write_text(
        HEADER + "".join(f"  {name}: 0 0 0 0 0 0 0 0 0\n" for name in names)
    )
    return str(path)


def test_a_namespace_with_the_machines_interfaces_is_not_the_harnesss(tmp_path):
    assert not in_own_network_namespace(_table(tmp_path, "lo", "eth0"))
    assert not in_own_network_namespace(_table(tmp_path, "lo", "lkbr", "ifb0"))


def test_a_namespace_with_a_loopback_and_the_harnesss_links_is(tmp_path):
    assert in_own_network_namespace(_table(tmp_path, "lo"))
    assert in_own_network_namespace(_table(tmp_path, "lo", "lkbr", "lkn0b", "lkn1b"))


@pytest.mark.parametrize("raw", ["kill", "kill,pause", "kill,pause,partition,wipe"])
def test_galera_faults_a_run_knows(raw):
    assert galera_faults(raw) == raw


@pytest.mark.parametrize("raw", ["pause,kill", "kill,nap", "", "wipe"])
def test_galera_faults_it_does_not_know_or_without_a_kill_first(raw):
    with pytest.raises(argparse.ArgumentTypeError, match="kill, then any of"):
        galera_faults(raw)
