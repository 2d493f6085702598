"""A member of the failover harness's cluster that cannot start ends the wait at
once with its log, not after minutes. (That the cluster starts wherever the project
is cloned, a folder closed to postgres included, the lagging-standby run of
``test_faults.py`` shows: it runs from such a folder.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.faults.cluster import ClusterError
from tests.faults.patroni import PatroniCluster
from tests.faults.test_faults import require_patroni

TRACEBACK = """\
2026-12-01 10:00:00,000 INFO: bootstrap in progress
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 229, in prepare
    os.chdir(data['dir'])
PermissionError: [Errno 13] Permission denied: '/root/clone'
2026-12-01 10:00:01,000 INFO: bootstrap in progress
"""


@pytest.fixture
def unstarted_cluster():
    """A cluster's folders and configs, none of its processes."""
    require_patroni()
    cluster = PatroniCluster(members=2)
    yield cluster
    cluster.close()


def running_stand_in() -> subprocess.Popen:
    """A live process standing in for a member's Patroni."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        start_new_session=True,
    )


def test_a_member_whose_log_shows_a_traceback_fails_the_bootstrap_wait(
    unstarted_cluster,
):
    member = unstarted_cluster.members[0]
    member.log.write_text(TRACEBACK)
    member.process = running_stand_in()
    try:
        # Outside the bootstrap a traceback may be a member riding out a fault.
        unstarted_cluster.raise_if_broken(tracebacks=False)
        with pytest.raises(ClusterError, match="pg0: patroni failed") as failure:
            unstarted_cluster.raise_if_broken(tracebacks=True)
        assert "Permission denied: '/root/clone'" in str(failure.value)
    finally:
        member.process.kill()
        member.process.wait()


def test_a_member_whose_patroni_exited_fails_every_wait(unstarted_cluster):
    member = unstarted_cluster.members[1]
    member.log.write_text("FATAL: could not read configuration\n")
    member.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    member.process.wait()
    with pytest.raises(ClusterError, match="pg1: patroni exited with 3") as failure:
        unstarted_cluster.raise_if_broken(tracebacks=False)
    assert "could not read configuration" in str(failure.value)


def test_a_member_with_a_broken_configuration_ends_the_start_at_once():
    require_patroni()
    cluster = PatroniCluster(members=2)
    try:
        cluster.members[0].config.write_text("postgresql: [this is not a config\n")
        started = time.monotonic()
        with pytest.raises(ClusterError, match="pg0: patroni"):
            cluster.start(timeout=180.0)
        assert time.monotonic() - started < 60, "waited for the deadline"
    finally:
        cluster.close()


SHARED_MEMORY = (
    "2026-12-07 02:32:55.024 UTC [18723] FATAL:  could not create shared memory"
    " segment: No space left on device\n"
)
PORT_TAKEN = (
    "2026-12-07 02:32:55.024 UTC [18723] LOG:  could not bind IPv4 address"
    ' "127.0.0.1": Address already in use\n'
    "2026-12-07 02:32:55.024 UTC [18723] FATAL:  could not create any TCP/IP"
    " sockets\n"
)


@pytest.mark.parametrize(
    ("server", "retried", "cause"),
    [
        (SHARED_MEMORY, 0, "FATAL:  could not create shared memory segment"),
        # A port taken again after every retry.
        (PORT_TAKEN, 3, "Address already in use"),
    ],
)
def test_a_member_whose_postgresql_did_not_start_shows_its_server_log(
    unstarted_cluster, server, retried, cause
):
    """PostgreSQL's server log is its stderr, in Patroni's log; why it did not
    start comes before Patroni's retries and traceback, which filled the tail
    a failure showed ("postmaster is not running", and no cause)."""
    member = unstarted_cluster.members[0]
    member.ports_taken = list(range(retried))
    chatter = "2026-12-07 02:32:56,647 INFO: bootstrap in progress\n" * 60
    member.log.write_text(
        server + chatter + "2026-12-07 02:32:59,143 ERROR: postmaster is not running\n"
    )
    member.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    member.process.wait()
    with pytest.raises(ClusterError, match="pg0: patroni exited with 1") as failure:
        unstarted_cluster.raise_if_broken(tracebacks=True)
    message = str(failure.value)
    assert cause in message
    assert "postmaster is not running" in message


def test_a_stale_postmaster_pid_names_no_process_to_kill(unstarted_cluster):
    """After a crash ``postmaster.pid`` names a process long gone, whose id
    another process may have now: the cluster's kills must pass it by."""
    member = unstarted_cluster.members[0]
    member.data.mkdir()
    stranger = running_stand_in()
    try:
        (member.data / "postmaster.pid").write_text(f"{stranger.pid}\n")
        assert member.postgres_pids() == []
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.slow
def test_a_member_whose_port_was_taken_before_it_bound_starts_on_another():
    """A port is picked seconds before PostgreSQL binds it (after initdb), and a
    test process outside the suite's workers may take it meanwhile: once, the
    first member's bootstrap failed so ("postmaster is not running", its data
    directory renamed ``data.failed``). The start tries again on new ports, its
    first log kept beside."""
    require_patroni()
    cluster = PatroniCluster(members=1, synchronous=False)
    first = cluster.members[0]
    taken = first.port
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        cluster.start(timeout=120.0)
        assert first.ports_taken == [taken]
        assert first.port != taken
        assert cluster.leader() is first
        assert f"host=127.0.0.1:{first.port}" in cluster.url
        given_up = (first.dir / "patroni.1.log").read_text()
        assert "Address already in use" in given_up
    finally:
        squatter.close()
        cluster.close()
